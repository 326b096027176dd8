"""The Postgres store: the production path, shared by any number of processes.

Theory of operation
-------------------

**Driver.** ``conn`` drives libpq through psycopg's public ``pq`` module
with Trio-native socket waits, and ``database`` sends each transaction as one
pipeline: ``begin; select pg_advisory_xact_lock(hashtext(session)); <work>;
commit`` is a single round trip. Statements are prepared once per connection. Connections
come from a small Trio pool; one is held only while its pipeline is in flight.

**Group commit.** Inside ``async with store:`` appends, claims and
completions go through the group commit (:mod:`a2trio.stores.group`, three
groups in flight, each run in one of its callers' tasks): the ones that
arrive while a transaction is in flight share the next one (one round trip,
one WAL flush), each statement still fenced on its own attempt and holder,
sessions locked in ascending order (``database.lock_order``). Outside it each
runs in its own transaction.

**Exactly once across processes.** The semantics are the seed's
``store-postgres.ts`` (``sql`` ports each statement and says where it
folded several into one; ``writes`` sends them):

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

**Errors.** Every module that runs a statement wraps it in
``conn.errors``, the store's one translation of the driver's failures.

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
feeds, presence subscribers and group commit; ``database`` holds its
share and its settings.

**Live feeds.** With ``listen=True``, while the store has a feed, a presence
subscriber or a pending watcher, it listens (``listener``) on the shared
listener, **one** connection serving every store and viewer of the process.
A notification only says *when* to read: the feed pump reads from its
cursor, and re-reads every ``notify_safety_s`` anyway. A lost listener wakes
every feed (catch-up from each cursor), and reconnects with backoff;
meanwhile, and always with ``listen=False``, feeds poll adaptively:
``poll_active_s`` while rows flow, doubling to ``poll_idle_s``. Behind a
transaction-mode pooler, where LISTEN does not work, ``listen_dsn`` names a
direct connection for the listener alone; queries still go through ``dsn``
(``pooler="transaction"`` also turns prepared statements off). Presence is
the push tier (``presence``): a write delivers its patch to local
subscribers as it applies, and other processes' subscribers hear it through
NOTIFY (the trigger stamps the writing store's id, so a store skips its own).

**The app's transaction.** ``transactions`` (``transaction``) holds one
pooled connection for an app's block, outside the group commit: its own
statements and its appends (the same statements, after the same lock)
commit together.

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

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Literal

import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...ids import IdSource, random_id
from ...timings import DEFAULT_TIMINGS, Timings
from .. import rules
from ..base import (
    AppendEvent,
    AppendResult,
    AppTransactions,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    FailResult,
    Journal,
    OperatorActions,
    ReleaseResult,
    RenewResult,
    Snapshot,
    StateRead,
    StoredEvent,
    SweepsClaimable,
    WatchesPending,
)
from ..feed import Feed, FeedStatistics, Wakeups, open_pump_feed
from ..group import GroupStatistics
from ..tasks import StoreTasks
from . import sql as sql
from .codec import encode, stored_event
from .conn import PgPool, errors
from .database import Database
from .inspection import PostgresInspection
from .journal import PostgresJournal
from .listener import ListenerStatistics, StoreListener
from .operator import PostgresOperator
from .presence import PostgresPresence
from .retention import PostgresRetention
from .transaction import PostgresTransactions
from .writes import PostgresWrites

__all__ = ["PostgresStore", "postgres"]

_MAX_INDEX = 2**63 - 1


def _index_of(event: StoredEvent) -> int:
    return event.index


class _PostgresSweep:
    """The sweep (``SweepsClaimable``) on the store's ``db``, stamped by its ``clock``."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: one statement over
        the partial index of dispatch-ready rows. Cancellation: a read."""
        with errors("sweep"):
            rows = await self._db.query(
                sql.CLAIMABLE_SESSIONS, (prefix, self._clock.now_ms(), limit)
            )
        return [str(session_id) for (session_id,) in rows]


class PostgresStore:
    """A :class:`~a2trio.stores.Store` on Postgres, with presence, inspection,
    the sweep, cross-process wake-ups and operator actions.

    Build it with :func:`postgres`. Attributes: ``dsn`` (the effective libpq
    conninfo, including the schema's ``search_path`` unless
    ``pooler="transaction"``: open your own connections with it), ``clock``,
    ``presence``, ``inspect``, ``sweep``, ``pending`` (the listener),
    ``operator``, ``transactions`` (the app's own, ``transaction``),
    ``journal``.
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
        self._db = Database(
            dsn,
            listen=listen,
            listen_dsn=listen_dsn,
            pooler=pooler,
            schema=schema,
            max_connections=max_connections,
            connect_timeout_s=connect_timeout_s,
            prepare=prepare,
        )
        self.dsn: str = self._db.dsn
        self.clock = clock
        self.listen = listen
        self.timings = timings
        self._schema = schema
        self._wakeups = Wakeups()
        self._tasks = StoreTasks("Postgres store")
        self._entered = 0
        self._listener = StoreListener(
            self._db,
            self._tasks,
            self._wakeups,
            enabled=listen,
            # The presence plane is made next: it subscribes through the listener.
            on_presence=lambda payload: self.presence.heard(payload),
        )
        self.presence: PostgresPresence = PostgresPresence(
            self._db, clock=clock, push=listen, subscribe=self._listener.subscribe
        )
        self.inspect: PostgresInspection = PostgresInspection(self._db)
        self._writes = PostgresWrites(
            self._db,
            self._tasks,
            self._wakeups,
            clock=clock,
            new_id=random_id if ids is None else ids,
        )
        self.sweep: SweepsClaimable = _PostgresSweep(self._db, clock)
        self.pending: WatchesPending = self._listener
        self.operator: OperatorActions = PostgresOperator(self._db, clock=clock)
        self.retention: PostgresRetention = PostgresRetention(self._db, clock=clock)
        self.journal: Journal = PostgresJournal(self._db, clock=clock)
        self.transactions: AppTransactions = PostgresTransactions(
            self._db, self._writes, self._wakeups
        )

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self._schema!r}, listen={self.listen})"

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> PostgresStore:
        """Open the store's task nursery (``tasks``: the listener) on the
        first entry; inside it writes are group-committed.

        Nested entries share it; the nursery closes with the outermost exit,
        which must happen in the task that entered first. No I/O happens here.

        Cancellation: opens no connection; if cancelled, nothing is left open.
        """
        if self._db.closed:
            raise trio.ClosedResourceError("this Postgres store was closed: create a new one")
        if self._entered == 0:
            await self._tasks.enter()
        self._entered += 1
        self._listener.join()
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
            self._listener.leaving()
            await self._tasks.exit()
            await self._listener.closed()
        finally:
            self._db.release()

    async def aclose(self) -> None:
        """Stop the listener, close the pool (if the store created it). Idempotent.

        Inside ``async with store`` it ends the store's tasks, never the block
        itself: the block goes on, and its next operation raises
        ``STORE_UNAVAILABLE``. The nursery ``__aenter__`` opened is left to the
        block's exit, so the block's own cancel scopes and feeds are not
        misnested.

        Cancellation: a checkpoint; the connections are closed either way.
        """
        self._db.close()
        self._listener.leaving()
        try:
            if self._tasks.entered:
                await self._tasks.close()
            else:
                await self._tasks.exit()
            await self._listener.closed()
        finally:
            self._db.release()
            self._wakeups.notify_all()
        await trio.lowlevel.checkpoint()

    @property
    def listening(self) -> bool:
        """Whether the listener is subscribed: feeds follow notifications."""
        return self._listener.listening

    async def wait_listening(self) -> None:
        """Wait until the listener is subscribed (readiness probes, tests).

        Subscribes while it waits, so it opens the listener if the store is
        entered and ``listen`` is on; with no feed or subscriber left after
        it, the listener closes again.

        Cancellation: a plain wait; the subscription is dropped.
        """
        await self._listener.wait_listening()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds and presence subscribers (leak checks in tests)."""
        stats = self._wakeups.statistics()
        return FeedStatistics(
            listeners=stats.listeners + self.presence.subscriber_count(), keys=stats.keys
        )

    def group_statistics(self) -> GroupStatistics:
        """How claims and completions were group-committed (tests, benchmarks)."""
        return self._writes.group_statistics()

    def listener_statistics(self) -> ListenerStatistics:
        """The event notifications the listener heard (tests, debugging)."""
        return self._listener.statistics()

    # -- the Store protocol (writes in ``writes``) ------------------------------

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
        return await self._writes.append(
            session_id, events, claim=claim, expected_index=expected_index
        )

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """Events in ``(after_index, through_index]``. Cancellation: a read."""
        after = max(0, after_index or 0)
        with errors("read"):
            rows = await self._db.query(
                sql.READ,
                (session_id, after, _MAX_INDEX if through_index is None else through_index),
            )
            await self.retention.check_read(session_id, after, through_index, rows)
        return [stored_event(row) for row in rows]

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`: one probe of the event id index.
        Cancellation: a read."""
        with errors("read"):
            rows = await self._db.query(sql.FIND_EVENT, (session_id, event_id))
        return stored_event(rows[0]) if rows else None

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
        return await self._writes.claim_available(
            session_id,
            holder=holder,
            ttl_ms=ttl_ms,
            expires_at_ms=expires_at_ms,
            exclude=exclude,
            limit=limit,
        )

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
        return await self._writes.renew_claims(
            session_id, holder=holder, claims=claims, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms
        )

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
        return await self._writes.complete_attempt(
            session_id, index=index, attempt=attempt, events=events
        )

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
        retry_after_ms: int | None = None,
    ) -> FailResult:
        """Record a failure in one statement (the seed's ``failAttempt``).

        Cancellation: recorded or not; a repeat by the same attempt is idempotent.
        """
        return await self._writes.fail_attempt(
            session_id, index, attempt, error, max_failures, retry_after_ms
        )

    async def release_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        delay_ms: int | None,
        wake_on: Sequence[str] = (),
        seen_through: int | None = None,
    ) -> ReleaseResult:
        """Give up the attempt's claim in one statement (issues 33, 34; see
        :meth:`Store.release_attempt`). Cancellation: released or not."""
        return await self._writes.release_attempt(
            session_id, index, attempt, delay_ms, wake_on, seen_through
        )

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """The snapshot and the events after it, one snapshot. Cancellation: a read."""
        [state] = await self.read_states([session_id], reducer)
        return state

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """:meth:`read_state` for many sessions in one statement. Cancellation: a read."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        with errors("read state"):
            rows = await self._db.query(sql.READ_STATES, (list(session_ids), reducer))
        snapshots: dict[str, Snapshot] = {}
        events: dict[str, list[StoredEvent]] = {}
        for row in rows:
            if row[0] == 0:
                snapshots[row[1]] = Snapshot(row[2], row[3])
            else:
                events.setdefault(row[1], []).append(stored_event(row, 4))
        states = [StateRead(snapshots.get(sid), events.get(sid, [])) for sid in session_ids]
        for sid, state in zip(session_ids, states, strict=True):
            after = 0 if state.snapshot is None else state.snapshot.index
            rules.check_read(sid, after, None, state.events[0].index if state.events else None)
        return states

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """The guarded upsert: never moves a snapshot backwards.

        Cancellation: written or not; rewriting is harmless.
        """
        with errors("put snapshot"):
            await self._db.query(
                sql.PUT_SNAPSHOT, (session_id, reducer, index, encode(state), self.clock.now_ms())
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

        release = self._listener.subscribe()
        try:
            async with open_pump_feed(
                session_id,
                read_after,
                _index_of,
                self._wakeups,
                start_after=start_after,
                poll=self._listener.feed_poll(self.timings),
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
