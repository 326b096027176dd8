"""Fan-out: one store feed per session per process, shared by every local reader.

Theory of operation. Without this, each ``session.stream()`` runs its own
store feed: a pump task, a store read and a payload conversion per reader per
event, so a session followed by 1,000 SSE clients reads and converts each event
1,000 times. A :class:`SessionFanout` runs one pump per session (in the
server's nursery) that converts each event once and keeps the most recent
``RING`` of them. Readers never block the pump and hold no buffer of their
own beyond one store page:

* a reader whose next index is in the ring takes it from there (indexes are
  contiguous, so that is a positional lookup);
* a reader behind the ring (it started earlier than the pump, or fell more than
  ``RING`` events behind) reads the gap from the store itself, then rejoins;
* a reader that is caught up waits for the pump's next event.

So a slow reader costs its own store reads, never the others' memory, and
nothing is lost: every index is either in the ring, in the store, or not yet
written. The pump stops when its last reader leaves (the store's listener is
released before that reader's block exits), and a pump failure is raised to
every reader that needs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from .contract import Event
from .errors import store_unavailable
from .stores._feed import Feed
from .stores.base import Store, StoredEvent

__all__ = ["RING", "FanoutFeed", "SessionFanout", "open_shared_feed"]

#: Recent events kept per followed session. Bounds the pump's memory to this
#: many typed events per session; a reader further behind reads the store.
RING = 512


class SessionFanout:
    """The shared pump of one session: a ring of recent typed events."""

    def __init__(
        self, store: Store, key: str, to_public: Callable[[StoredEvent], Event[Any]]
    ) -> None:
        self.store = store
        self.key = key
        self.to_public = to_public
        self.recent: deque[Event[Any]] = deque(maxlen=RING)
        self.last_index = 0
        self.readers = 0
        self.error: BaseException | None = None
        self.done = False
        self._changed = trio.Event()
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    def changed(self) -> trio.Event:
        """Set when the next event (or the end) arrives."""
        return self._changed

    async def pump(self, start_after: int, *, task_status: trio.TaskStatus[None]) -> None:
        self.last_index = start_after
        started = False
        try:
            with self._scope:
                async with self.store.stream(self.key, start_after=start_after) as rows:
                    task_status.started()
                    started = True
                    async for row in rows:
                        self.recent.append(self.to_public(row))
                        self.last_index = row.index
                        self._changed.set()
                        self._changed = trio.Event()
        except Exception as exc:
            if not started:
                raise  # to the reader that is starting the pump, as itself
            self.error = exc
        finally:
            self.done = True
            self._changed.set()
            self._stopped.set()

    async def stop(self) -> None:
        """Cancel the pump and wait until it has released the store's feed."""
        self._scope.cancel(reason="no readers left")
        with trio.CancelScope(shield=True):
            await self._stopped.wait()


class FanoutFeed(Feed[Event[Any]]):
    """One reader's view of a :class:`SessionFanout`."""

    def __init__(self, hub: SessionFanout, start_after: int) -> None:
        self._hub = hub
        self._cursor = start_after
        self._page: deque[Event[Any]] = deque()

    async def receive(self) -> Event[Any]:
        hub = self._hub
        while True:
            if self._page:
                event = self._page.popleft()
                self._cursor = event.index
                return event
            wanted = self._cursor + 1
            recent = hub.recent
            if recent and recent[0].index <= wanted <= recent[-1].index:
                event = recent[wanted - recent[0].index]
                self._cursor = wanted
                return event
            # Behind the ring: the gap up to what the pump has passed is durable.
            through = recent[0].index - 1 if recent else hub.last_index
            if wanted <= through:
                with store_unavailable("read"):
                    rows = await hub.store.read(
                        hub.key, after_index=self._cursor, through_index=through
                    )
                self._page.extend(hub.to_public(row) for row in rows)
                if rows:
                    continue
            if hub.done:
                if hub.error is not None:
                    raise hub.error
                raise StopAsyncIteration
            await hub.changed().wait()


@asynccontextmanager
async def open_shared_feed(
    hubs: dict[str, SessionFanout],
    nursery: trio.Nursery,
    store: Store,
    key: str,
    to_public: Callable[[StoredEvent], Event[Any]],
    start_after: int,
) -> AsyncIterator[FanoutFeed]:
    """Join (or start) the session's shared pump in ``nursery``; leave on exit."""
    hub = hubs.get(key)
    if hub is None or hub.done:
        hub = SessionFanout(store, key, to_public)
        hubs[key] = hub
        await nursery.start(hub.pump, start_after)
    hub.readers += 1
    try:
        yield FanoutFeed(hub, start_after)
    finally:
        hub.readers -= 1
        if hub.readers == 0:
            if hubs.get(key) is hub:
                del hubs[key]
            await hub.stop()
