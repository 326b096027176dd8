"""One Postgres store's side of the shared LISTEN connection.

With ``listen=True`` the schema gets transactional notify triggers
(``a2_events`` per inserted session, ``a2_presence`` per changed field).
``async with store:`` opens the store's nursery; while the store has a feed,
a presence subscriber or a pending watcher (each counted by
:meth:`StoreListener.subscribe`), a task there subscribes the store's
channels to the shared listener, **one** connection serving every store and
viewer of the process (connections scale with processes, not viewers). The
listener's own task is a Trio system task: it must outlive whichever store
opened it, so no store's nursery can own it (see ``shared``); it closes when
its last subscriber leaves and reopens on demand.

A notification only says *when* to read: an event notification wakes the
session's local feeds and the pending watchers (the drain's cross-process
wake-up); a presence notification goes to the store's presence plane. Both
carry the writing store's id, so a store skips its own echoes (its writes
reached its local feeds and subscribers as they committed). A lost listener
wakes every feed (catch-up from each cursor), which polls until the listener
is back (:meth:`StoreListener.feed_poll`).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

from ...backoff import STORE_RECONNECT
from ...timings import Timings
from ..feed import Wakeups, adaptive_poll
from ..tasks import StoreTasks
from .conn import errors
from .database import Database
from .shared import SharedListener, listener

__all__ = ["ListenerStatistics", "StoreListener"]


class ListenerStatistics(msgspec.Struct, frozen=True):
    """What the store's LISTEN connection heard on the events channel, over
    every connection it held: ``notifications`` in all, ``own`` of them this
    store's own writes (skipped: their rows were handed to local feeds).

    Notifications arrive in commit order, so once one is heard every earlier
    commit's has been counted (tests use a later write as the sentinel)."""

    notifications: int
    own: int


class _Hearing:
    """One subscription of a store to its shared listener (a fresh one per
    join, so a late unsubscribe never drops a newer one)."""

    def __init__(self, listener: StoreListener, channels: tuple[str, str]) -> None:
        self._listener = listener
        self.channels: tuple[str, ...] = channels

    def heard(self, channel: str, payload: str) -> None:
        self._listener._heard(channel, payload)

    def listening(self, on: bool) -> None:
        self._listener._listening_changed(on)


class StoreListener:
    """A store's subscription to the shared listener (see the module docstring).

    The store hands it its ``db`` (the schema's channels, where the listener
    connects), its task nursery (``tasks``), its feeds' ``wakeups``, whether
    it listens at all (``enabled``) and ``on_presence`` (a presence
    notification's payload).
    """

    def __init__(
        self,
        db: Database,
        tasks: StoreTasks,
        wakeups: Wakeups,
        *,
        enabled: bool,
        on_presence: Callable[[str], None],
    ) -> None:
        self._db = db
        self._tasks = tasks
        self._wakeups = wakeups
        self._enabled = enabled
        self._on_presence = on_presence
        self._pending_watchers: set[Callable[[str], None]] = set()
        self._subscribers = 0
        self._join: trio.CancelScope | None = None
        self._shared: SharedListener | None = None
        self._listening = trio.Event()
        self._notifications = 0
        self._own_notifications = 0

    @property
    def listening(self) -> bool:
        """Whether the listener is subscribed: feeds follow notifications."""
        return self._listening.is_set()

    async def wait_listening(self) -> None:
        """Subscribe until the listener is subscribed (see the store's
        ``wait_listening``).

        Cancellation: a plain wait; the subscription is dropped.
        """
        release = self.subscribe()
        try:
            await self._listening.wait()
        finally:
            release()

    def statistics(self) -> ListenerStatistics:
        """The event notifications the listener heard (tests, debugging)."""
        return ListenerStatistics(self._notifications, self._own_notifications)

    def subscribe(self) -> Callable[[], None]:
        """Count a local subscriber (a feed, a presence subscriber, a pending
        watcher); the first one joins the shared listener, the last one out
        leaves it. Returns the (idempotent) release."""
        self._subscribers += 1
        self.join()
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._subscribers -= 1
            if self._subscribers == 0 and self._join is not None:
                self._join.cancel()
                self._join = None

        return release

    def join(self) -> None:
        """Start the subscription task if the store listens, has a local
        subscriber and is entered (its nursery is open), and none runs."""
        nursery = self._tasks.nursery
        if self._enabled and self._subscribers and self._join is None and nursery is not None:
            self._join = trio.CancelScope()
            nursery.start_soon(self._hear, self._join)

    def leaving(self) -> None:
        """The store's tasks are ending, the subscription task with them: the
        next :meth:`join` starts a new one."""
        self._join = None

    async def closed(self) -> None:
        """Once the store's tasks ended: if that left the shared listener
        without subscribers, wait until its connection is closed too."""
        shared, self._shared = self._shared, None
        if shared is not None and shared.idle:
            # Bounded: the listener's task closes its connection synchronously
            # once cancelled, at its next scheduling.
            with trio.CancelScope(shield=True):
                await shared.closed()

    def feed_poll(self, timings: Timings) -> Callable[[bool], float]:
        """How long a feed waits before re-reading on its own: the safety
        interval while notifications flow, the adaptive cadence when not."""
        adaptive = adaptive_poll(timings)

        def poll(active: bool) -> float:
            if self._listening.is_set():
                adaptive(True)  # start over at the active cadence if it stops
                return timings.notify_safety_s
            return adaptive(active)

        return poll

    async def _hear(self, scope: trio.CancelScope) -> None:
        """This store's subscription to the shared listener (``shared``),
        in the store's nursery: create the schema (its channel names), then
        subscribe until ``scope`` is cancelled (no local subscriber left, or
        the store's last exit)."""
        with scope:
            tries = 0
            while True:
                try:
                    with errors("listen"):
                        channels = await self._db.channels_ready()
                    break
                except Exception:
                    # Feeds poll meanwhile; the next try may find the server.
                    self._wakeups.notify_all()
                    tries += 1
                    await trio.sleep(STORE_RECONNECT.delay(tries))
            hearing = _Hearing(self, channels)
            shared = self._shared = listener(
                self._db.listen_conninfo, timeout_s=self._db.connect_timeout_s
            )
            shared.subscribe(hearing)
            try:
                await trio.sleep_forever()
            finally:
                shared.unsubscribe(hearing)
                self._listening_changed(False)

    def _listening_changed(self, on: bool) -> None:
        """Subscribed (catch up, then follow notifications) or lost (catch up, poll)."""
        if on:
            self._listening.set()
        elif self._listening.is_set():
            self._listening = trio.Event()
        self._wakeups.notify_all()

    def _heard(self, channel: str, payload: str) -> None:
        """A notification on one of this store's two channels."""
        assert self._db.channels is not None
        if channel == self._db.channels[0]:
            self._notifications += 1
            origin, _, session_id = payload.partition(" ")
            if origin == self._db.origin:
                self._own_notifications += 1
            else:
                self._wakeups.notify(session_id)
                self._announce(session_id)
        else:
            self._on_presence(payload)

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(session_id)`` when another process appends to a session.

        The store's cross-process wake-up (``store.pending``): a server with
        handlers passes its drain wake-up here, so work appended elsewhere
        starts at once instead of waiting for a watchdog. Notifications come
        through the shared listener (``listen=True``, inside ``async with
        store``); echoes of this store's own writes are filtered out. Returns
        the function that stops it.
        """
        self._pending_watchers.add(on_session)
        release = self.subscribe()

        def unwatch() -> None:
            self._pending_watchers.discard(on_session)
            release()

        return unwatch

    def _announce(self, session_id: str) -> None:
        for on_session in list(self._pending_watchers):
            on_session(session_id)
