"""The Redis store: the seed's Redis Streams backend (``experimental-a2/store-redis``).

Theory of operation
-------------------

**Driver.** coredis (6.x, built on anyio, so it runs on Trio natively)
multiplexes commands over its connections; ``bench/redis_driver.py`` measured
it against redis-py (through a thread, and its asyncio client through
trio-asyncio), see ``docs/performance.md``. ``async with store:`` opens the
store's nursery, where one task holds the coredis client (its connection pool
lives there) and, once a feed, a presence subscriber or a pending watcher
needs it, one task holds the **shared subscriber connection**. Connections
scale with processes (the subscriber, plus the command connections coredis
multiplexes calls over: it opens another only for calls that send at the
same instant), not with viewers. Outside ``async with store:`` each operation opens a short-lived
client of its own: correct, slower, and without push delivery.

**One script per step.** Each store operation that reads and writes is one
Lua script (``scripts``; the key layout is documented there): Redis
runs it to completion before any other command, so a script is a
transaction and nothing can interleave between its checks and its writes.
That gives contiguous indexes, store-wide unique ids (the ``P:ids`` hash),
idempotent replay, partial-batch refusal, the attempt-currency fence, claims
that never share an attempt, and completion with its returned events and
the lane hand-off, each atomically. The rules are the seed's, through
``rules`` (the scripts return what the rules read; the failure verdict is
``rules.fail_verdict`` itself, written back by a compare-and-set script).

**Cancellation.** A call's round trip is shielded (coredis loses a pool slot
to a connection cancelled mid-connect, and outside ``async with store`` its
own client's connection tasks would be cancelled under it): a cancellation
lands at the checkpoint after the reply, so a cancelled call either ran whole
or never started, and waits at most the connect and command timeouts. Ids
are generated before the script runs, so a retry with the same events
replays instead of duplicating. The client never retries on its own:
a lost connection is ``STORE_UNAVAILABLE`` and the caller retries.

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
skipped by instance id. When the subscriber reconnects it resubscribes every
channel and wakes every feed, which catches up from its cursor.

**Presence, push tier.** Rows live in a hash per session (field-wise LWW on
the sender's ``at`` inside the script, expiry on the store's clock, the key
itself expiring in real time after its last row would). The script publishes
the applied patch on the session's ``presence`` channel; the writing store
delivers it to local subscribers as it returns and skips its own echo. After
the subscriber reconnects, every followed session's rows are re-read and
delivered again (a repaint: values may repeat, none is lost).

**Faults.** While Redis is down every operation raises ``STORE_UNAVAILABLE``
(the cause in ``__cause__``). The subscriber reconnects with backoff by
itself. ``aclose()`` severs every feed with ``STORE_UNAVAILABLE`` and closes
both connections. Cluster mode is out: the scripts span a session's keys and
the store-wide ones.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Literal, cast

import coredis
import msgspec
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis.exceptions import NoScriptError
from coredis.retry import NoRetryPolicy

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import A2Error, ErrorCode, store_unavailable
from ...ids import IdSource, random_id
from ...timings import DEFAULT_TIMINGS, Timings
from .. import rules as verdicts
from ..base import (
    ActionKind,
    AppendEvent,
    AppendResult,
    Busy,
    Claimed,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    EventCause,
    EventPage,
    FailResult,
    OperatorAction,
    PresenceRow,
    RenewResult,
    SessionPage,
    SessionSummary,
    Settled,
    Snapshot,
    SnapshotInfo,
    StateRead,
    StoredEvent,
    StoredPresencePatch,
)
from ..feed import Feed, FeedStatistics, Wakeups, adaptive_poll, open_pump_feed
from ..tasks import StoreTasks
from . import scripts as lua

__all__ = ["RedisStore", "SubscriberStatistics", "redis"]

_log = logging.getLogger("a2trio.stores.redis")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_decode_ids = msgspec.json.Decoder(list[str]).decode

_SCHEMES = ("redis://", "rediss://", "unix://")
#: How long a feed's first read waits for its channel's subscription: long
#: enough for a healthy subscriber (a round trip), short enough that an
#: outage only delays the feed (the safety re-read covers it).
_SUBSCRIBE_WAIT_S = 1.0
_SUBSCRIBER_BACKOFF_S = (0.05, 2.0)
#: A feed inside ``async with store`` rides out an outage this long (its
#: reads retried every ``_FEED_RETRY_S``) before it fails with
#: ``STORE_UNAVAILABLE``: a Redis restart delays feeds, it does not end them.
_FEED_OUTAGE_S = 30.0
_FEED_RETRY_S = 0.1
#: The presence key outlives its latest row by this much (real time): rows
#: expire on the store's clock, the key only collects abandoned sessions.
_PRESENCE_KEY_SLACK_MS = 60_000
#: Compare-and-set rounds of a failure before giving up (each loses only to
#: a concurrent write of the same event's row).
_CAS_ROUNDS = 16
#: Sessions the sweep checks per script.
_SWEEP_PAGE = 100


class _Cause(msgspec.Struct, frozen=True, array_like=True):
    index: int
    attempt: int
    batch_size: int | None = None


class _Entry(msgspec.Struct, frozen=True, array_like=True):
    """An event's immutable half, as stored in the stream. Entries written
    before the trace context existed end at ``settled`` and still decode."""

    id: str
    type: str
    payload: Any
    created_at_ms: int
    cause: _Cause | None
    lane: str | None
    settled: bool
    trace_context: str | None = None


class _Meta(msgspec.Struct, omit_defaults=True):
    """An unsettled event's bookkeeping, as the scripts store it (see
    ``scripts``). Its attributes satisfy ``rules.Bookkeeping``
    through the properties below."""

    a: int = 0
    f: int = 0
    h: str | None = None
    x: int | None = None
    fc: int | None = None
    lc: int | None = None
    lf: int | None = None
    la: int | None = None
    e: str | None = None
    d: int | None = None
    p: int | None = None
    pb: int | None = None
    r: str | None = None
    l: str | None = None  # noqa: E741 - the scripts' field name

    @property
    def processed_at_ms(self) -> int | None:
        return self.p

    @property
    def failed_at_ms(self) -> int | None:
        return self.d

    @property
    def attempt_count(self) -> int:
        return self.a

    @property
    def claim_holder(self) -> str | None:
        return self.h

    @property
    def failure_count(self) -> int:
        return self.f

    @property
    def last_failed_attempt(self) -> int | None:
        return self.la

    @property
    def claim_expires_at_ms(self) -> int | None:
        return self.x


class _Action(msgspec.Struct, frozen=True, array_like=True):
    """An operator action as ``P:S:actions`` stores it."""

    action: ActionKind
    index: int
    by: str
    reason: str
    at_ms: int


class _PresenceNote(msgspec.Struct, frozen=True):
    """A published presence patch, as the script writes it."""

    o: str
    p: str
    s: int
    a: int
    v: dict[str, Any]


_encode_entry = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(_Entry).decode
_encode_meta = msgspec.json.Encoder().encode
_decode_action = msgspec.json.Decoder(_Action).decode
_decode_meta = msgspec.json.Decoder(_Meta).decode
_decode_note = msgspec.json.Decoder(_PresenceNote).decode

#: A settled event's bookkeeping for the verdicts: processed, by no attempt.
_SETTLED = _Meta(p=0)


class SubscriberStatistics(msgspec.Struct, frozen=True):
    """The shared subscriber: ``connections`` it made (a reconnect adds one),
    ``channels`` subscribed now, event ``notifications`` heard and ``own`` of
    them (this store's echoes, skipped)."""

    connections: int
    channels: int
    notifications: int
    own: int


def _closing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` whose ``run`` always closes the memory streams
    the connection made in its constructor. coredis 6.9 closes them only once
    connected, so a connection that failed (or was cancelled) while connecting
    leaked them (a ``ResourceWarning`` each, while Redis is down)."""

    class Closing(connection_class):  # type: ignore[misc]
        async def run(self, **kwargs: Any) -> None:
            try:
                await super().run(**kwargs)
            finally:
                for value in list(vars(self).values()):
                    if isinstance(value, MemoryObjectSendStream | MemoryObjectReceiveStream):
                        value.close()

    Closing.__name__ = Closing.__qualname__ = f"Closing{connection_class.__name__}"
    return Closing


def _errors(what: str) -> store_unavailable:
    """The Redis store's one error translation: every failure (a lost
    connection, a timeout, a script error, the store closed) is
    ``STORE_UNAVAILABLE``; verdicts pass through."""
    return store_unavailable(what)


def _row(session_id: str, index: int, entry: bytes, meta: bytes | None) -> StoredEvent:
    e = _decode_entry(entry)
    cause = None if e.cause is None else EventCause(*msgspec.structs.astuple(e.cause))
    if meta is None:
        return StoredEvent(
            id=e.id,
            type=e.type,
            payload=e.payload,
            index=index,
            session_id=session_id,
            created_at_ms=e.created_at_ms,
            cause=cause,
            lane=e.lane,
            processed_at_ms=e.created_at_ms if e.settled else None,
            trace_context=e.trace_context,
        )
    m = _decode_meta(meta)
    return StoredEvent(
        id=e.id,
        type=e.type,
        payload=e.payload,
        index=index,
        session_id=session_id,
        created_at_ms=e.created_at_ms,
        cause=cause,
        lane=e.lane,
        trace_context=e.trace_context,
        processed_at_ms=m.p,
        processed_by_attempt=m.pb,
        returned_event_ids=None if m.r is None else _decode_ids(m.r),
        first_claimed_at_ms=m.fc,
        last_claimed_at_ms=m.lc,
        attempt_count=m.a,
        failure_count=m.f,
        last_failed_at_ms=m.lf,
        last_failed_attempt=m.la,
        last_error=m.e,
        failed_at_ms=m.d,
        claim_holder=m.h,
        claim_expires_at_ms=m.x,
    )


def _rows(session_id: str, flat: Sequence[Any]) -> list[StoredEvent]:
    """Rows from a script's ``{index, entry, meta, ...}``."""
    return [
        _row(session_id, int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)
    ]


def _stored(session_id: str, flat: Sequence[Any]) -> list[StoredEvent]:
    """The rows of ``stored_rows``' ``{id, session, index, entry, meta, ...}``.

    A row in another session is not read (the script names only this
    session's keys): it stands for its id and session, which is all the
    verdicts ask of a foreign row."""
    out = []
    for i in range(0, len(flat), 5):
        event_id, where, index, entry, meta = flat[i : i + 5]
        if entry is None:
            out.append(
                StoredEvent(
                    id=event_id.decode(),
                    type="",
                    payload=None,
                    index=int(index),
                    session_id=where.decode(),
                    created_at_ms=0,
                )
            )
        else:
            out.append(_row(session_id, int(index), entry, meta))
    return out


def _entry(event: AppendEvent, event_id: str, now: int, cause: EventCause | None) -> bytes:
    stored_cause = None if cause is None else _Cause(cause.index, cause.attempt, cause.batch_size)
    return _encode_entry(
        _Entry(
            event_id,
            event.type,
            event.payload,
            now,
            stored_cause,
            event.lane,
            event.settled,
            event.trace_context,
        )
    )


def _lane_arg(lane: str | None) -> str:
    return "" if lane is None else "=" + lane


def _index_of(event: StoredEvent) -> int:
    return event.index


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _RedisPresence:
    """Presence rows in a hash per session: LWW per field, pushed by pub/sub."""

    push = True

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._subscribers: dict[str, set[Callable[[StoredPresencePatch], None]]] = {}

    async def set(
        self,
        session_id: str,
        participant: str,
        values: dict[str, Any],
        *,
        seen: int,
        at_ms: int,
        ttl_ms: int,
    ) -> StoredPresencePatch | None:
        """Apply the fields in one script; deliver the patch locally, publish it.

        Cancellation: applied entirely or not at all; retrying with the same
        ``at_ms`` is idempotent (ties go to the incoming write).
        """
        if not values:
            await trio.lowlevel.checkpoint()
            return None
        store = self._store
        with _errors("presence set"):
            now = store.clock.now_ms()
            args: list[str | bytes | int] = [
                now,
                now + ttl_ms,
                seen,
                at_ms,
                ttl_ms + _PRESENCE_KEY_SLACK_MS,
                store._origin,
                store._key(session_id, "presence"),
                participant,
                _encode(participant),
            ]
            for field, value in values.items():
                args += [field, _encode(field), b"" if value is None else _encode(value)]
            applied = await store._eval(
                lua.PRESENCE_SET, [store._key(session_id, "presence")], args
            )
        fields = {_text(f) for f in applied}
        if not fields:
            return None
        patch = StoredPresencePatch(
            participant, {f: v for f, v in values.items() if f in fields}, seen, at_ms
        )
        self.deliver(session_id, patch)
        return patch

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, expired ones deleted, in one script. Cancellation: a
        checkpoint; the sweep is idempotent."""
        store = self._store
        with _errors("presence read"):
            flat = await store._eval(
                lua.PRESENCE_READ, [store._key(session_id, "presence")], [store.clock.now_ms()]
            )
        rows = []
        for i in range(0, len(flat), 2):
            participant, _, field = flat[i].partition(b"\0")
            at, seen, expires, value = flat[i + 1].split(b":", 3)
            rows.append(
                PresenceRow(
                    participant.decode(),
                    field.decode(),
                    _decode(value),
                    int(seen),
                    int(at),
                    int(expires),
                )
            )
        rows.sort(key=lambda row: (row.participant, row.field))
        return rows

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        subscribers = self._subscribers.setdefault(session_id, set())
        subscribers.add(on_patch)
        channel = self._store._channel(session_id, "presence")
        self._store._acquire(channel, "presence", session_id)
        stopped = False

        def unsubscribe() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            subscribers.discard(on_patch)
            if not subscribers and self._subscribers.get(session_id) is subscribers:
                del self._subscribers[session_id]
            self._store._release(channel)

        return unsubscribe

    def deliver(self, session_id: str, patch: StoredPresencePatch) -> None:
        for on_patch in list(self._subscribers.get(session_id, ())):
            on_patch(patch)

    def followed(self) -> list[str]:
        return list(self._subscribers)

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())


class _RedisInspection:
    def __init__(self, store: RedisStore) -> None:
        self._store = store

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions by id (``ZRANGE BYLEX``), then their counters. Cancellation: a read."""
        store = self._store
        low = b"[" + prefix.encode()
        if cursor is not None and cursor >= prefix:
            low = b"(" + cursor.encode()
        # No UTF-8 string has the byte 0xff: every id with the prefix sorts below.
        high = b"(" + prefix.encode() + b"\xff"
        with _errors("list sessions"):
            ids = [
                _text(s)
                for s in await store._eval(
                    _LIST, [store._global("sessions")], [low, high, limit + 1]
                )
            ]
            page = ids[:limit]
            keys = [store._key(sid, suffix) for sid in page for suffix in ("head", "meta", "open")]
            counters = await store._eval(lua.SUMMARIES, keys, []) if page else []
        sessions = [
            SessionSummary(
                session_id=sid,
                event_count=int(c[0]),
                pending_count=int(c[3]),
                failed_count=int(c[4]),
                attempt_count=int(c[5]),
                failure_count=int(c[6]),
                first_event_at_ms=int(c[1]),
                updated_at_ms=int(c[2]),
            )
            for sid, c in zip(page, counters, strict=True)
        ]
        more = len(ids) > limit
        return SessionPage(sessions, sessions[-1].session_id if more and sessions else None)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """A page bounded by the frontier, in one script. Cancellation: a read."""
        store = self._store
        with _errors("read events"):
            through, flat = await store._eval(
                lua.READ_EVENTS,
                [store._key(session_id, s) for s in ("log", "meta", "head")],
                [
                    max(0, after_index),
                    "" if through_index is None else max(0, through_index),
                    max(0, limit),
                ],
            )
        return EventPage(_rows(session_id, flat), int(through))

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""
        store = self._store
        with _errors("list snapshots"):
            flat = await store._eval(_HGETALL, [store._key(session_id, "snap")], [])
        infos = []
        for i in range(0, len(flat), 2):
            index, updated, _ = flat[i + 1].split(b":", 2)
            infos.append(SnapshotInfo(flat[i].decode(), int(index), int(updated)))
        infos.sort(key=lambda info: info.reducer_name)
        return infos


_LIST = "return redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'BYLEX', 'LIMIT', 0, ARGV[3])"
_LRANGE = "return redis.call('LRANGE', KEYS[1], 0, -1)"
_HGETALL = "return redis.call('HGETALL', KEYS[1])"
_SET_PX = "return redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])"


class RedisStore:
    """A :class:`~a2trio.stores.Store` on Redis, with presence (push tier),
    inspection, cross-process wake-ups (:class:`~a2trio.stores.base.WatchesPending`)
    and the sweep (:class:`~a2trio.stores.base.SweepsClaimable`).

    Build it with :func:`redis`. Attributes: ``url``, ``key_prefix``,
    ``clock``, ``timings``, ``presence``, ``inspect``.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "a2",
        clock: Clock | None = None,
        ids: IdSource | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        connect_timeout_s: float = 5.0,
        command_timeout_s: float | None = 10.0,
    ) -> None:
        if not url.startswith(_SCHEMES):
            raise ValueError(f"Redis URL {url!r} must start with redis://, rediss:// or unix://")
        if not key_prefix or ":" in key_prefix:
            raise ValueError(f"key_prefix {key_prefix!r} must be non-empty and without ':'")
        self.url = url
        self.key_prefix = key_prefix
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        self.timings = timings
        self._new_id: IdSource = random_id if ids is None else ids
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._origin = random_id()
        self._origin_bytes = self._origin.encode()
        self._shas: dict[str, str] = {}
        self._wakeups = Wakeups()
        self._tasks = StoreTasks("Redis store")
        self._client: coredis.Redis[bytes] | None = None
        self._entered = 0
        self._closed = False
        # The shared subscriber: channel -> (kind, session) and its count of
        # users; a readiness event per channel on the current connection.
        self._refs: dict[bytes, int] = {}
        self._routes: dict[bytes, tuple[str, str]] = {}
        self._ready: dict[bytes, trio.Event] = {}
        self._changed = trio.Event()
        self._subscriber_started = False
        self._listening = trio.Event()
        self._connections = 0
        self._notifications = 0
        self._own_notifications = 0
        self._channels = 0
        # Session -> when (monotonic) its watched marker was last refreshed.
        self._marked: dict[str, float] = {}
        self._pending_watchers: set[Callable[[str], None]] = set()
        self.presence: _RedisPresence = _RedisPresence(self)
        self.inspect: _RedisInspection = _RedisInspection(self)

    def __repr__(self) -> str:
        return f"RedisStore(key_prefix={self.key_prefix!r})"

    @property
    def _nursery(self) -> trio.Nursery | None:
        """Where the store's tasks start: inside ``async with store``, until
        ``aclose()`` (or a task's failure) ends them."""
        return self._tasks.nursery

    # -- keys ------------------------------------------------------------------

    def _key(self, session_id: str, suffix: str) -> str:
        return f"{self.key_prefix}:{session_id}:{suffix}"

    def _global(self, name: str) -> str:
        return f"{self.key_prefix}:{name}"

    def _channel(self, session_id: str, kind: str) -> bytes:
        return self._key(session_id, kind).encode()

    def _session_keys(self, session_id: str) -> list[str]:
        return [self._key(session_id, s) for s in ("log", "meta", "open", "head")]

    def _write_keys(self, session_id: str) -> list[str]:
        return [
            *self._session_keys(session_id),
            self._global("ids"),
            self._global("sessions"),
            self._key(session_id, "watched"),
            self._global("pending:watched"),
            self._global("open-sessions"),
        ]

    # -- lifecycle -------------------------------------------------------------

    def _new_client(self) -> coredis.Redis[bytes]:
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self.url,
            decode_responses=False,
            retry_policy=NoRetryPolicy(),
            connect_timeout=self._connect_timeout_s,
            stream_timeout=self._command_timeout_s,
        )
        pool = client.connection_pool
        pool.connection_class = _closing(pool.connection_class)
        return client

    async def __aenter__(self) -> RedisStore:
        """Open the store's task nursery (``tasks``) and its client on the
        first entry.

        Nested entries share them; they close with the outermost exit, which
        must happen in the task that entered first. No I/O happens here.

        Cancellation: opens no connection; if cancelled, nothing is left open.
        """
        if self._closed:
            raise trio.ClosedResourceError("this Redis store was closed: create a new one")
        if self._entered == 0:
            nursery = await self._tasks.enter()
            try:
                await nursery.start(self._serve_client)
            except BaseException:
                await self._stop_tasks()
                raise
        self._entered += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered -= 1
        if self._entered > 0:
            return
        await self._stop_tasks()

    async def _serve_client(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Hold the command client (its pool's tasks) until the store's tasks
        are cancelled; if the pool fails (its connections' tasks raise), open
        a new one after a backoff. Meanwhile calls open clients of their own."""
        backoff = _SUBSCRIBER_BACKOFF_S[0]
        while True:
            try:
                async with self._new_client() as client:
                    self._client = client
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED
                    await trio.sleep_forever()
            except Exception:
                # The pool's task group failed: the store outlives it (callers
                # got STORE_UNAVAILABLE from their own calls). Cancellation is
                # a BaseException: it ends this.
                _log.warning("the Redis client failed; reopening it", exc_info=True)
            finally:
                self._client = None
            await trio.sleep(backoff)
            backoff = min(backoff * 2, _SUBSCRIBER_BACKOFF_S[1])

    def _forget_tasks(self) -> None:
        self._client = None
        self._subscriber_started = False
        self._ready.clear()
        if self._listening.is_set():
            self._listening = trio.Event()

    async def _stop_tasks(self) -> None:
        """End the store's tasks and leave the nursery ``__aenter__`` opened."""
        self._forget_tasks()
        await self._tasks.exit()

    async def aclose(self) -> None:
        """Close both connections; sever every feed with ``STORE_UNAVAILABLE``.
        Idempotent; later operations raise ``STORE_UNAVAILABLE``.

        Inside ``async with store`` it cancels the store's tasks (their
        connections close as they end), never the block itself: the block goes
        on, and its next operation raises ``STORE_UNAVAILABLE``. The nursery
        ``__aenter__`` opened is left to the block's exit, so feeds open in
        the block are not misnested.

        Cancellation: a checkpoint; the connections are closed either way.
        """
        self._closed = True
        self._forget_tasks()
        try:
            if self._entered > 0:
                await self._tasks.close()
            else:
                await self._stop_tasks()
        finally:
            self._wakeups.notify_all()
        await trio.lowlevel.checkpoint()

    @property
    def listening(self) -> bool:
        """Whether the shared subscriber is connected: feeds follow wake-ups."""
        return self._listening.is_set()

    async def wait_listening(self) -> None:
        """Wait until the shared subscriber is connected (tests, readiness probes).

        Starts it if the store is entered. Cancellation: a plain wait.
        """
        self._start_subscriber()
        await self._listening.wait()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds and presence subscribers (leak checks in tests)."""
        stats = self._wakeups.statistics()
        return FeedStatistics(
            listeners=stats.listeners + self.presence.subscriber_count(), keys=stats.keys
        )

    def subscriber_statistics(self) -> SubscriberStatistics:
        """What the shared subscriber did (tests, debugging)."""
        return SubscriberStatistics(
            self._connections, self._channels, self._notifications, self._own_notifications
        )

    async def _eval(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script (``EVALSHA``, loading it once per server) on the
        store's client, or on a client of its own outside ``async with``."""
        if self._closed:
            raise trio.ClosedResourceError("this Redis store was closed: create a new one")
        # Shielded: coredis leaks a pool slot for a connection cancelled
        # mid-connect (after its pool's 64 are gone, every call waits
        # forever). Outside ``async with`` the client's exit is shielded too:
        # its connection tasks run in its pool's task group, opened here, and
        # cancelled with the caller they cut the call's connection under it;
        # the pool's exit then let out the driver's error beside the
        # Cancelled. A call is bounded by the connect and command timeouts;
        # a cancellation lands at the checkpoint after it.
        client = self._client
        with trio.CancelScope(shield=True):
            if client is not None:
                result: Any = await self._evalsha(client, source, keys, args)
            else:
                async with self._new_client() as own:
                    result = await self._evalsha(own, source, keys, args)
        await trio.lowlevel.checkpoint()
        return result

    async def _evalsha(
        self, client: coredis.Redis[bytes], source: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """``EVALSHA``; after a ``NOSCRIPT`` (a new or restarted server),
        ``SCRIPT LOAD`` and again. (Straight to the command: coredis'
        ``Script`` wrapper costs a fifth more client CPU per call.)"""
        sha = self._shas.get(source)
        if sha is None:
            sha = self._shas[source] = hashlib.sha1(source.encode()).hexdigest()
        try:
            return await client.evalsha(sha, keys, args)
        except NoScriptError:
            await client.script_load(source)
            return await client.evalsha(sha, keys, args)

    # -- the shared subscriber -------------------------------------------------

    def _acquire(self, channel: bytes, kind: str, session_id: str) -> None:
        count = self._refs.get(channel, 0)
        self._refs[channel] = count + 1
        if count == 0:
            self._routes[channel] = (kind, session_id)
            self._changed.set()
        self._start_subscriber()

    def _release(self, channel: bytes) -> None:
        left = self._refs[channel] - 1
        if left > 0:
            self._refs[channel] = left
            return
        del self._refs[channel]
        del self._routes[channel]
        self._ready.pop(channel, None)
        self._changed.set()

    def _ready_event(self, channel: bytes) -> trio.Event:
        event = self._ready.get(channel)
        if event is None:
            event = self._ready[channel] = trio.Event()
        return event

    def _start_subscriber(self) -> None:
        if not self._subscriber_started and self._nursery is not None:
            self._subscriber_started = True
            self._nursery.start_soon(self._serve_subscriber)

    async def _serve_subscriber(self) -> None:
        """Hold the shared subscriber connection; reconnect with backoff.

        Runs until the store's nursery is cancelled. Each connection
        subscribes every channel in use, then wakes every feed (each catches
        up from its cursor) and, after a reconnect, repaints presence.
        """
        backoff = _SUBSCRIBER_BACKOFF_S[0]
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
                backoff = _SUBSCRIBER_BACKOFF_S[0]
            await trio.sleep(backoff)
            backoff = min(backoff * 2, _SUBSCRIBER_BACKOFF_S[1])

    async def _subscribe_once(self) -> None:
        client = self._client
        if client is None:
            raise trio.ClosedResourceError("the store's client is being reopened")
        pubsub = client.pubsub(
            retry_policy=NoRetryPolicy(),
            ignore_subscribe_messages=True,
            subscription_timeout=self._connect_timeout_s,
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
                    self._dispatch(cast(bytes, message["channel"]), cast(bytes, message["data"]))

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
            self._ready_event(channel).set()

    async def _follow_changes(self, pubsub: Any, subscribed: set[bytes]) -> None:
        while True:
            changed = self._changed = trio.Event()
            await self._sync_channels(pubsub, subscribed)
            await changed.wait()

    def _dispatch(self, channel: bytes, data: bytes) -> None:
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
                note = _decode_note(data)
            except msgspec.DecodeError:
                return  # not a message this version writes
            if note.o != self._origin:
                self.presence.deliver(
                    session_id, StoredPresencePatch(note.p, note.v, note.s, note.a)
                )

    async def _repaint(self) -> None:
        """After a reconnect: deliver every followed session's rows again, so
        subscribers see what changed while the channel was down."""
        for session_id in self.presence.followed():
            try:
                rows = await self.presence.read(session_id)
            except A2Error:
                return  # down again: the next connection repaints
            for row in rows:
                self.presence.deliver(
                    session_id,
                    StoredPresencePatch(
                        row.participant, {row.field: row.value}, row.seen, row.at_ms
                    ),
                )

    async def _refresh_pending_marker(self) -> None:
        """While drains watch for other processes' work, keep the marker that
        makes write scripts publish it."""
        safety_s = self.timings.notify_safety_s
        while True:
            if self._pending_watchers:
                try:
                    await self._eval(
                        _SET_PX, [self._global("pending:watched")], [int(safety_s * 3000)]
                    )
                except Exception:
                    pass  # the subscriber notices an outage itself
            await trio.sleep(safety_s)

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(key)`` when another process appends unsettled events
        to the session stored under ``key``; return the function that stops it.

        Through the shared subscriber (inside ``async with store``); this
        store's own writes are skipped.
        """
        first = not self._pending_watchers
        self._pending_watchers.add(on_session)
        channel = self._global("pending").encode()
        self._acquire(channel, "pending", "")
        if first and self._nursery is not None:
            self._nursery.start_soon(self._mark_pending_now)
        stopped = False

        def unwatch() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            self._pending_watchers.discard(on_session)
            self._release(channel)

        return unwatch

    async def _mark_pending_now(self) -> None:
        try:
            await self._eval(
                _SET_PX,
                [self._global("pending:watched")],
                [int(self.timings.notify_safety_s * 3000)],
            )
        except Exception:
            pass  # refreshed by the subscriber once it connects

    # -- writes and local feeds -------------------------------------------------

    def _wrote(self, session_id: str, rows: list[StoredEvent]) -> None:
        """A local write committed: hand its rows to local feeds (the
        subscriber skips this store's own wake-ups)."""
        self._wakeups.notify(session_id, rows)

    @contextmanager
    def _inserting(self, session_id: str) -> Iterator[None]:
        """Around a write that may insert: if it ends without handing its rows
        over (an error or cancellation, maybe after the script ran), local
        feeds read instead."""
        try:
            yield
        except BaseException:
            self._wakeups.notify(session_id)
            raise

    # -- the Store protocol ------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append atomically in one script (see the module docstring); with
        ``claim``, the claimable events are written claimed; with
        ``expected_index``, only if the session is still at it.

        Cancellation: written entirely or not at all; retry with the same ids
        replays.
        """
        supplied = verdicts.supplied_ids(events) if events else []
        ids = [e.id or self._new_id() for e in events]
        now = self.clock.now_ms()
        holder, expires_at = ("", 0) if claim is None else (claim.holder, now + claim.ttl_ms)
        args: list[Any] = [
            session_id,
            now,
            self._origin,
            holder,
            expires_at,
            self._key(session_id, "notify"),
            self._global("pending"),
            len(events),
            len(supplied),
            "" if expected_index is None else expected_index,
            *supplied,
        ]
        entries = []
        for event, event_id in zip(events, ids, strict=True):
            entry = _entry(event, event_id, now, event.cause)
            entries.append(entry)
            cause = event.cause
            args += [
                event_id,
                entry,
                _lane_arg(event.lane),
                "1" if event.settled else "0",
                "" if cause is None else cause.index,
                "" if cause is None else cause.attempt,
            ]
        with _errors("append"), self._inserting(session_id):
            reply = await self._eval(lua.APPEND, self._write_keys(session_id), args)
        verdict = reply[0]
        if verdict == b"pending":
            return AppendResult([], bool(reply[1]))
        if verdict == b"replay":
            # The duplicate verdict before the fence, as in the seed.
            replayed = verdicts.replayed_batch(session_id, events, _stored(session_id, reply[3:]))
            return AppendResult(replayed, bool(reply[1]), [], bool(reply[2]))
        if verdict == b"missing":
            raise verdicts.no_event(session_id, int(reply[1]))
        if verdict == b"superseded":
            cause = events[int(reply[1]) - 1].cause
            assert cause is not None
            raise verdicts.superseded_attempt(session_id, cause)
        if verdict == b"stale":
            assert expected_index is not None
            raise verdicts.stale_index(session_id, expected_index, int(reply[1]))
        _, base, had_pending, others_claimable, claimed_indexes = reply
        claimed_set = {int(i) for i in claimed_indexes}
        inserted = []
        for ord_, (event, event_id) in enumerate(zip(events, ids, strict=True), 1):
            index = int(base) + ord_
            claimed = index in claimed_set
            inserted.append(
                StoredEvent(
                    id=event_id,
                    type=event.type,
                    payload=event.payload,
                    index=index,
                    session_id=session_id,
                    created_at_ms=now,
                    cause=event.cause,
                    lane=event.lane,
                    processed_at_ms=now if event.settled else None,
                    trace_context=event.trace_context,
                    first_claimed_at_ms=now if claimed else None,
                    last_claimed_at_ms=now if claimed else None,
                    attempt_count=1 if claimed else 0,
                    claim_holder=holder if claimed else None,
                    claim_expires_at_ms=expires_at if claimed else None,
                )
            )
        self._wrote(session_id, inserted)
        return AppendResult(
            inserted,
            verdicts.has_pending(bool(had_pending), events),
            [row for row in inserted if row.index in claimed_set],
            bool(others_claimable),
        )

    async def _read(
        self, session_id: str, after: int, through: int | None, *, watch: bool = False
    ) -> list[StoredEvent]:
        watch_ttl_ms = 0
        if watch and self._nursery is not None:
            now = time.monotonic()
            safety_s = self.timings.notify_safety_s
            if now - self._marked.get(session_id, -math.inf) >= safety_s:
                self._marked[session_id] = now
                watch_ttl_ms = int(safety_s * 3000)
        with _errors("read"):
            flat = await self._eval(
                lua.READ,
                [
                    self._key(session_id, "log"),
                    self._key(session_id, "meta"),
                    self._key(session_id, "watched"),
                ],
                [after, "+" if through is None else through, watch_ttl_ms],
            )
        return _rows(session_id, flat)

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """Events in ``(after_index, through_index]`` (``XRANGE``). Cancellation: a read."""
        after = max(0, after_index or 0)
        through = None if through_index is None else max(0, through_index)
        return await self._read(session_id, after, through)

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`: one ``HGET`` of the id index and the
        row, in one script. Cancellation: a read."""
        with _errors("read"):
            flat = await self._eval(
                lua.FIND,
                [*self._session_keys(session_id), self._global("ids")],
                [session_id, event_id],
            )
        rows = [row for row in _stored(session_id, flat) if row.session_id == session_id]
        return rows[0] if rows else None

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        """Claim the eligible set in one script (with ``limit``, at most that
        many, lowest indexes first).

        Cancellation: claimed or not; an orphaned claim expires and a later
        drain takes the next attempt.
        """
        with _errors("claim"):
            now = self.clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            reply = await self._eval(
                lua.CLAIM,
                self._session_keys(session_id),
                [now, holder, expires_at, -1 if limit is None else max(0, limit), *exclude],
            )
        if reply[0] == b"claimed":
            return Claimed(_rows(session_id, reply[1:]))
        if reply[0] == b"busy":
            return Busy(int(reply[1]))
        return Settled()

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`~a2trio.stores.base.SweepsClaimable.claimable_sessions`:
        a pass over the sessions with open events (``P:open-sessions``, by
        prefix), each checked by the ``SWEEP`` script, never the history.

        Cancellation: a read.
        """
        found: list[str] = []
        low = b"[" + prefix.encode()
        high = b"(" + prefix.encode() + b"\xff"
        with _errors("sweep"):
            while len(found) < limit:
                page = [
                    _text(sid)
                    for sid in await self._eval(
                        _LIST, [self._global("open-sessions")], [low, high, _SWEEP_PAGE]
                    )
                ]
                if not page:
                    break
                keys = [self._key(sid, s) for sid in page for s in ("open", "meta")]
                flags = await self._eval(lua.SWEEP, keys, [self.clock.now_ms()])
                found += [sid for sid, flag in zip(page, flags, strict=True) if flag]
                if len(page) < _SWEEP_PAGE:
                    break
                low = b"(" + page[-1].encode()
        return found[:limit]

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """Extend this holder's live claims in one script (the seed's ``renewClaims``).

        Cancellation: renewed or not; the heartbeat retries.
        """
        if not claims:
            await trio.lowlevel.checkpoint()
            return RenewResult([], [])
        with _errors("renew"):
            now = self.clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            pairs = [value for c in claims for value in (c.index, c.attempt)]
            renewed, superseded = await self._eval(
                lua.RENEW, self._session_keys(session_id), [now, holder, expires_at, *pairs]
            )
        return RenewResult(sorted(int(i) for i in renewed), sorted(int(i) for i in superseded))

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        """Mark processed, append the returned events, hand the lane on: one script.

        Cancellation: written entirely or not at all; a repeat by the same
        attempt with the same ids replays.
        """
        returned = verdicts.returned_ids(events)
        now = self.clock.now_ms()
        cause = EventCause(index, attempt)
        args: list[Any] = [
            session_id,
            index,
            attempt,
            now,
            self._origin,
            _encode(returned),
            self._key(session_id, "notify"),
            self._global("pending"),
            len(events),
        ]
        for event, event_id in zip(events, returned, strict=True):
            args += [
                event_id,
                _entry(event, event_id, now, cause),
                _lane_arg(event.lane),
                "1" if event.settled else "0",
            ]
        with _errors("complete"), self._inserting(session_id):
            reply = await self._eval(lua.COMPLETE, self._write_keys(session_id), args)
        outcome = reply[0]
        if outcome == b"missing":
            raise verdicts.no_event(session_id, index)
        if outcome == b"superseded":
            return CompleteResult("superseded")
        if outcome == b"duplicate":
            raise verdicts.returned_id_taken()
        if outcome == b"replay":
            processed_by, returned_json = reply[1], reply[2]
            previous = None if returned_json is None else _decode_ids(returned_json)
            by_attempt = None if processed_by is None else int(processed_by)
            if not verdicts.replays_completion(attempt, returned, by_attempt, previous):
                return CompleteResult("superseded")
            stored = _stored(session_id, reply[3:])
            replayed = verdicts.replayed_completion(session_id, index, attempt, events, stored)
            return CompleteResult("completed", replayed)
        _, base, drained = reply
        inserted = [
            StoredEvent(
                id=event_id,
                type=event.type,
                payload=event.payload,
                index=int(base) + ord_,
                session_id=session_id,
                created_at_ms=now,
                cause=cause,
                lane=event.lane,
                processed_at_ms=now if event.settled else None,
                trace_context=event.trace_context,
            )
            for ord_, (event, event_id) in enumerate(zip(events, returned, strict=True), 1)
        ]
        if inserted:
            self._wrote(session_id, inserted)
        return CompleteResult("completed", inserted, bool(drained))

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
    ) -> FailResult:
        """Record a failure: ``rules.fail_verdict`` over the row as read,
        written back by a compare-and-set script (retried if the row moved).

        Cancellation: recorded or not; a repeat by the same attempt is idempotent.
        """
        meta_key = self._key(session_id, "meta")
        with _errors("fail"):
            for _ in range(_CAS_ROUNDS):
                front, raw = await self._eval(
                    lua.FAIL_READ, self._session_keys(session_id), [index]
                )
                if not 1 <= index <= int(front):
                    raise verdicts.no_event(session_id, index)
                row = _SETTLED if raw is None else _decode_meta(raw)
                verdict = verdicts.fail_verdict(row, attempt, max_failures)
                if not verdict.record:
                    return verdict.result
                now = self.clock.now_ms()
                dead = verdict.result.outcome == "dead_lettered"
                failed = msgspec.structs.replace(
                    row,
                    f=verdict.result.failure_count,
                    e=error,
                    lf=now,
                    la=attempt,
                    d=now if dead else row.d,
                    h=None,
                    x=None,
                )
                written = await self._eval(
                    lua.FAIL_WRITE,
                    [meta_key, self._key(session_id, "open"), self._key(session_id, "head")],
                    [index, raw, _encode_meta(failed), "1" if dead else "0"],
                )
                if written:
                    return verdict.result
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, "fail failed: the event's row kept changing under it"
        )

    # -- operator actions (OperatorActions) ------------------------------------

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: a pass over the sessions
        with open events (dead letters stay open), reading only those whose
        head counts a dead letter. Cancellation: a read."""
        found: list[StoredEvent] = []
        start = prefix if after is None else after[0]
        low = b"[" + start.encode()
        high = b"(" + prefix.encode() + b"\xff"
        with _errors("dead letters"):
            while len(found) < limit:
                page = [
                    _text(sid)
                    for sid in await self._eval(
                        _LIST, [self._global("open-sessions")], [low, high, _SWEEP_PAGE]
                    )
                ]
                if not page:
                    break
                keys = [k for sid in page for k in self._session_keys(sid)]
                flats = await self._eval(lua.DEAD_LETTERS, keys, [])
                for sid, flat in zip(page, flats, strict=True):
                    found += [
                        row for row in _rows(sid, flat) if after is None or (sid, row.index) > after
                    ]
                if len(page) < _SWEEP_PAGE:
                    break
                low = b"(" + page[-1].encode()
        return found[:limit]

    def _record_keys(self, session_id: str) -> list[str]:
        return [self._key(session_id, "actions"), self._global("pending:watched")]

    async def _act(
        self, action: Literal["redrive", "skip"], session_id: str, index: int, by: str, reason: str
    ) -> OperatorAction:
        with _errors(action):
            for _ in range(_CAS_ROUNDS):
                front, raw = await self._eval(
                    lua.FAIL_READ, self._session_keys(session_id), [index]
                )
                now = self.clock.now_ms()
                row = (
                    None
                    if not 1 <= index <= int(front)
                    else _SETTLED
                    if raw is None
                    else _decode_meta(raw)
                )
                verdicts.check_action(action, session_id, index, row, now)
                assert row is not None
                if action == "redrive":
                    changed = msgspec.structs.replace(row, f=0, d=None)
                else:
                    changed = msgspec.structs.replace(row, p=now, d=None, h=None, x=None)
                record = _Action(action, index, by, reason, now)
                written = await self._eval(
                    lua.ACTION_WRITE,
                    [
                        self._key(session_id, "meta"),
                        self._key(session_id, "open"),
                        self._key(session_id, "head"),
                        self._global("open-sessions"),
                        *self._record_keys(session_id),
                    ],
                    [
                        index,
                        raw,
                        _encode_meta(changed),
                        "1" if row.d is not None else "0",
                        "1" if action == "skip" else "0",
                        _encode_meta(record),
                        session_id,
                        self._global("pending"),
                        self._origin,
                    ],
                )
                if written:
                    return OperatorAction(action, session_id, index, by, reason, now)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{action} failed: the event's row kept changing under it"
        )

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`: the verdict over the row as
        read, written back, recorded and announced by one compare-and-set
        script. Cancellation: recorded or not."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`: as :meth:`redrive`; leaving the
        open set hands the lane on. Cancellation: recorded or not."""
        return await self._act("skip", session_id, index, by, reason)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`: recorded and announced on
        the pending channel, so other processes' drains claim at once.
        Cancellation: recorded or not."""
        with _errors("retry now"):
            flat = await self._eval(lua.RETRY_CANDIDATES, self._session_keys(session_id), [])
            now = self.clock.now_ms()
            candidates = [
                (int(flat[i]), None if flat[i + 1] is None else int(flat[i + 1]))
                for i in range(0, len(flat), 2)
            ]
            targets = verdicts.retry_targets(session_id, candidates, now)
            records = [_Action("retry_now", i, by, reason, now) for i in targets]
            await self._eval(
                lua.RECORD_ACTIONS,
                self._record_keys(session_id),
                [
                    self._global("pending"),
                    f"{self._origin} {session_id}",
                    *(_encode_meta(r) for r in records),
                ],
            )
        return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`: the session's list (its
        actions are few). Cancellation: a read."""
        with _errors("read actions"):
            raws = await self._eval(_LRANGE, [self._key(session_id, "actions")], [])
        actions = [_decode_action(raw) for raw in raws]
        return sorted(
            (
                OperatorAction(a.action, session_id, a.index, a.by, a.reason, a.at_ms)
                for a in actions
                if after_index < a.index <= through_index
            ),
            key=lambda a: a.index,
        )

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """The snapshot and the events after it, in one script. Cancellation: a read."""
        [state] = await self.read_states([session_id], reducer)
        return state

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """:meth:`read_state` for many sessions in one script. Cancellation: a read."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        keys = [self._key(sid, s) for sid in session_ids for s in ("snap", "log", "meta")]
        with _errors("read state"):
            flat = await self._eval(lua.READ_STATES, keys, [reducer])
        states = []
        for n, sid in enumerate(session_ids):
            snap, rows = flat[2 * n], flat[2 * n + 1]
            snapshot = None
            if snap is not None:
                index, _, state = snap.split(b":", 2)
                snapshot = Snapshot(int(index), _decode(state))
            states.append(StateRead(snapshot, _rows(sid, rows)))
        return states

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """The guarded write: never moves a snapshot backwards.

        Cancellation: written or not; rewriting is harmless.
        """
        with _errors("put snapshot"):
            await self._eval(
                lua.PUT_SNAPSHOT,
                [self._key(session_id, "snap")],
                [reducer, index, self.clock.now_ms(), _encode(state)],
            )

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        """A live feed: subscribe, catch up, then follow wake-ups (see the
        module docstring). Outside ``async with store`` it polls adaptively."""
        return self._open_feed(session_id, start_after)

    @asynccontextmanager
    async def _open_feed(
        self, session_id: str, start_after: int
    ) -> AsyncIterator[Feed[StoredEvent]]:
        channel = self._channel(session_id, "notify")
        first = True

        async def read_after(cursor: int) -> list[StoredEvent]:
            nonlocal first
            if self._closed:
                raise A2Error(ErrorCode.STORE_UNAVAILABLE, "read failed: the store was closed")
            if first and self._nursery is not None:
                # Subscribe before the first read: anything written after it
                # wakes the pump, so nothing slips between catch-up and park.
                first = False
                with trio.move_on_after(_SUBSCRIBE_WAIT_S):
                    await self._ready_event(channel).wait()
            # Ride out a short outage (a restart): read again until Redis is
            # back, so the feed resumes from its cursor instead of failing.
            deadline = trio.current_time() + _FEED_OUTAGE_S
            while True:
                try:
                    return await self._read(session_id, cursor, None, watch=True)
                except A2Error as exc:
                    if (
                        exc.code is not ErrorCode.STORE_UNAVAILABLE
                        or self._closed
                        or self._nursery is None
                        or trio.current_time() >= deadline
                    ):
                        raise
                await trio.sleep(_FEED_RETRY_S)

        self._acquire(channel, "notify", session_id)
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
            self._release(channel)
            if channel not in self._refs:
                self._marked.pop(session_id, None)

    def _feed_poll(self) -> Callable[[bool], float]:
        """How long a feed waits before re-reading on its own: the safety
        interval while a subscriber serves the store (it wakes every feed when
        it reconnects), the adaptive cadence outside ``async with store``."""
        adaptive = adaptive_poll(self.timings)

        def poll(active: bool) -> float:
            if self._nursery is not None:
                adaptive(True)
                return self.timings.notify_safety_s
            return adaptive(active)

        return poll


def redis(
    url: str,
    key_prefix: str = "a2",
    clock: Clock | None = None,
    ids: IdSource | None = None,
    *,
    timings: Timings = DEFAULT_TIMINGS,
    connect_timeout_s: float = 5.0,
    command_timeout_s: float | None = 10.0,
) -> RedisStore:
    """Create a Redis store. Does no I/O: connections open inside ``async with
    store`` (or per operation outside it).

    Args:
      url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS)
        or ``unix:///path.sock``. A single instance or a non-cluster
        provider: cluster mode is out (the scripts span keys).
      key_prefix: every key and channel starts with ``<key_prefix>:``, so
        several apps (or test runs) share one Redis. No colon in it.
      clock: where every stored timestamp comes from (default: system time).
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`). The store's instance id, which tags
        its wake-ups so it skips its own echoes, is always random.
      timings: ``notify_safety_s`` sets the safety re-read and the watched
        marker's TTL (three times it); ``poll_active_s``/``poll_idle_s`` the
        polling cadence outside ``async with store``.
      connect_timeout_s: each connection attempt fails after this long, as
        ``STORE_UNAVAILABLE``.
      command_timeout_s: a reply that takes longer is ``STORE_UNAVAILABLE``
        (the command may still have run: retrying with the same ids replays).

    Raises:
      ValueError: a URL of another scheme, or a key prefix with a colon.
    """
    return RedisStore(
        url,
        key_prefix=key_prefix,
        clock=clock,
        ids=ids,
        timings=timings,
        connect_timeout_s=connect_timeout_s,
        command_timeout_s=command_timeout_s,
    )
