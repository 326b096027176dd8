"""The Postgres store: the production path, shared by any number of processes.

Theory of operation
-------------------

**Driver.** ``conn`` drives libpq through psycopg's public ``pq`` module
with Trio-native socket waits, and sends each transaction as one pipeline:
``begin; select pg_advisory_xact_lock(hashtext(session)); <work>; commit`` is
a single round trip. Statements are prepared once per connection. Connections
come from a small Trio pool; one is held only while its pipeline is in flight.

**Group commit.** Inside ``async with store:`` appends, claims and
completions go through ``group``: the ones that arrive while a
transaction is in flight share the next one (one round trip, one WAL flush),
each statement still fenced on its own attempt and holder. Outside it (no
nursery for the committers) each runs in its own transaction as before.

**Exactly once across processes.** The semantics are the seed's
``store-postgres.ts`` (``sql`` ports each statement and says where it
folded several into one):

* appends serialize per session on ``pg_advisory_xact_lock(hashtext(id))``,
  so index assignment never races; the lock is transaction-scoped and
  released by commit or rollback, even when a process dies;
* the duplicate check, the attempt-currency fence (the cause's parent row
  read ``for update``, so a concurrent claim cannot slip between the check and
  the insert) and the inserts are one statement after the lock;
* claims lock the materialized eligible set ``for update`` and bump
  ``attempt_count`` in one statement: two drains never claim the same attempt;
* completion takes the session lock *then* the parent row (the seed takes them
  the other way round; one order for every writer means no deadlock), replays
  a repeat by the same attempt, and hands the lane on in the same transaction.
  A completion that returns no events on an event without a lane skips the
  session lock: it writes only its own row, so it never queues behind the
  session's appends (``sql.LOCK_IF_LANED``).

**Cancellation.** A task cancelled while a pipeline is in flight never returns
its connection to the pool: the pool closes it and the server rolls back what
was not committed. A transaction that failed on the server is rolled back
before its connection is reused. So every operation committed entirely or not
at all, and retrying it with the same ids is safe (replay).

**Sharing.** Stores with matching settings in one Trio run share one pool
and one LISTEN connection (``shared``, the seed's sharing model): a pool
by its effective settings (or, passed in, by identity), the listener by its
conninfo, whatever the stores' schemas. Each store takes its share of the
pool at its first operation and gives it back at its last ``async with``
exit or ``aclose()``; the last one out closes it. The schema's DDL runs once
per revision per shared pool. Each store keeps its own clock, ids, origin,
feeds, presence subscribers and group committers.

**Live feeds.** With ``listen=True`` the schema gets transactional notify
triggers (``a2_events`` per inserted session, ``a2_presence`` per changed
field). ``async with store:`` opens the store's nursery; while the store has
a feed, a presence subscriber or a pending watcher, a task there subscribes
the store's channels to the shared listener, **one** connection serving every
store and viewer of the process (connections scale with processes, not
viewers). The listener's own task is a Trio system task: it must outlive
whichever store opened it, so no store's nursery can own it (see
``shared``); it closes when its last subscriber leaves and reopens on
demand. A notification only says *when* to read: the feed pump reads from
its cursor, and re-reads every ``notify_safety_s`` anyway. A lost listener
wakes every feed (catch-up from each cursor), and reconnects with backoff;
meanwhile, and always with ``listen=False``, feeds poll adaptively:
``poll_active_s`` while rows flow, doubling to ``poll_idle_s``. Behind a
transaction-mode pooler, where LISTEN does not work, ``listen_dsn`` names a
direct connection for the listener alone; queries still go through ``dsn``
(``pooler="transaction"`` also turns prepared statements off). Presence is
the push tier: a write delivers its patch to local subscribers as it applies,
and other processes' subscribers hear it through NOTIFY (the trigger stamps
the writing store's id, so a store skips its own).

**Lifecycle.** Construction does no I/O. The first operation creates the
schema under a transaction-scoped advisory lock, the seed's
``hashtext('a2:postgres:schema')`` (so processes, TypeScript ones included,
can start together); a failure is retried by the next operation. Connection
attempts time out after ``connect_timeout_s``, so an unreachable database is
``STORE_UNAVAILABLE`` with the cause, never a hang. Leaving the last ``async
with store:`` leaves the listener (waiting, if it was the last subscriber,
until its connection is closed) and gives the pool back; ``aclose()`` does
the same and refuses later use.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from functools import partial
from types import TracebackType
from typing import Any, Literal, NamedTuple, cast

import msgspec
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import A2Error, ErrorCode, store_unavailable
from ...ids import IdSource, random_id
from ...timings import DEFAULT_TIMINGS, Timings
from .. import rules as verdicts
from ..base import (
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
from . import sql as sql
from .conn import Param, PgError, PgPool, Preamble, Row, Statement
from .group import LOCKING, GroupCommitter, GroupStatistics, Kind, Request
from .shared import PoolLease, SharedListener, acquire_pool, listener

__all__ = ["ListenerStatistics", "PostgresStore", "postgres"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

_MAX_INDEX = 2**63 - 1
_GROUPED: dict[Kind, Statement] = {
    "complete": sql.COMPLETE,
    "append": sql.APPEND,
    "append_fresh": sql.APPEND_FRESH,
    "claim": sql.CLAIM,
}
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# unique_violation (a concurrent append of the same id in another session) and
# deadlock_detected: the transaction rolled back, so running it again is safe.
_RETRYABLE = frozenset({"23505", "40P01"})
#: How often a completion or a claim runs again while a row it locked was
#: updated under it (each time by a transaction that committed between its
#: snapshot and its lock: see ``FINISH`` and ``CLAIM``).
_STALE_TRIES = 5
_ATTEMPTS = 3
#: Compare-and-set rounds of an operator action before giving up (each loses
#: only to a concurrent write of the target's row).
_CAS_ROUNDS = 16
#: SQLSTATE classes that refuse the data itself (22: data exception, 54: a
#: program limit such as NOTIFY's payload): a retry fails the same way.
_REFUSED_DATA = ("22", "54")
_LISTENER_BACKOFF_S = (0.05, 2.0)
_KEEPALIVE = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


class ListenerStatistics(msgspec.Struct, frozen=True):
    """What the store's LISTEN connection heard on the events channel, over
    every connection it held: ``notifications`` in all, ``own`` of them this
    store's own writes (skipped: their rows were handed to local feeds).

    Notifications arrive in commit order, so once one is heard every earlier
    commit's has been counted (tests use a later write as the sentinel)."""

    notifications: int
    own: int


def _keepalive_for(given: dict[str, Any]) -> dict[str, str]:
    # A peer that vanishes mid-query (a partition, not a restart) is noticed
    # within ~30 s instead of the OS's two hours of keepalive.
    return {k: v for k, v in _KEEPALIVE.items() if k not in given}


def _with_keepalive(dsn: str) -> str:
    return make_conninfo(dsn, **_keepalive_for(conninfo_to_dict(dsn)))


_SESSION_SETTINGS = Statement(
    "select set_config('search_path', coalesce($1::text, current_setting('search_path')), true),"
    " set_config('plan_cache_mode', coalesce($2::text, current_setting('plan_cache_mode')), true)"
)


def _preamble(schema: str | None, options: str) -> Preamble:
    """What the startup options carry without a pooler (the schema's
    ``search_path``, generic plans), as transaction-local settings."""
    plans = None if "plan_cache_mode" in options else "force_generic_plan"
    return (_SESSION_SETTINGS, (None if schema is None else f'"{schema}"', plans))


def _check_pooler(pooler: str | None, *, listen: bool, listen_dsn: str | None) -> None:
    if pooler not in (None, "transaction"):
        raise ValueError(
            f"`pooler` must be None or 'transaction', got {pooler!r}"
            " (a session-mode pooler needs no option)"
        )
    if listen_dsn is not None and not listen:
        raise ValueError("`listen_dsn` is only used with `listen=True`: drop one of them")
    if pooler == "transaction" and listen and listen_dsn is None:
        raise ValueError(
            "LISTEN does not work through a transaction-mode pooler: pass"
            " `listen_dsn` (a direct connection to the same database) or `listen=False`"
        )


class _Hearing:
    """One subscription of a store to its shared listener (a fresh one per
    join, so a late unsubscribe never drops a newer one)."""

    def __init__(self, store: PostgresStore, channels: tuple[str, str]) -> None:
        self._store = store
        self.channels: tuple[str, ...] = channels

    def heard(self, channel: str, payload: str) -> None:
        self._store._heard(channel, payload)

    def listening(self, on: bool) -> None:
        self._store._listening_changed(on)


class _Presence(msgspec.Struct, frozen=True):
    """A presence notification, as the trigger writes it."""

    o: str | None
    ns: str
    p: str
    f: str
    v: Any
    s: int
    a: int


_decode_presence = msgspec.json.Decoder(_Presence).decode


def _refused_data(exc: Exception) -> bool:
    return isinstance(exc, PgError) and exc.sqlstate.startswith(_REFUSED_DATA)


def _errors(what: str) -> store_unavailable:
    """The Postgres store's one error translation (see ``store_unavailable``):
    data the server refuses for what it is is ``INVALID_PAYLOAD``; anything
    else, a lost connection, a timeout, a serialization failure, is
    ``STORE_UNAVAILABLE``."""
    return store_unavailable(what, permanent=_refused_data)


def _cause_json(cause: EventCause) -> dict[str, int]:
    # The seed's jsonb shape, so both frameworks read each other's rows.
    out = {"index": cause.index, "attempt": cause.attempt}
    if cause.batch_size is not None:
        out["batchSize"] = cause.batch_size
    return out


def _cause(raw: Any) -> EventCause | None:
    if raw is None:
        return None
    return EventCause(raw["index"], raw["attempt"], raw.get("batchSize"))


def _stored(row: Row, at: int = 0) -> StoredEvent:
    """A StoredEvent from ``EVENT_COLUMNS`` starting at ``row[at]``."""
    r = row[at:]
    return StoredEvent(
        id=r[0],
        type=r[1],
        payload=r[2],
        index=r[3],
        session_id=r[4],
        created_at_ms=r[5],
        cause=_cause(r[6]),
        lane=r[7],
        processed_at_ms=r[8],
        processed_by_attempt=r[9],
        returned_event_ids=r[10],
        first_claimed_at_ms=r[11],
        last_claimed_at_ms=r[12],
        attempt_count=r[13],
        failure_count=r[14],
        last_failed_at_ms=r[15],
        last_failed_attempt=r[16],
        last_error=r[17],
        failed_at_ms=r[18],
        claim_holder=r[19],
        claim_expires_at_ms=r[20],
        trace_context=r[21],
    )


def _check_fence(
    session_id: str,
    events: Sequence[AppendEvent],
    missing_parent: int | None,
    superseded: int | None,
) -> None:
    """Raise what ``APPEND``'s attempt fence refused: the least cause index with
    no parent, else the least whose attempt lost its parent."""
    if missing_parent is not None:
        raise verdicts.no_event(session_id, missing_parent)
    if superseded is not None:
        cause = next(e.cause for e in events if e.cause and e.cause.index == superseded)
        raise verdicts.superseded_attempt(session_id, cause)


def _index_of(event: StoredEvent) -> int:
    return event.index


class _Target(NamedTuple):
    """What an operator action's fence reads (``rules.ActionTarget``),
    in ``ACTION_TARGET``'s order."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None


class _PostgresPresence:
    """Presence rows (the seed's ``a2_presence``): LWW per field.

    The push tier needs the listener to hear other processes' writes; with
    ``listen=False`` this is the degraded tier (``push`` is False) and the
    server re-reads and diffs.
    """

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.push: bool = store.listen
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
        """Apply the fields in one transaction; deliver the patch locally.

        Cancellation: the write committed entirely or not at all; retrying
        with the same ``at_ms`` is idempotent (ties go to the incoming write).
        """
        if not values:
            await trio.lowlevel.checkpoint()
            return None
        store = self._store
        with _errors("presence set"):
            # Expiry anchors on the store's clock; `at` only orders writes.
            expires_at = store.clock.now_ms() + ttl_ms
            rows = await store._transaction(
                [
                    (sql.PRESENCE_ORIGIN, (store._origin, str(seen), str(at_ms))),
                    (
                        sql.PRESENCE_SET,
                        (session_id, participant, _encode(values), seen, at_ms, expires_at),
                    ),
                ],
                lock=None,
            )
        applied = {row[0] for row in rows[1]}
        if not applied:
            return None
        patch = StoredPresencePatch(
            participant, {f: v for f, v in values.items() if f in applied}, seen, at_ms
        )
        self.deliver(session_id, patch)
        return patch

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, expired ones swept, in one statement.

        Cancellation: a checkpoint; the sweep is idempotent.
        """
        with _errors("presence read"):
            rows = await self._store._query(
                sql.PRESENCE_READ, (session_id, self._store.clock.now_ms())
            )
        return [PresenceRow(*row) for row in rows]

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        subscribers = self._subscribers.setdefault(session_id, set())
        subscribers.add(on_patch)
        release = self._store._subscribe()

        def unsubscribe() -> None:
            release()
            subscribers.discard(on_patch)
            if not subscribers and self._subscribers.get(session_id) is subscribers:
                del self._subscribers[session_id]

        return unsubscribe

    def deliver(self, session_id: str, patch: StoredPresencePatch) -> None:
        for on_patch in list(self._subscribers.get(session_id, ())):
            on_patch(patch)

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())


class _PostgresInspection:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions by id (the seed's ``listSessions``). Cancellation: a read."""
        with _errors("list sessions"):
            rows = await self._store._query(sql.LIST_SESSIONS, (prefix, cursor, limit + 1))
        sessions = [SessionSummary(*row) for row in rows[:limit]]
        more = len(rows) > limit
        return SessionPage(sessions, sessions[-1].session_id if more and sessions else None)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """A page bounded by the frontier, read in one snapshot. Cancellation: a read."""
        with _errors("read events"):
            rows = await self._store._query(
                sql.READ_EVENTS, (session_id, after_index, through_index, limit)
            )
        events = [_stored(row, 1) for row in rows if row[1] is not None]
        return EventPage(events, rows[0][0])

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""
        with _errors("list snapshots"):
            rows = await self._store._query(sql.LIST_SNAPSHOTS, (session_id,))
        return [SnapshotInfo(*row) for row in rows]


class PostgresStore:
    """A :class:`~a2trio.stores.Store` on Postgres, with presence and inspection.

    Build it with :func:`postgres`. Attributes: ``dsn`` (the effective libpq
    conninfo, including the schema's ``search_path`` unless
    ``pooler="transaction"``: open your own connections with it), ``clock``,
    ``presence``, ``inspect``.
    """

    def __init__(
        self,
        dsn: str | PgPool,
        *,
        listen: bool = True,
        listen_dsn: str | None = None,
        pooler: Literal["transaction"] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        ids: IdSource | None = None,
        schema: str | None = None,
        max_connections: int = 10,
        connect_timeout_s: float = 5.0,
        prepare: bool | None = None,
        timings: Timings = DEFAULT_TIMINGS,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ValueError(
                f"schema {schema!r} must be a lowercase SQL identifier ([a-z_][a-z0-9_]*)"
            )
        _check_pooler(pooler, listen=listen, listen_dsn=listen_dsn)
        if prepare is None:
            # Transaction-mode poolers hand each transaction to any server
            # connection, where a statement prepared earlier may not exist.
            prepare = pooler != "transaction"
        if isinstance(dsn, PgPool):
            injected = dsn
            # Shared by identity; never closed here.
            self._pool_key: Hashable = injected
            self._make_pool: Callable[[], PgPool] = lambda: injected
            self._owns_pool = False
            listen_conninfo = injected.conninfo
            connect_timeout_s = injected.connect_timeout_s
        else:
            given = conninfo_to_dict(dsn)
            extra = _keepalive_for(given)
            # LISTEN needs none of the pool's options, so stores in other
            # schemas on the same server share the listener.
            listen_conninfo = make_conninfo(dsn, **extra)
            if pooler == "transaction":
                # The pooler refuses (or drops) startup `options`, and a
                # session setting would leak to its other clients: each
                # pipeline sets them for its own transaction instead.
                conninfo = make_conninfo(dsn, **extra)
                preamble: Preamble | None = _preamble(schema, str(given.get("options") or ""))
                dsn = conninfo
            else:
                if schema is not None:
                    # Keep the caller's options (e.g. -csynchronous_commit=off).
                    options = f"{given.get('options') or ''} -csearch_path={schema}"
                    extra["options"] = options.strip()
                dsn = make_conninfo(dsn, **extra)
                options = str(conninfo_to_dict(dsn).get("options") or "")
                if "plan_cache_mode" not in options:
                    # Every statement here is written to run well on a generic
                    # plan (tests/test_pg_plans.py). Left to choose, Postgres
                    # plans each one afresh for five runs per connection and
                    # keeps doing so when a custom plan looks cheaper (APPEND
                    # with no holder: ~1 ms of planning per append). Only the
                    # store's own connections get this; `dsn` stays as given.
                    options = f"{options} -cplan_cache_mode=force_generic_plan".strip()
                conninfo = make_conninfo(dsn, options=options)
                preamble = None
            # Matching settings share one pool (``shared``).
            self._pool_key = (conninfo, max_connections, connect_timeout_s, prepare, preamble)
            self._make_pool = partial(
                PgPool,
                conninfo,
                max_size=max_connections,
                connect_timeout_s=connect_timeout_s,
                prepare=prepare,
                preamble=preamble,
            )
            self._owns_pool = True
        self._listen_conninfo = (
            listen_conninfo if listen_dsn is None else _with_keepalive(listen_dsn)
        )
        self._connect_timeout_s = connect_timeout_s
        self.dsn: str = dsn if isinstance(dsn, str) else dsn.conninfo
        self.clock = clock
        self._new_id: IdSource = random_id if ids is None else ids
        self.listen = listen
        self.timings = timings
        self._schema = schema
        self._schema_script = sql.schema_sql(schema=schema, triggers=listen)
        self._channels: tuple[str, str] | None = None
        self._lease: PoolLease | None = None
        self._origin = random_id()
        self._wakeups = Wakeups()
        self._pending_watchers: set[Callable[[str], None]] = set()
        self._tasks = StoreTasks("Postgres store")
        self._entered = 0
        self._subscribers = 0
        self._join: trio.CancelScope | None = None
        self._listener: SharedListener | None = None
        self._listening = trio.Event()
        self._notifications = 0
        self._own_notifications = 0
        self._closed = False
        self.presence: _PostgresPresence = _PostgresPresence(self)
        self.inspect: _PostgresInspection = _PostgresInspection(self)
        self._groups = GroupCommitter(self._run_group)

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self._schema!r}, listen={self.listen})"

    @property
    def _nursery(self) -> trio.Nursery | None:
        """Where the store's tasks start: inside ``async with store``, until
        ``aclose()`` (or a task's failure) ends them."""
        return self._tasks.nursery

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> PostgresStore:
        """Open the store's task nursery (``tasks``: the listener, the
        committers) on the first entry.

        Nested entries share it; the nursery closes with the outermost exit,
        which must happen in the task that entered first. No I/O happens here.

        Cancellation: opens no connection; if cancelled, nothing is left open.
        """
        if self._closed:
            raise trio.ClosedResourceError("this Postgres store was closed: create a new one")
        if self._entered == 0:
            await self._tasks.enter()
        self._entered += 1
        self._join_listener()
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
        try:
            self._join = None
            await self._tasks.exit()
            await self._listener_closed()
        finally:
            self._release_pool()

    async def _listener_closed(self) -> None:
        """Once the store's tasks ended: if that left the shared listener
        without subscribers, wait until its connection is closed too."""
        shared, self._listener = self._listener, None
        if shared is not None and shared.idle:
            # Bounded: the listener's task closes its connection synchronously
            # once cancelled, at its next scheduling.
            with trio.CancelScope(shield=True):
                await shared.closed()

    def _release_pool(self) -> None:
        """Give back this store's share of the pool; the last one closes it."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    async def aclose(self) -> None:
        """Stop the listener, close the pool (if the store created it). Idempotent.

        Inside ``async with store`` it ends the store's tasks, never the block
        itself: the block goes on, and its next operation raises
        ``STORE_UNAVAILABLE``. The nursery ``__aenter__`` opened is left to the
        block's exit, so the block's own cancel scopes and feeds are not
        misnested.

        Cancellation: a checkpoint; the connections are closed either way.
        """
        self._closed = True
        self._join = None
        try:
            if self._tasks.entered:
                await self._tasks.close()
            else:
                await self._tasks.exit()
            await self._listener_closed()
        finally:
            self._release_pool()
            self._wakeups.notify_all()
        await trio.lowlevel.checkpoint()

    @property
    def listening(self) -> bool:
        """Whether the listener is subscribed: feeds follow notifications."""
        return self._listening.is_set()

    async def wait_listening(self) -> None:
        """Wait until the listener is subscribed (readiness probes, tests).

        Subscribes while it waits, so it opens the listener if the store is
        entered and ``listen`` is on; with no feed or subscriber left after
        it, the listener closes again.

        Cancellation: a plain wait; the subscription is dropped.
        """
        release = self._subscribe()
        try:
            await self._listening.wait()
        finally:
            release()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds and presence subscribers (leak checks in tests)."""
        stats = self._wakeups.statistics()
        return FeedStatistics(
            listeners=stats.listeners + self.presence.subscriber_count(), keys=stats.keys
        )

    async def _ready(self) -> PgPool:
        """The shared pool, taking this store's share of it on first use, and
        the schema created (once per revision and pool; a failure is retried
        by the next call)."""
        if self._closed:
            raise trio.ClosedResourceError("this Postgres store was closed: create a new one")
        lease = self._lease
        if lease is None:
            lease = self._lease = acquire_pool(
                self._pool_key, self._make_pool, owned=self._owns_pool
            )
        if self._channels is None:
            schema = await lease.schema(self._schema_script)
            self._channels = (f"{schema}.a2_events", f"{schema}.a2_presence")
        return lease.pool

    async def _query(self, statement: Statement, params: Sequence[Param]) -> list[Row]:
        pool = await self._ready()
        async with pool.connection() as conn:
            [rows] = await conn.run([(statement, params)])
        return rows

    async def _transaction(
        self,
        batch: Sequence[tuple[Statement, Sequence[Param]]],
        *,
        lock: str | None,
    ) -> list[list[Row]]:
        """``begin; [lock;] batch; commit`` in one round trip, retried after a
        deadlock or a unique violation (both roll back). Returns the batch's rows."""
        pool = await self._ready()
        head: list[tuple[Statement, Sequence[Param]]] = [(sql.BEGIN, ())]
        if lock is not None:
            head.append((sql.LOCK, (lock, self._origin)))
        for attempt in range(_ATTEMPTS):
            try:
                async with pool.connection() as conn:
                    rows = await conn.run([*head, *batch, (sql.COMMIT, ())])
                return rows[len(head) : len(head) + len(batch)]
            except PgError as exc:
                if exc.sqlstate not in _RETRYABLE or attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run_group(self, group: Sequence[Request]) -> list[list[Row]]:
        """One transaction for a group in lock order: each session's lock before
        its first writer, then its statements (see ``group``). A session's
        consecutive ``finish`` members on distinct events share one ``FINISH``
        statement, after the session's lock only if one of them has a lane
        (``LOCK_IF_LANED``); each member gets its own row back."""
        batch: list[tuple[Statement, Sequence[Param]]] = []
        answers: list[tuple[int, int | None]] = []  # (statement, row index filter)
        locked: str | None = None
        at = 0
        while at < len(group):
            request = group[at]
            if request.kind in LOCKING and request.session_id != locked:
                batch.append((sql.LOCK, (request.session_id, self._origin)))
                locked = request.session_id
            if request.kind != "finish":
                answers.append((len(batch), None))
                batch.append((_GROUPED[request.kind], request.params))
                at += 1
                continue
            members = [request]
            indexes = {request.params[1]}
            at += 1
            while (
                at < len(group)
                and group[at].kind == "finish"
                and group[at].session_id == request.session_id
                and group[at].params[1] not in indexes
            ):
                members.append(group[at])
                indexes.add(group[at].params[1])
                at += 1
            if request.session_id != locked:
                laned = sorted(cast(int, m.params[1]) for m in members)
                batch.append((sql.LOCK_IF_LANED, (request.session_id, laned)))
            for member in members:
                answers.append((len(batch), cast(int, member.params[1])))
            params = (
                request.session_id,
                [m.params[1] for m in members],
                [m.params[2] for m in members],
                request.params[3],
            )
            batch.append((sql.FINISH, cast(Sequence[Param], params)))
        rows = await self._transaction(batch, lock=None)
        return [
            rows[position] if index is None else [r for r in rows[position] if r[0] == index]
            for position, index in answers
        ]

    def group_statistics(self) -> GroupStatistics:
        """How claims and completions were group-committed (tests, benchmarks)."""
        return self._groups.statistics()

    def listener_statistics(self) -> ListenerStatistics:
        """The event notifications the listener heard (tests, debugging)."""
        return ListenerStatistics(self._notifications, self._own_notifications)

    # -- listener ----------------------------------------------------------

    def _subscribe(self) -> Callable[[], None]:
        """Count a local subscriber (a feed, a presence subscriber, a pending
        watcher); the first one joins the shared listener, the last one out
        leaves it. Returns the (idempotent) release."""
        self._subscribers += 1
        self._join_listener()
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

    def _join_listener(self) -> None:
        if self.listen and self._subscribers and self._join is None and self._nursery is not None:
            self._join = trio.CancelScope()
            self._nursery.start_soon(self._hear, self._join)

    async def _hear(self, scope: trio.CancelScope) -> None:
        """This store's subscription to the shared listener (``shared``),
        in the store's nursery: create the schema (its channel names), then
        subscribe until ``scope`` is cancelled (no local subscriber left, or
        the store's last exit)."""
        with scope:
            backoff = _LISTENER_BACKOFF_S[0]
            while True:
                try:
                    with _errors("listen"):
                        await self._ready()
                    break
                except Exception:
                    # Feeds poll meanwhile; the next try may find the server.
                    self._wakeups.notify_all()
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, _LISTENER_BACKOFF_S[1])
            assert self._channels is not None
            hearing = _Hearing(self, self._channels)
            shared = self._listener = listener(
                self._listen_conninfo, timeout_s=self._connect_timeout_s
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
        assert self._channels is not None
        if channel == self._channels[0]:
            self._notifications += 1
            origin, _, session_id = payload.partition(" ")
            if origin == self._origin:
                self._own_notifications += 1
            else:
                self._wakeups.notify(session_id)
                self._announce(session_id)
        else:
            self._deliver_remote(payload)

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(session_id)`` when another process appends to a session.

        The optional cross-process wake-up: a server with handlers passes its
        drain wake-up here, so work appended elsewhere starts at once instead of
        waiting for a watchdog. Notifications come through the shared listener
        (``listen=True``, inside ``async with store``); echoes of this store's
        own writes are filtered out. Returns the function that stops it.
        """
        self._pending_watchers.add(on_session)
        release = self._subscribe()

        def unwatch() -> None:
            self._pending_watchers.discard(on_session)
            release()

        return unwatch

    def _wrote(self, session_id: str, rows: list[StoredEvent]) -> None:
        """A local write committed: hand its rows to local feeds (the listener
        skips this store's own notifications)."""
        self._wakeups.notify(session_id, rows)

    @contextmanager
    def _inserting(self, session_id: str) -> Iterator[None]:
        """Around a write that may insert: if it ends without handing its rows
        over (an error or cancellation, maybe after the commit), local feeds
        read instead, as another process's notification would make them."""
        try:
            yield
        except BaseException:
            self._wakeups.notify(session_id)
            raise

    def _announce(self, session_id: str) -> None:
        for on_session in list(self._pending_watchers):
            on_session(session_id)

    def _deliver_remote(self, payload: str) -> None:
        try:
            note = _decode_presence(payload)
        except msgspec.DecodeError:
            return  # not a payload this version writes: nothing to deliver
        if note.o == self._origin:
            return
        self.presence.deliver(
            note.ns, StoredPresencePatch(note.p, {note.f: note.v}, note.s, note.a)
        )

    def _feed_poll(self) -> Callable[[bool], float]:
        """How long a feed waits before re-reading on its own: the safety
        interval while notifications flow, the adaptive cadence when not."""
        adaptive = adaptive_poll(self.timings)

        def poll(active: bool) -> float:
            if self._listening.is_set():
                adaptive(True)  # start over at the active cadence if it stops
                return self.timings.notify_safety_s
            return adaptive(active)

        return poll

    # -- the Store protocol ---------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append atomically, in one round trip (see the module docstring); with
        ``claim``, the claimable events are inserted claimed (``sql.APPEND``);
        with ``expected_index``, only if the session is still at it.

        Cancellation: committed entirely or not at all; retry with the same ids
        replays.
        """
        with _errors("append"):
            if not events:
                [(pending,)] = await self._query(sql.HAS_PENDING, (session_id,))
                return AppendResult([], pending)
            supplied = verdicts.supplied_ids(events)
            ids = [e.id or self._new_id() for e in events]
            batch = [
                {
                    "ord": ord_,
                    "id": event_id,
                    "type": e.type,
                    "payload": e.payload,
                    "cause": None if e.cause is None else _cause_json(e.cause),
                    "lane": e.lane,
                    "settled": e.settled,
                    "trace": e.trace_context,
                }
                for ord_, (e, event_id) in enumerate(zip(events, ids, strict=True), 1)
            ]
            causes = sorted({e.cause.index for e in events if e.cause is not None})
            now = self.clock.now_ms()
            holder, expires_at = (
                (None, None) if claim is None else (claim.holder, now + claim.ttl_ms)
            )
            # Nothing to replay, refuse or fence: the lean statement.
            fresh = not supplied and not causes and expected_index is None
            kind: Kind = "append_fresh" if fresh else "append"
            params: tuple[Param, ...] = (
                (session_id, _encode(batch), now, holder, expires_at)
                if fresh
                else (
                    session_id,
                    _encode(batch),
                    supplied,
                    causes,
                    now,
                    holder,
                    expires_at,
                    expected_index,
                )
            )
            with self._inserting(session_id):
                if self._nursery is None:
                    [rows] = await self._transaction([(_GROUPED[kind], params)], lock=session_id)
                else:
                    rows = await self._groups.submit(self._nursery, kind, session_id, params)
        if fresh:
            had_pending, base, claimed_indexes, others_claimable = rows[0]
        else:
            n_existing, missing_parent, superseded = rows[0][:3]
            had_pending, base, claimed_indexes, others_claimable = rows[0][3:7]
            if n_existing:
                # The duplicate verdict before the fence, as in the seed.
                replayed = verdicts.replayed_batch(
                    session_id, events, [_stored(r, 7) for r in rows]
                )
                return AppendResult(replayed, had_pending, [], others_claimable)
            _check_fence(session_id, events, missing_parent, superseded)
            if expected_index is not None and base != expected_index:
                raise verdicts.stale_index(session_id, expected_index, base)
        inserted = [
            StoredEvent(
                id=event_id,
                type=e.type,
                payload=e.payload,
                index=base + ord_,
                session_id=session_id,
                created_at_ms=now,
                cause=e.cause,
                lane=e.lane,
                processed_at_ms=now if e.settled else None,
                trace_context=e.trace_context,
            )
            for ord_, (e, event_id) in enumerate(zip(events, ids, strict=True), 1)
        ]
        claimed_set = set(claimed_indexes)
        if claimed_set:
            # As the statement stored them: claimed as they were written.
            inserted = [
                msgspec.structs.replace(
                    row,
                    attempt_count=1,
                    first_claimed_at_ms=now,
                    last_claimed_at_ms=now,
                    claim_holder=holder,
                    claim_expires_at_ms=expires_at,
                )
                if row.index in claimed_set
                else row
                for row in inserted
            ]
        self._wrote(session_id, inserted)
        return AppendResult(
            inserted,
            verdicts.has_pending(had_pending, events),
            [row for row in inserted if row.index in claimed_set],
            others_claimable,
        )

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """Events in ``(after_index, through_index]``. Cancellation: a read."""
        with _errors("read"):
            rows = await self._query(
                sql.READ,
                (
                    session_id,
                    max(0, after_index or 0),
                    _MAX_INDEX if through_index is None else through_index,
                ),
            )
        return [_stored(row) for row in rows]

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`: one probe of the event id index.
        Cancellation: a read."""
        with _errors("read"):
            rows = await self._query(sql.FIND_EVENT, (session_id, event_id))
        return _stored(rows[0]) if rows else None

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: one statement over
        the partial index of dispatch-ready rows. Cancellation: a read."""
        with _errors("sweep"):
            rows = await self._query(sql.CLAIMABLE_SESSIONS, (prefix, self.clock.now_ms(), limit))
        return [str(session_id) for (session_id,) in rows]

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
        """Claim the eligible set in one statement (see the module docstring).

        Cancellation: the claim committed or not; an orphaned claim expires and
        a later drain takes the next attempt.
        """
        for _ in range(_STALE_TRIES):
            with _errors("claim"):
                now = self.clock.now_ms()
                expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
                params = (session_id, now, holder, expires_at, list(exclude), limit)
                if self._nursery is None:
                    rows = await self._query(sql.CLAIM, params)
                else:
                    rows = await self._groups.submit(self._nursery, "claim", session_id, params)
            claimed = [_stored(row, 1) for row in rows if row[1] is not None]
            if claimed:
                # Rows missed as stale stay claimable for the drain's next claim.
                return Claimed(claimed)
            if not rows[0][-1]:
                break
        retry_at = rows[0][0]
        return Settled() if retry_at is None else Busy(retry_at)

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """Extend this holder's live claims (the seed's ``renewClaims``).

        Cancellation: renewed or not; the heartbeat retries.
        """
        if not claims:
            await trio.lowlevel.checkpoint()
            return RenewResult([], [])
        with _errors("renew"):
            now = self.clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            attempts = {c.index: c.attempt for c in claims}
            rows = await self._query(
                sql.RENEW,
                (
                    expires_at,
                    session_id,
                    [c.index for c in claims],
                    holder,
                    now,
                    [c.attempt for c in claims],
                ),
            )
        renewed = sorted(index for index, _, ok in rows if ok)
        superseded = sorted(
            index for index, count, ok in rows if not ok and count > attempts.get(index, 0)
        )
        return RenewResult(renewed, superseded)

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        """Mark processed, append the returned events, hand the lane on: one
        statement after the session lock, one round trip.

        Cancellation: committed entirely or not at all; a repeat by the same
        attempt with the same ids replays.
        """
        if not events:
            return await self._finish(session_id, index, attempt)
        returned = verdicts.returned_ids(events)
        batch = [
            {
                "ord": ord_,
                "id": e.id,
                "type": e.type,
                "payload": e.payload,
                "lane": e.lane,
                "settled": e.settled,
                "trace": e.trace_context,
            }
            for ord_, e in enumerate(events, 1)
        ]
        params = (
            session_id,
            index,
            returned,
            attempt,
            _encode(batch),
            self.clock.now_ms(),
            _encode(_cause_json(EventCause(index, attempt))),
            _encode(returned),
        )
        with _errors("complete"), self._inserting(session_id):
            if self._nursery is None:
                [rows] = await self._transaction([(sql.COMPLETE, params)], lock=session_id)
            else:
                rows = await self._groups.submit(self._nursery, "complete", session_id, params)
        outcome, processed_by_attempt, returned_event_ids, drained = rows[0][:4]
        stored = [_stored(row, 4) for row in rows if row[4] is not None]
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        if outcome == "superseded":
            return CompleteResult("superseded")
        if outcome == "duplicate":
            raise verdicts.returned_id_taken()
        if outcome == "replay":
            if not verdicts.replays_completion(
                attempt, returned, processed_by_attempt, returned_event_ids
            ):
                return CompleteResult("superseded")
            replayed = verdicts.replayed_completion(session_id, index, attempt, events, stored)
            return CompleteResult("completed", replayed)
        if stored:
            self._wrote(session_id, stored)
        return CompleteResult("completed", stored, drained)

    async def _finish(self, session_id: str, index: int, attempt: int) -> CompleteResult:
        """``complete_attempt`` without returned events, through ``FINISH``,
        again while its row answers ``stale`` (updated by another transaction
        after the statement's snapshot: see ``FINISH``)."""
        for _ in range(_STALE_TRIES):
            now = self.clock.now_ms()
            with _errors("complete"):
                if self._nursery is None:
                    [_, rows] = await self._transaction(
                        [
                            (sql.LOCK_IF_LANED, (session_id, [index])),
                            (sql.FINISH, (session_id, [index], [attempt], now)),
                        ],
                        lock=None,
                    )
                else:
                    params = (session_id, index, attempt, now)
                    rows = await self._groups.submit(self._nursery, "finish", session_id, params)
            [(_, outcome, processed_by_attempt, returned_event_ids, drained)] = rows
            if outcome != "stale":
                break
        else:
            with _errors("complete"):
                raise RuntimeError(f"event {index} was updated under {_STALE_TRIES} completions")
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        if outcome == "superseded":
            return CompleteResult("superseded")
        if outcome == "replay":
            if not verdicts.replays_completion(
                attempt, [], processed_by_attempt, returned_event_ids
            ):
                return CompleteResult("superseded")
            return CompleteResult("completed", [])
        return CompleteResult("completed", [], drained)

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
    ) -> FailResult:
        """Record a failure in one statement (the seed's ``failAttempt``).

        Cancellation: recorded or not; a repeat by the same attempt is idempotent.
        """
        with _errors("fail"):
            [(outcome, failure_count)] = await self._query(
                sql.FAIL, (session_id, index, attempt, error, max_failures, self.clock.now_ms())
            )
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        return FailResult(
            cast(Literal["failed", "dead_lettered", "superseded"], outcome), failure_count
        )

    # -- operator actions (OperatorActions) ------------------------------------

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: the partial index over
        dead rows. Cancellation: a read."""
        low, low_index = after if after is not None else (None, 0)
        with _errors("dead letters"):
            rows = await self._query(sql.DEAD_LETTERS, (prefix, low, low_index, limit))
        return [_stored(row) for row in rows]

    def _notice(self, session_id: str) -> tuple[str, str]:
        """The events channel and payload that wake other processes' drains."""
        assert self._channels is not None
        return self._channels[0], f"{self._origin} {session_id}"

    async def _act(
        self, action: Literal["redrive", "skip"], session_id: str, index: int, by: str, reason: str
    ) -> OperatorAction:
        statement = sql.REDRIVE if action == "redrive" else sql.SKIP
        with _errors(action):
            for _ in range(_CAS_ROUNDS):
                found = await self._query(sql.ACTION_TARGET, (session_id, index))
                now = self.clock.now_ms()
                row = None if not found else _Target(*found[0])
                verdicts.check_action(action, session_id, index, row, now)
                assert row is not None
                as_read = (
                    row.processed_at_ms,
                    row.failed_at_ms,
                    row.attempt_count,
                    row.claim_holder,
                    row.claim_expires_at_ms,
                )
                params = (session_id, index, *as_read, by, reason, now, *self._notice(session_id))
                [written] = await self._transaction([(statement, params)], lock=session_id)
                if written:
                    return OperatorAction(action, session_id, index, by, reason, now)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{action} failed: the event's row kept changing under it"
        )

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`: a compare-and-set on the row
        as read, recorded and announced in one transaction. Cancellation:
        committed entirely or not at all."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`: as :meth:`redrive`, under the
        session's append lock (the lane is handed on). Cancellation: all or
        nothing."""
        return await self._act("skip", session_id, index, by, reason)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`: recorded and announced
        (``NOTIFY``) in one transaction, so other processes' drains claim at
        once. Cancellation: all or nothing."""
        with _errors("retry now"):
            candidates = await self._query(sql.RETRY_CANDIDATES, (session_id,))
            now = self.clock.now_ms()
            targets = verdicts.retry_targets(session_id, [(i, x) for i, x in candidates], now)
            await self._transaction(
                [
                    (
                        sql.RETRY_NOW,
                        (session_id, targets, by, reason, now, *self._notice(session_id)),
                    )
                ],
                lock=None,
            )
        return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`. Cancellation: a read."""
        with _errors("read actions"):
            rows = await self._query(sql.READ_ACTIONS, (session_id, after_index, through_index))
        return [OperatorAction(*row) for row in rows]

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """The snapshot and the events after it, one snapshot. Cancellation: a read."""
        [state] = await self.read_states([session_id], reducer)
        return state

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """:meth:`read_state` for many sessions in one statement. Cancellation: a read."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        with _errors("read state"):
            rows = await self._query(sql.READ_STATES, (list(session_ids), reducer))
        snapshots: dict[str, Snapshot] = {}
        events: dict[str, list[StoredEvent]] = {}
        for row in rows:
            if row[0] == 0:
                snapshots[row[1]] = Snapshot(row[2], row[3])
            else:
                events.setdefault(row[1], []).append(_stored(row, 4))
        return [StateRead(snapshots.get(sid), events.get(sid, [])) for sid in session_ids]

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """The guarded upsert: never moves a snapshot backwards.

        Cancellation: written or not; rewriting is harmless.
        """
        with _errors("put snapshot"):
            await self._query(
                sql.PUT_SNAPSHOT, (session_id, reducer, index, _encode(state), self.clock.now_ms())
            )

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        """A live feed: catch up, then follow on notifications (or polling).
        While it is open it subscribes to the shared listener."""
        return self._open_feed(session_id, start_after)

    @asynccontextmanager
    async def _open_feed(
        self, session_id: str, start_after: int
    ) -> AsyncIterator[Feed[StoredEvent]]:
        async def read_after(cursor: int) -> list[StoredEvent]:
            return await self.read(session_id, after_index=cursor)

        release = self._subscribe()
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
            release()


def postgres(
    dsn: str | PgPool,
    *,
    listen: bool = True,
    listen_dsn: str | None = None,
    pooler: Literal["transaction"] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    ids: IdSource | None = None,
    schema: str | None = None,
    max_connections: int = 10,
    connect_timeout_s: float = 5.0,
    prepare: bool | None = None,
    timings: Timings = DEFAULT_TIMINGS,
) -> PostgresStore:
    """Create a Postgres store. Does no I/O: the pool and schema open lazily.

    Args:
      dsn: a libpq URL or conninfo string, or a :class:`PgPool` you own (the
        store then never closes it; stores given the same pool share it).
        Stores with matching settings in one Trio run share one pool and one
        listener (``docs/stores-postgres.md``, "Sharing").
      listen: LISTEN/NOTIFY live feeds and presence push. Off, feeds poll
        adaptively.
      listen_dsn: where the one LISTEN connection connects (a direct
        connection to the same database) when ``dsn`` goes through a pooler;
        every query still goes through ``dsn``. Default: ``dsn``.
      pooler: ``"transaction"`` when ``dsn`` goes through a transaction-mode
        pooler (PgBouncer ``pool_mode=transaction``, Supabase's port 6543,
        Neon's ``-pooler`` endpoint, RDS Proxy): no startup ``options`` are
        sent (the pooler refuses them; each pipeline sets the schema's
        ``search_path`` for its transaction), prepared statements default to
        off, and listening needs ``listen_dsn`` (or ``listen=False``). A
        session-mode pooler needs nothing. The mode cannot be detected
        reliably from the client, so say it.
      clock: where every stored timestamp comes from.
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`). The store's instance id, which tags
        its notifications so it skips its own echoes, is always random.
      schema: keep the tables in this schema (created if missing), e.g. one
        per test run or per tenant.
      max_connections: pool bound (the listener's connection is extra),
        shared by the stores that share the pool.
      connect_timeout_s: each connection attempt fails after this long, as
        ``STORE_UNAVAILABLE``.
      prepare: named prepared statements. Default: on, except with
        ``pooler="transaction"`` (pass ``True`` for a pooler that tracks them
        per client, e.g. PgBouncer 1.21+ with ``max_prepared_statements``).
      timings: ``poll_active_s``, ``poll_idle_s`` and ``notify_safety_s``
        set the feed cadences.

    Raises:
      ValueError: a schema name that is not a plain lowercase identifier; an
        unknown ``pooler``; ``listen_dsn`` with ``listen=False``;
        ``pooler="transaction"`` with ``listen=True`` and no ``listen_dsn``.
    """
    return PostgresStore(
        dsn,
        listen=listen,
        listen_dsn=listen_dsn,
        pooler=pooler,
        clock=clock,
        ids=ids,
        schema=schema,
        max_connections=max_connections,
        connect_timeout_s=connect_timeout_s,
        prepare=prepare,
        timings=timings,
    )
