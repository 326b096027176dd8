"""State reads: a session's snapshot and tail, batched across sessions.

``session.state(reducer)`` folds from a cached snapshot and the events after
it. While the server is open, reads asked for in the same scheduler round
coalesce into one ``store.read_states`` (the seed's batching): three
sessions' ``state()`` at once are one round trip. The batch's read is a
background task (:class:`~a2trio.engine.background.Background`).
"""

from __future__ import annotations

import copy

import trio

from ..errors import A2Error, ErrorCode
from ..stores.base import StateRead, Store
from .background import Background

__all__ = ["StateReads"]


class StateReads:
    """The state reads of one server, batched per reducer.

    Args:
      store: where the snapshots and events are.
      background: where a batch's read runs while the server is open.
    """

    def __init__(self, store: Store, background: Background) -> None:
        self.store = store
        self.background = background
        self._batches: dict[str, _StateBatch] = {}

    async def read(self, key: str, reducer: str) -> StateRead:
        """The snapshot and tail of ``key`` for ``reducer``. While the server is
        open, calls made in the same scheduler round coalesce into one
        ``store.read_states``. Each caller gets a read of its own (a second
        caller of one key a deep copy), so a fold may mutate its state.

        Raises:
          Exception: the store's failure (the caller falls back to the log).

        Cancellation: a cancelled caller stops waiting; the batch's read runs
        on for the others, in the server's nursery.
        """
        if not self.background.is_open:
            return await self.store.read_state(key, reducer)
        batch = self._batches.get(reducer)
        if batch is None:
            batch = self._batches[reducer] = _StateBatch()
            # Runs after this scheduler round: every caller meanwhile joins.
            self.background.spawn(self._read_states, reducer, batch)
        batch.keys[key] = batch.keys.get(key, 0) + 1
        await batch.done.wait()
        if batch.reads is None:
            if batch.error is not None:
                # The store's error as it raised it, to every caller of the
                # batch (as a shared feed's error goes to every reader).
                raise batch.error
            # The read was cancelled: the server closed under it.
            raise A2Error(ErrorCode.STORE_UNAVAILABLE, "read state failed")
        return batch.reads[key].pop()

    async def _read_states(self, reducer: str, batch: _StateBatch) -> None:
        if self._batches.get(reducer) is batch:
            del self._batches[reducer]  # later callers start the next batch
        keys = list(batch.keys)
        try:
            reads = await self.store.read_states(keys, reducer)
            # One read per caller, copied before any of them folds: a fold may
            # mutate its state in place, and callers of one key would
            # otherwise fold into one shared snapshot (issue 29).
            batch.reads = {
                key: [read, *(copy.deepcopy(read) for _ in range(batch.keys[key] - 1))]
                for key, read in zip(keys, reads, strict=True)
            }
        except Exception as exc:
            batch.error = exc
        finally:
            batch.done.set()


class _StateBatch:
    """``read`` calls waiting for one ``read_states``."""

    __slots__ = ("done", "error", "keys", "reads")

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}  # key -> callers waiting on it
        self.done = trio.Event()
        self.reads: dict[str, list[StateRead]] | None = None  # a read per caller
        self.error: BaseException | None = None
