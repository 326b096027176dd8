"""The subscriptions session, cached in the process, and its conditional commits.

The same discipline as the streams' (:mod:`.table`): the folded state is
cached with the index it was folded through and brought up to date (one
short read) before anything is decided; a decision commits its events only
if the log is still at that index (``expected_index``), and is taken again
on the fresh state when another process committed first. In this process
writes take turns (one :class:`trio.Lock`).

Cancellation: a cancelled write committed all of its events or none; the
cached state only moves once the store has answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import msgspec
import trio

from ... import A2Error, ErrorCode, Event, Server
from ...stores.base import AppendEvent
from .subscription_model import CONTRACT, REDUCER, SESSION, Registry, fold

__all__ = ["COMMIT_ATTEMPTS", "Plan", "SubscriptionLog"]

T = TypeVar("T")

#: Decisions per write before one that keeps losing to other processes
#: gives up (503, retryable: nothing was written).
COMMIT_ATTEMPTS: Final = 8
#: Events past the last snapshot before this process writes a fresh one.
SNAPSHOT_EVERY: Final = 1_000
_PAGE: Final = 1_000

#: What a decision commits: (event type, payload) pairs, and what the write
#: returns, computed on the state with them folded in.
Plan = tuple[Sequence[tuple[str, Any]], Callable[[Registry], T]]


class SubscriptionLog:
    """The store's subscriptions session (:data:`~.subscription_model.SESSION`)."""

    def __init__(self, server: Server) -> None:
        if server.contract is not CONTRACT:
            raise TypeError("the subscriptions server must implement subscription_model.CONTRACT")
        self.server = server
        self._state: Registry | None = None
        self._snapshot = 0
        self._turn = trio.Lock()

    @property
    def cached(self) -> Registry | None:
        """The state last folded (no I/O), if any."""
        return self._state

    def _load(self, loaded: Registry) -> None:
        # Another task may have loaded (and folded further) meanwhile.
        if self._state is None or self._state.index < loaded.index:
            self._state = loaded

    def _advance(self, events: Sequence[Event[Any]]) -> bool:
        state = self._state
        assert state is not None
        for event in events:
            if event.index <= state.index:
                continue
            if event.index != state.index + 1:
                self._state = None
                return False
            state = fold(state, event)
        self._state = state
        return True

    async def state(self) -> Registry:
        """Every subscription, up to date with the log.

        Raises:
          A2Error: ``STORE_UNAVAILABLE``.
        """
        session = self.server.session(SESSION)
        while True:
            if self._state is None:
                loaded, index = await session.state(REDUCER)
                loaded.index = index
                self._snapshot = index
                self._load(loaded)
            state = self._state
            assert state is not None
            events = await session.history(gte=state.index + 1, lte=state.index + _PAGE)
            if self._advance(events) and len(events) < _PAGE:
                assert self._state is not None
                return self._state

    async def _commit(self, state: Registry, events: Sequence[tuple[str, Any]]) -> Registry:
        expected = state.index
        rows = []
        for kind, payload in events:
            _, builtins = CONTRACT.validate(kind, payload)
            rows.append(AppendEvent(kind, builtins, None, settled=True))
        server = self.server
        result = await server.store.append(server.key(SESSION), rows, expected_index=expected)
        stored = [
            Event(
                id=row.id,
                type=row.type,
                payload=CONTRACT.decode(row.type, row.payload),
                index=row.index,
                session_id=SESSION,
                created_at=datetime.fromtimestamp(row.created_at_ms / 1000, UTC),
            )
            for row in result.events
        ]
        if not self._advance(stored):
            return await self.state()
        folded = self._state
        assert folded is not None
        if folded.index - self._snapshot >= SNAPSHOT_EVERY:
            self._snapshot = folded.index
            try:
                await server.store.put_snapshot(
                    server.key(SESSION), REDUCER.name, folded.index, msgspec.to_builtins(folded)
                )
            except A2Error:
                pass  # a disposable cache: the next load folds from an older one
        return folded

    async def write(self, decide: Callable[[Registry], Plan[T]]) -> T:
        """Decide on the fresh state and commit, again on a fresher one while
        other processes win the commit. ``decide`` may raise to refuse (nothing
        is written).

        Raises:
          A2Error: ``STORE_UNAVAILABLE`` (also after :data:`COMMIT_ATTEMPTS`
            lost commits: nothing was written).
        """
        async with self._turn:
            state = await self.state()
            for _ in range(COMMIT_ATTEMPTS):
                events, answer = decide(state)
                if not events:
                    return answer(state)
                try:
                    state = await self._commit(state, events)
                except A2Error as exc:
                    if exc.code is not ErrorCode.INDEX_CONFLICT:
                        raise
                    state = await self.state()
                    continue
                return answer(state)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE,
            "the subscriptions are written by other processes faster than this write "
            "can commit; nothing was written: retry",
        )
