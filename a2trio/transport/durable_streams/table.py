"""Streams: each path's state, cached in the process, and its conditional commits.

Theory of operation. A stream's state is the fold of its session
(:mod:`.model`). This process keeps the folded state of the paths it has
served (at most :data:`CACHED_STREAMS`, least recently used first out), each
with the index it was folded through, and brings it up to date before it
decides anything by reading the events after that index, usually none: one
short read. The first time a path is seen its state comes from the
reducer's snapshot and the events after it (``session.state``).

A write decides on that state and commits its events *conditionally*
(``expected_index``: the index it decided on), so a decision is never
applied to a state it did not see: when another process appended first, the
store refuses (``INDEX_CONFLICT``), the state is brought up to date, and the
decision is taken again. In this process writes to one path take turns (a
:class:`trio.Lock` per path), so they never conflict with each other. An
idempotent producer's append has event ids derived from the path, the
generation, the producer id, epoch and sequence: a retry that reaches the
store after its twin committed replays instead of appending twice.

Cancellation: a cancelled write committed all of its events or none; the
cached state only moves once the store has answered.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import msgspec
import trio

from ... import A2Error, ErrorCode, Event, Server
from ...stores.base import AppendEvent, StoredEvent
from .model import CONTRACT, REDUCER, Producer, StreamState, fold

__all__ = [
    "CACHED_STREAMS",
    "COMMIT_ATTEMPTS",
    "SNAPSHOT_EVERY",
    "Answer",
    "Decision",
    "Streams",
    "producer_event_id",
]

#: Paths whose folded state one process keeps. A state is a few hundred
#: bytes plus its producers: 10,000 streams are a few megabytes.
CACHED_STREAMS: Final = 10_000
#: Events committed past a stream's last snapshot before this process
#: writes a fresh one (one more write per this many appends), so a restart
#: folds at most about this many events of a stream (``session.state``).
SNAPSHOT_EVERY: Final = 1_000
#: Decisions per write before a write that keeps losing its conditional
#: commit to other processes answers 503 (retryable; nothing was written).
COMMIT_ATTEMPTS: Final = 8


class Answer(NamedTuple):
    """An HTTP answer a decision gives: status, headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes = b""


class Decision(NamedTuple):
    """What a write decided on a state: the events to commit (none: answer
    at once) and how to answer once they are committed (given the state
    with them folded in)."""

    events: Sequence[tuple[str, Any, str | None]]
    answer: Callable[[StreamState], Answer]


def producer_event_id(path: str, start: int, producer: Producer) -> str:
    """The id of a producer's append: the same for every retry of it, unique
    in the store (paths and producer ids are hashed, so any length fits)."""
    digest = hashlib.sha256(
        f"{path}\x1f{start}\x1f{producer.id}\x1f{producer.epoch}\x1f{producer.seq}".encode()
    ).hexdigest()
    return f"ds-{digest[:40]}"


def to_event(row: StoredEvent, path: str) -> Event[Any]:
    """A stored row of a stream's session as a typed event."""
    return Event(
        id=row.id,
        type=row.type,
        payload=CONTRACT.decode(row.type, row.payload),
        index=row.index,
        session_id=path,
        created_at=datetime.fromtimestamp(row.created_at_ms / 1000, UTC),
    )


class _Turn:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.users = 0


class Streams:
    """Every stream of one server (over the built-in contract), as this
    process knows them. The server must be open while it is used."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._states: OrderedDict[str, StreamState] = OrderedDict()
        self._turns: dict[str, _Turn] = {}
        #: The index of each cached path's latest snapshot, as far as known.
        self._snapshots: dict[str, int] = {}

    @property
    def now_ms(self) -> int:
        return self.server.clock.now_ms()

    def cached(self, path: str) -> StreamState | None:
        """The state last folded for ``path`` (no I/O), if any."""
        return self._states.get(path)

    def _keep(self, path: str, state: StreamState) -> StreamState:
        self._states[path] = state
        self._states.move_to_end(path)
        while len(self._states) > CACHED_STREAMS:
            evicted, _ = self._states.popitem(last=False)
            self._snapshots.pop(evicted, None)
        return state

    def advance(self, path: str, events: Sequence[Event[Any]]) -> StreamState | None:
        """Fold events read elsewhere (a live feed) into the cached state
        when they follow it; a gap drops the cache (the next read refolds)."""
        state = self._states.get(path)
        if state is None:
            return None
        for event in events:
            if event.index <= state.index:
                continue
            if event.index != state.index + 1:
                self._states.pop(path, None)
                return None
            state = fold(state, event)
        return self._keep(path, state)

    async def state(self, path: str) -> StreamState:
        """``path``'s state, brought up to date with its log.

        Raises:
          ValueError: ``path`` is not a valid session id.
          A2Error: ``STORE_UNAVAILABLE``.
        """
        session = self.server.session(path)
        cached = self._states.get(path)
        if cached is None:
            loaded, index = await session.state(REDUCER)
            loaded.index = index
            # state() wrote a snapshot at `index` if it folded anything.
            self._snapshots[path] = index
            current = self._states.get(path)
            if current is not None and current.index >= index:
                return current
            return self._keep(path, loaded)
        state = cached
        while True:
            events = await session.history(gte=state.index + 1)
            if not events:
                return self._keep(path, state)
            state = self.advance(path, events) or await self._reload(path)
            if len(events) < 1_000:
                return state

    async def _reload(self, path: str) -> StreamState:
        self._states.pop(path, None)
        return await self.state(path)

    @asynccontextmanager
    async def turn(self, path: str) -> AsyncIterator[None]:
        """Writes to ``path`` in this process, one at a time."""
        turn = self._turns.get(path)
        if turn is None:
            turn = self._turns[path] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[path]

    async def commit(
        self, path: str, state: StreamState, events: Sequence[tuple[str, Any, str | None]]
    ) -> tuple[StreamState, bool]:
        """Append ``events`` (type, payload, id) if the log is still at
        ``state.index``; return the state with them folded in, and whether
        the store replayed them (every id was already stored).

        Raises:
          A2Error: ``INDEX_CONFLICT`` (the log moved: decide again),
            ``INVALID_PAYLOAD`` (a payload the contract refuses),
            ``STORE_UNAVAILABLE``.
        """
        # The cached state is folded in place by every reader that catches up,
        # our own rows included, while the store answers: keep the index.
        expected = state.index
        rows = []
        for kind, payload, event_id in events:
            _, builtins = CONTRACT.validate(kind, payload)
            rows.append(AppendEvent(kind, builtins, event_id, settled=True))
        server = self.server
        result = await server.store.append(server.key(path), rows, expected_index=expected)
        stored = [to_event(row, path) for row in result.events]
        if stored and stored[0].index <= expected:
            return await self._reload(path), True
        folded = self.advance(path, stored) or await self._reload(path)
        if folded.index - self._snapshots.get(path, 0) >= SNAPSHOT_EVERY:
            await self._snapshot(path, folded)
        return folded, False

    async def _snapshot(self, path: str, state: StreamState) -> None:
        self._snapshots[path] = state.index
        try:
            await self.server.store.put_snapshot(
                self.server.key(path), REDUCER.name, state.index, msgspec.to_builtins(state)
            )
        except A2Error:
            pass  # a disposable cache: the next load folds from an older one

    async def write(self, path: str, decide: Callable[[StreamState], Decision]) -> Answer:
        """Decide on ``path``'s state and commit, again on a fresh state
        while other processes win the commit.

        The first decision is taken on the cached state without a read: a
        commit is conditional, so a stale state only costs a retry. A
        decision that commits nothing (a refusal, a duplicate) and a
        producer's append are only acted on once taken on a state read fresh
        from the log.

        Raises:
          A2Error: ``STORE_UNAVAILABLE`` (also after :data:`COMMIT_ATTEMPTS`
            lost commits: nothing was written); ``INVALID_PAYLOAD``.

        Cancellation: a checkpoint; cancelled, the events were committed
        entirely or not at all, and the cache follows the store.
        """
        async with self.turn(path):
            cached = self._states.get(path)
            fresh = cached is None
            state = cached if cached is not None else await self.state(path)
            for _ in range(COMMIT_ATTEMPTS):
                decision = decide(state)
                if not fresh and (
                    not decision.events or any(event_id for *_, event_id in decision.events)
                ):
                    # An answer without a commit, or a producer's append (whose
                    # twin's commit would replay and look like ours): decide
                    # on the log itself.
                    state, fresh = await self.state(path), True
                    continue
                if not decision.events:
                    return decision.answer(state)
                try:
                    state, replayed = await self.commit(path, state, decision.events)
                except A2Error as exc:
                    if exc.code is not ErrorCode.INDEX_CONFLICT:
                        raise
                    state, fresh = await self.state(path), True
                    continue
                if replayed:
                    # A twin (a retry, in another process) committed these
                    # ids first: answer as the fresh state says (a duplicate).
                    fresh = True
                    continue
                return decision.answer(state)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE,
            f"the stream {path[:80]!r} is written by other processes faster than "
            "this write can commit; nothing was written: retry",
        )

    async def append_now(self, path: str, kind: str, payload: Any) -> None:
        """Append one bookkeeping event unconditionally (``touched``,
        ``forked``, ``unforked``): it decides nothing, so it needs no turn."""
        server = self.server
        _, builtins = CONTRACT.validate(kind, payload)
        result = await server.store.append(
            server.key(path), [AppendEvent(kind, builtins, None, settled=True)]
        )
        self.advance(path, [to_event(row, path) for row in result.events])
