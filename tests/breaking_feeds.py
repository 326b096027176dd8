"""A memory store whose live feeds break on cue: a test double for a store
whose feed connection drops (or whose feed ends) mid-stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio

import a2trio
from a2trio.stores.base import Feed, StoredEvent
from a2trio.stores.memory import MemoryStore

__all__ = ["BreakingFeeds"]


class BreakingFeeds(MemoryStore):
    """A memory store whose live feeds break on reaching an event of type
    ``breaks_on``: they raise ``error`` (or end cleanly if it is None), at most
    ``times`` times in all. Everything else is the memory store's.

    Attributes:
      broke_at: the Trio instants at which a feed broke.
    """

    def __init__(self, *, breaks_on: str, error: Exception | None, times: int = 1) -> None:
        super().__init__(clock=a2trio.TrioClock())
        self.breaks_on = breaks_on
        self.error = error
        self.breaks_left = times
        self.broke_at: list[float] = []

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        return self._breaking_stream(session_id, start_after)

    @asynccontextmanager
    async def _breaking_stream(
        self, session_id: str, start_after: int
    ) -> AsyncIterator[Feed[StoredEvent]]:
        async with super().stream(session_id, start_after=start_after) as feed:
            yield _BreakingFeed(feed, self)


class _BreakingFeed(Feed[StoredEvent]):
    def __init__(self, inner: Feed[StoredEvent], store: BreakingFeeds) -> None:
        self._inner = inner
        self._store = store

    async def receive(self) -> StoredEvent:
        event = await self._inner.receive()
        store = self._store
        if event.type == store.breaks_on and store.breaks_left > 0:
            store.breaks_left -= 1
            store.broke_at.append(trio.current_time())
            if store.error is None:
                raise StopAsyncIteration
            raise store.error
        return event
