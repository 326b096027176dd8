"""The Redis store's shared subscriber connection, and the live feeds on it.

One subscriber per store serves every feed, presence subscriber and pending
watcher: inside ``async with store`` one task of the store's nursery holds
it, once something needs it. Channels are reference-counted: the first user
of a channel subscribes it, the last one's release unsubscribes it.

**Live feeds, as the seed does them.** A feed marks its session watched (a
key with a TTL of three safety periods, refreshed at most once per safety
period per session per process, by the read itself) and subscribes to the
session's ``notify`` channel through the shared subscriber (reference-counted
per channel) before its first read. A write script publishes a disposable
wake-up, the writing store's instance id, only while the marker exists, so
unwatched sessions cost nothing. A wake-up only says *when* to read: the pump
reads from its cursor (``XRANGE``), and re-reads every ``notify_safety_s``
anyway, so a lost notification delays a feed but never loses an event. A
store's own writes hand their rows to local feeds directly; their echoes are
skipped by instance id. Other stores' ``pending`` announcements call the
pending watchers, and their ``presence`` patches go to local presence
subscribers.

**Reconnects.** Whatever breaks the connection, the task reconnects with
backoff (``a2trio.backoff.STORE_RECONNECT``). Each connection subscribes every channel in
use, then wakes every feed (each catches up from its cursor) and, after a
reconnect, repaints presence. Watched markers may have lapsed meanwhile: the
next reads renew them.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import msgspec
import trio
from coredis.retry import NoRetryPolicy

from ...backoff import STORE_RECONNECT
from ...errors import A2Error, ErrorCode
from ..base import StoredEvent, StoredPresencePatch
from ..feed import Feed, adaptive_poll, open_pump_feed
from . import codec
from . import scripts as lua

if TYPE_CHECKING:
    from ...timings import Timings
    from ..feed import Wakeups
    from ..tasks import StoreTasks
    from .codec import Keys
    from .conn import Connection

__all__ = ["Subscriber", "SubscriberStatistics"]

#: How long a feed's first read waits for its channel's subscription: long
#: enough for a healthy subscriber (a round trip), short enough that an
#: outage only delays the feed (the safety re-read covers it).
_SUBSCRIBE_WAIT_S = 1.0
#: A feed inside ``async with store`` rides out an outage this long (its
#: reads retried every ``_FEED_RETRY_S``) before it fails with
#: ``STORE_UNAVAILABLE``: a Redis restart delays feeds, it does not end them.
_FEED_OUTAGE_S = 30.0
_FEED_RETRY_S = 0.1


class SubscriberStatistics(msgspec.Struct, frozen=True):
    """The shared subscriber: ``connections`` it made (a reconnect adds one),
    ``channels`` subscribed now, event ``notifications`` heard and ``own`` of
    them (this store's echoes, skipped)."""

    connections: int
    channels: int
    notifications: int
    own: int


def _index_of(event: StoredEvent) -> int:
    return event.index


class Subscriber:
    """The shared subscriber of one store.

    Args:
      conn: the store's command client (the subscriber's connection is
        made from it, the pending marker set through it).
      keys: the store's key names.
      origin: the store's instance id; its own messages are skipped.
      timings: ``notify_safety_s`` paces the markers and the feeds' re-reads.
      tasks: the store's task nursery, where the subscriber runs.
      wakeups: the store's local feeds.
      on_presence: delivers another store's patch to local subscribers.
      repaint: after a reconnect, delivers every followed session's rows again.
    """

    def __init__(
        self,
        *,
        conn: Connection,
        keys: Keys,
        origin: str,
        timings: Timings,
        tasks: StoreTasks,
        wakeups: Wakeups,
        on_presence: Callable[[str, StoredPresencePatch], None],
        repaint: Callable[[], Awaitable[None]],
    ) -> None:
        self._conn = conn
        self._keys = keys
        self._origin = origin
        self._origin_bytes = origin.encode()
        self._timings = timings
        self._tasks = tasks
        self._wakeups = wakeups
        self._on_presence = on_presence
        self._repaint = repaint
        # Channel -> (kind, session) and its count of users; a readiness
        # event per channel on the current connection.
        self._refs: dict[bytes, int] = {}
        self._routes: dict[bytes, tuple[str, str]] = {}
        self._ready: dict[bytes, trio.Event] = {}
        self._changed = trio.Event()
        self._started = False
        self._listening = trio.Event()
        self._connections = 0
        self._notifications = 0
        self._own_notifications = 0
        self._channels = 0
        # Session -> when (monotonic) its watched marker was last refreshed.
        self._marked: dict[str, float] = {}
        self._pending_watchers: set[Callable[[str], None]] = set()

    @property
    def listening(self) -> bool:
        """Whether the connection is up: feeds follow wake-ups."""
        return self._listening.is_set()

    async def wait_listening(self) -> None:
        """Start the subscriber if the store is entered; wait until it is connected."""
        self.start()
        await self._listening.wait()

    def statistics(self) -> SubscriberStatistics:
        return SubscriberStatistics(
            self._connections, self._channels, self._notifications, self._own_notifications
        )

    def forget(self) -> None:
        """The store's tasks end: the next entry starts a new subscriber."""
        self._started = False
        self._ready.clear()
        if self._listening.is_set():
            self._listening = trio.Event()

    # -- channels ----------------------------------------------------------------

    def acquire(self, channel: bytes, kind: str, session_id: str) -> None:
        count = self._refs.get(channel, 0)
        self._refs[channel] = count + 1
        if count == 0:
            self._routes[channel] = (kind, session_id)
            self._changed.set()
        self.start()

    def release(self, channel: bytes) -> None:
        left = self._refs[channel] - 1
        if left > 0:
            self._refs[channel] = left
            return
        del self._refs[channel]
        del self._routes[channel]
        self._ready.pop(channel, None)
        self._changed.set()

    def ready(self, channel: bytes) -> trio.Event:
        """Set once ``channel`` is subscribed on the current connection."""
        event = self._ready.get(channel)
        if event is None:
            event = self._ready[channel] = trio.Event()
        return event

    # -- live feeds ---------------------------------------------------------------

    @asynccontextmanager
    async def open_feed(
        self,
        session_id: str,
        start_after: int,
        read: Callable[[int, int], Awaitable[list[StoredEvent]]],
    ) -> AsyncIterator[Feed[StoredEvent]]:
        """The session's live feed (see the module docstring). ``read(after,
        watch_ttl_ms)`` reads the rows after ``after`` and (re)sets the
        session's watched marker with that TTL (0: leave it)."""
        channel = self._keys.channel(session_id, "notify")
        first = True

        async def read_after(cursor: int) -> list[StoredEvent]:
            nonlocal first
            if self._conn.closed:
                raise A2Error(ErrorCode.STORE_UNAVAILABLE, "read failed: the store was closed")
            if first and self._tasks.nursery is not None:
                # Subscribe before the first read: anything written after it
                # wakes the pump, so nothing slips between catch-up and park.
                first = False
                with trio.move_on_after(_SUBSCRIBE_WAIT_S):
                    await self.ready(channel).wait()
            # Ride out a short outage (a restart): read again until Redis is
            # back, so the feed resumes from its cursor instead of failing.
            deadline = trio.current_time() + _FEED_OUTAGE_S
            while True:
                try:
                    return await read(cursor, self._marker_ttl_ms(session_id))
                except A2Error as exc:
                    if (
                        exc.code is not ErrorCode.STORE_UNAVAILABLE
                        or self._conn.closed
                        or self._tasks.nursery is None
                        or trio.current_time() >= deadline
                    ):
                        raise
                await trio.sleep(_FEED_RETRY_S)

        self.acquire(channel, "notify", session_id)
        try:
            async with open_pump_feed(
                session_id,
                read_after,
                _index_of,
                self._wakeups,
                start_after=start_after,
                poll=self._feed_poll(),
            ) as feed:
                yield feed
        finally:
            self.release(channel)
            if channel not in self._refs:
                self._marked.pop(session_id, None)

    def _marker_ttl_ms(self, session_id: str) -> int:
        """The TTL a feed's read gives the session's watched marker (three
        safety periods), or 0 if this process refreshed it less than one
        safety period ago, or outside ``async with store``."""
        if self._tasks.nursery is None:
            return 0
        now = time.monotonic()
        safety_s = self._timings.notify_safety_s
        if now - self._marked.get(session_id, -math.inf) >= safety_s:
            self._marked[session_id] = now
            return int(safety_s * 3000)
        return 0

    def _feed_poll(self) -> Callable[[bool], float]:
        """How long a feed waits before re-reading on its own: the safety
        interval while a subscriber serves the store (it wakes every feed when
        it reconnects), the adaptive cadence outside ``async with store``."""
        adaptive = adaptive_poll(self._timings)

        def poll(active: bool) -> float:
            if self._tasks.nursery is not None:
                adaptive(True)
                return self._timings.notify_safety_s
            return adaptive(active)

        return poll

    # -- the connection -------------------------------------------------------------

    def start(self) -> None:
        nursery = self._tasks.nursery
        if not self._started and nursery is not None:
            self._started = True
            nursery.start_soon(self._serve)

    async def _serve(self) -> None:
        """Hold the shared subscriber connection; reconnect with backoff.

        Runs until the store's nursery is cancelled. Each connection
        subscribes every channel in use, then wakes every feed (each catches
        up from its cursor) and, after a reconnect, repaints presence.
        """
        tries = 0
        while True:
            connected = self._connections
            try:
                await self._subscribe_once()
            except Exception:
                # Whatever broke (the connection, the server, a callback), the
                # store outlives it. Cancellation is a BaseException: it ends this.
                pass
            except BaseExceptionGroup as group:
                # Cancelled while coredis' pubsub was failing too (its cleanup
                # writes to a closing connection): end with the cancellation.
                cancelled, _ = group.split(trio.Cancelled)
                if cancelled is None:  # pragma: no cover - only Cancelled is a BaseException here
                    raise
                raise cancelled from None
            if self._listening.is_set():
                self._listening = trio.Event()
            self._ready.clear()
            self._channels = 0
            if self._connections > connected:
                tries = 0
            tries += 1
            await trio.sleep(STORE_RECONNECT.delay(tries))

    async def _subscribe_once(self) -> None:
        client = self._conn.client
        if client is None:
            raise trio.ClosedResourceError("the store's client is being reopened")
        pubsub = client.pubsub(
            retry_policy=NoRetryPolicy(),
            ignore_subscribe_messages=True,
            subscription_timeout=self._conn.connect_timeout_s,
        )
        async with pubsub, trio.open_nursery() as nursery:
            subscribed: set[bytes] = set()
            await self._sync_channels(pubsub, subscribed)
            self._connections += 1
            self._listening.set()
            # Markers may have lapsed while disconnected: the next reads renew them.
            self._marked.clear()
            self._wakeups.notify_all()
            if self._connections > 1:
                nursery.start_soon(self._repaint)
            nursery.start_soon(self._follow_changes, pubsub, subscribed)
            nursery.start_soon(self._refresh_pending_marker)
            while True:
                message = await pubsub.get_message()
                if message is not None:
                    self.dispatch(cast(bytes, message["channel"]), cast(bytes, message["data"]))

    async def _sync_channels(self, pubsub: Any, subscribed: set[bytes]) -> None:
        """Subscribe the channels in use and unsubscribe the others."""
        wanted = set(self._refs)
        add = sorted(wanted - subscribed)
        drop = sorted(subscribed - wanted)
        if add:
            await pubsub.subscribe(*add)
            subscribed.update(add)
        if drop:
            await pubsub.unsubscribe(*drop)
            subscribed.difference_update(drop)
        self._channels = len(subscribed)
        for channel in subscribed & set(self._refs):
            self.ready(channel).set()

    async def _follow_changes(self, pubsub: Any, subscribed: set[bytes]) -> None:
        while True:
            changed = self._changed = trio.Event()
            await self._sync_channels(pubsub, subscribed)
            await changed.wait()

    def dispatch(self, channel: bytes, data: bytes) -> None:
        """Route one message by its channel's kind."""
        route = self._routes.get(channel)
        if route is None:
            return  # a channel just released
        kind, session_id = route
        if kind == "notify":
            self._notifications += 1
            if data == self._origin_bytes:
                self._own_notifications += 1
            else:
                self._wakeups.notify(session_id)
        elif kind == "pending":
            origin, _, session = data.partition(b" ")
            if origin != self._origin_bytes:
                for on_session in list(self._pending_watchers):
                    on_session(session.decode())
        else:
            try:
                note = codec.decode_note(data)
            except msgspec.DecodeError:
                return  # not a message this version writes
            if note.origin != self._origin:
                self._on_presence(
                    session_id,
                    StoredPresencePatch(note.participant, note.values, note.seen, note.at_ms),
                )

    # -- pending watchers -----------------------------------------------------------

    async def _refresh_pending_marker(self) -> None:
        """While drains watch for other processes' work, keep the marker that
        makes write scripts publish it."""
        safety_s = self._timings.notify_safety_s
        while True:
            if self._pending_watchers:
                try:
                    await self._conn.run(
                        lua.SET_PX,
                        [self._keys.global_key("pending:watched")],
                        [int(safety_s * 3000)],
                    )
                except Exception:
                    pass  # the subscriber notices an outage itself
            await trio.sleep(safety_s)

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(key)`` when another process appends unsettled events
        to the session stored under ``key``; return the function that stops it.

        The store's cross-process wake-up (``store.pending``), inside ``async
        with store``; this store's own writes are skipped.
        """
        first = not self._pending_watchers
        self._pending_watchers.add(on_session)
        channel = self._keys.global_key("pending").encode()
        self.acquire(channel, "pending", "")
        nursery = self._tasks.nursery
        if first and nursery is not None:
            nursery.start_soon(self._mark_pending_now)
        stopped = False

        def unwatch() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            self._pending_watchers.discard(on_session)
            self.release(channel)

        return unwatch

    async def _mark_pending_now(self) -> None:
        try:
            await self._conn.run(
                lua.SET_PX,
                [self._keys.global_key("pending:watched")],
                [int(self._timings.notify_safety_s * 3000)],
            )
        except Exception:
            pass  # refreshed by the subscriber once it connects
