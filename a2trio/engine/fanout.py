"""Fan-out: one store feed per session per process, shared by every local reader.

Theory of operation. Without this, each reader of a session runs its own
store feed: a pump task, a store read and a payload conversion per reader per
event, and each network lane encodes each event for its own client. A
:class:`SessionFanout` runs one pump per session (in the server's nursery)
that converts each event once and keeps the most recent ``RING`` of them as
:class:`FeedEntry` objects, each caching its encodings: the SSE bytes and the
socket frame are made on first use and shared by every lane after it. Readers
never block the pump and hold no buffer of their own beyond one store page:

* a reader whose next index is in the ring takes the run of entries from
  there up to the newest (indexes are contiguous: positional lookups);
* a reader that starts behind the ring (it resumes from an older index)
  reads the gap from the store in pages, then joins the ring;
* a reader that is caught up waits for the pump's next event.

A reader that falls behind the ring *after* joining it is lagging: it has
``RING`` events to catch up on while the session goes on. The two kinds of
subscriptions differ here. A :meth:`~a2trio.SessionView.stream` reader (in
the process: a presence feed, an app's loop) reads the gap from the store and
rejoins, since nothing else could resume it. A
:meth:`~a2trio.SessionView.subscribe` reader (a network lane: SSE, sockets)
is dropped: :meth:`Subscription.receive_run` raises :class:`Lapped` naming
the last index it had, and the lane ends resumably, so its client reconnects
from there (``Last-Event-ID``, ``startAfter``, a subscribe frame's index).
So the server never buffers more than the shared ring for a slow client,
never reads the store or encodes on its behalf while it is live, and a
stalled client delays no one: the pump and the other readers never wait
for it.

Nothing is lost: every index is either in the ring, in the store, or not yet
written. The pump stops when its last reader leaves (the store's listener is
released before that reader's block exits), and a pump failure is raised to
every reader that needs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeVar, cast

import trio

from ..contract import Event
from ..errors import A2Error, ErrorCode
from ..stores.base import Store, StoredEvent
from ..stores.feed import Feed
from .background import Background

__all__ = [
    "RING",
    "RUN",
    "FeedEntry",
    "Lapped",
    "SessionFanout",
    "SessionFeeds",
    "Subscription",
    "open_store_subscription",
    "open_subscription",
]

T = TypeVar("T")

#: Recent events kept per followed session. Bounds the pump's memory to this
#: many entries per session, and how far a subscriber may lag before it is
#: dropped (:class:`Lapped`).
RING = 512

#: The most entries one :meth:`Subscription.receive_run` returns, so a
#: lane's write stays bounded while it catches up.
RUN = 64


class FeedEntry:
    """One event of a session's feed and its encodings, each made once.

    The same entry is handed to every reader of the session, so a lane that
    calls :meth:`encoded` with the same encoder as another gets the bytes the
    first one made.
    """

    __slots__ = ("_encodings", "event")

    def __init__(self, event: Event[Any]) -> None:
        self.event = event
        self._encodings: dict[Callable[[Event[Any]], Any], Any] = {}

    def encoded(self, encoder: Callable[[Event[Any]], T]) -> T:
        """``encoder(event)``, computed on the first call per encoder."""
        try:
            return cast("T", self._encodings[encoder])
        except KeyError:
            value = self._encodings[encoder] = encoder(self.event)
            return value


class Lapped(A2Error):
    """A subscriber fell more than :data:`RING` events behind its session and
    was dropped. Retryable (``STORE_UNAVAILABLE``): resume after
    :attr:`last_index`, the last index it received."""

    def __init__(self, session_id: str, last_index: int) -> None:
        super().__init__(
            ErrorCode.STORE_UNAVAILABLE,
            f"the subscriber fell {RING} events behind session {session_id!r} and was "
            f"dropped: resume after index {last_index}",
        )
        self.last_index = last_index


class SessionFanout:
    """The shared pump of one session: a ring of recent entries."""

    def __init__(
        self, store: Store, key: str, to_public: Callable[[StoredEvent], Event[Any]]
    ) -> None:
        self.store = store
        self.key = key
        self.to_public = to_public
        # The ring holds indexes first..last_index (empty when first > last_index).
        self.ring: dict[int, FeedEntry] = {}
        self.first = 1
        self.last_index = 0
        self.readers = 0
        self.error: BaseException | None = None
        self.done = False
        # The tasks of the waiting readers, parked on their own (no Event per
        # wait; one can be woken alone: see Subscription.interrupt), in
        # arrival order.
        self.waiting: dict[trio.lowlevel.Task, None] = {}
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    def _wake_all(self) -> None:
        waiting, self.waiting = self.waiting, {}
        for task in waiting:
            trio.lowlevel.reschedule(task)

    async def pump(self, start_after: int, *, task_status: trio.TaskStatus[None]) -> None:
        """Follow the store's feed after ``start_after`` into the ring until
        stopped; started once the store's feed is open. A failure before then
        is raised to the reader starting the pump; after, it is kept for
        every reader (:attr:`error`)."""
        self.first = start_after + 1
        self.last_index = start_after
        ring = self.ring
        started = False
        try:
            with self._scope:
                async with self.store.stream(self.key, start_after=start_after) as rows:
                    task_status.started()
                    started = True
                    async for row in rows:
                        ring[row.index] = FeedEntry(self.to_public(row))
                        self.last_index = row.index
                        if len(ring) > RING:
                            del ring[self.first]
                            self.first += 1
                        self._wake_all()
        except Exception as exc:
            if not started:
                raise  # to the reader that is starting the pump, as itself
            self.error = exc
        finally:
            self.done = True
            self._wake_all()
            self._stopped.set()

    async def stop(self) -> None:
        """Cancel the pump and wait until it has released the store's feed."""
        self._scope.cancel(reason="no readers left")
        with trio.CancelScope(shield=True):
            await self._stopped.wait()


class Subscription(Feed[Event[Any]], ABC):
    """One reader of a session's live feed, by runs of shared :class:`FeedEntry`.

    ``async for event in subscription`` (or :meth:`receive`) yields typed
    events one at a time; :meth:`receive_run` yields the entries themselves,
    as many as are ready, for a lane that writes them in one go.

    Cancellation: both are checkpoints; cancelling one loses nothing (the
    next call returns the same next entries).
    """

    def __init__(self) -> None:
        self._pending: list[FeedEntry] = []

    @abstractmethod
    def interrupt(self) -> None:
        """Make the next (or the waiting) :meth:`receive_run` return no entries
        if none are ready: how a lane's heartbeat gets its turn to write
        without a timer around every wait."""

    @abstractmethod
    async def receive_run(self) -> list[FeedEntry]:
        """The next entries in index order: at least one and at most :data:`RUN`;
        none only after :meth:`interrupt`.

        Raises:
          Lapped: a subscriber of :meth:`~a2trio.SessionView.subscribe` fell
            more than :data:`RING` events behind.
          StopAsyncIteration: the feed ended (the server closed).
          A2Error: ``STORE_UNAVAILABLE`` when the store failed.
        """

    async def receive(self) -> Event[Any]:
        """The next event, one at a time (runs of :meth:`receive_run` unpacked)."""
        while not self._pending:
            self._pending = (await self.receive_run())[::-1]
        return self._pending.pop().event


class _Shared(Subscription):
    """A reader of a :class:`SessionFanout`."""

    def __init__(self, hub: SessionFanout, session_id: str, start_after: int, drop: bool) -> None:
        super().__init__()
        self._hub = hub
        self._session_id = session_id
        self._cursor = start_after
        self._drop = drop
        self._joined = False
        self._page: list[FeedEntry] = []
        self._interrupted = False
        self._parked: trio.lowlevel.Task | None = None

    def interrupt(self) -> None:
        self._interrupted = True
        task, waiting = self._parked, self._hub.waiting
        # Not in the list once the pump has woken it: it is woken once.
        if task is not None and task in waiting:
            del waiting[task]
            trio.lowlevel.reschedule(task)

    async def receive_run(self) -> list[FeedEntry]:
        hub = self._hub
        while True:
            if self._page:
                self._interrupted = False
                run, self._page = self._page[:RUN], self._page[RUN:]
                self._cursor = run[-1].event.index
                return run
            wanted = self._cursor + 1
            if hub.first <= wanted <= hub.last_index:
                through = min(hub.last_index, wanted + RUN - 1)
                ring = hub.ring
                run = [ring[index] for index in range(wanted, through + 1)]
                self._cursor = through
                self._joined = True
                self._interrupted = False
                return run
            if wanted < hub.first:
                if self._drop and self._joined:
                    raise Lapped(self._session_id, self._cursor)
                # Behind the ring: the gap up to what the pump holds is durable.
                rows = await hub.store.read(
                    hub.key, after_index=self._cursor, through_index=hub.first - 1
                )
                self._page = [FeedEntry(hub.to_public(row)) for row in rows]
                if rows:
                    continue
            if hub.done:
                if hub.error is not None:
                    raise hub.error
                raise StopAsyncIteration
            if self._interrupted:
                self._interrupted = False
                return []
            await self._wait()

    async def _wait(self) -> None:
        task = self._parked = trio.lowlevel.current_task()
        self._hub.waiting[task] = None
        try:
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        finally:
            self._parked = None

    def _abort(self, _: Callable[[], NoReturn]) -> trio.lowlevel.Abort:
        # Cancelled while parked: it leaves the list (whichever the pump holds
        # now; a woken task is no longer parked, so this is not called).
        assert self._parked is not None
        self._hub.waiting.pop(self._parked, None)
        return trio.lowlevel.Abort.SUCCEEDED


class _Unshared(Subscription):
    """A store feed of its own (the server is not open: there is no pump)."""

    def __init__(self, rows: Feed[StoredEvent], to_public: Callable[[StoredEvent], Event[Any]]):
        super().__init__()
        self._rows = rows
        self._to_public = to_public
        self._interrupted = False
        self._waiting: trio.CancelScope | None = None

    def interrupt(self) -> None:
        self._interrupted = True
        if self._waiting is not None:
            self._waiting.cancel(reason="interrupted")

    async def receive_run(self) -> list[FeedEntry]:
        if not self._interrupted:
            with trio.CancelScope() as scope:
                self._waiting = scope
                try:
                    row = await self._rows.receive()
                finally:
                    self._waiting = None
                self._interrupted = False
                return [FeedEntry(self._to_public(row))]
        self._interrupted = False
        return []


@asynccontextmanager
async def open_subscription(
    hubs: dict[str, SessionFanout],
    nursery: trio.Nursery,
    store: Store,
    key: str,
    session_id: str,
    to_public: Callable[[StoredEvent], Event[Any]],
    start_after: int,
    *,
    drop: bool,
) -> AsyncIterator[Subscription]:
    """Join (or start) the session's shared pump in ``nursery``; leave on exit.
    With ``drop`` a reader that falls behind the ring raises :class:`Lapped`."""
    hub = hubs.get(key)
    if hub is None or hub.done:
        hub = SessionFanout(store, key, to_public)
        hubs[key] = hub
        await nursery.start(hub.pump, start_after)
    hub.readers += 1
    try:
        yield _Shared(hub, session_id, start_after, drop)
    finally:
        hub.readers -= 1
        if hub.readers == 0:
            if hubs.get(key) is hub:
                del hubs[key]
            await hub.stop()


@asynccontextmanager
async def open_store_subscription(
    store: Store, key: str, to_public: Callable[[StoredEvent], Event[Any]], start_after: int
) -> AsyncIterator[Subscription]:
    """A subscription over a store feed of its own, for a server that is not open."""
    async with store.stream(key, start_after=start_after) as rows:
        yield _Unshared(rows, to_public)


class SessionFeeds:
    """The live feeds of one server's sessions, shared per session while the
    server is open (what ``session.stream()``, ``session.subscribe()`` and the
    presence feed read).

    Args:
      store: where the events are.
      background: the server's nursery, where the shared pumps run.
      key: a session id's store key.
      to_public: a stored row as a typed event.
    """

    def __init__(
        self,
        store: Store,
        background: Background,
        key: Callable[[str], str],
        to_public: Callable[[StoredEvent], Event[Any]],
    ) -> None:
        self.store = store
        self.background = background
        self.key = key
        self.to_public = to_public
        self._hubs: dict[str, SessionFanout] = {}

    def readers(self) -> int:
        """Readers of the shared feeds now (a metrics gauge: read at scrape)."""
        return sum(hub.readers for hub in self._hubs.values())

    @asynccontextmanager
    async def open(
        self, session_id: str, start_after: int, *, drop: bool = False
    ) -> AsyncIterator[Subscription]:
        """A session's typed events after ``start_after``, then live: the
        process's shared feed of the session while the server is open (with
        ``drop`` a reader that lags past its ring is dropped), the store's own
        feed otherwise."""
        key = self.key(session_id)
        nursery = self.background.nursery
        if nursery is not None:
            async with open_subscription(
                self._hubs,
                nursery,
                self.store,
                key,
                session_id,
                self.to_public,
                start_after,
                drop=drop,
            ) as shared:
                yield shared
            return
        async with open_store_subscription(self.store, key, self.to_public, start_after) as own:
            yield own
