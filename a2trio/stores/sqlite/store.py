"""The SQLite store: the embedded default for development, on stdlib ``sqlite3``.

Theory of operation. Every operation is one transaction (or, for writes
queued together, one savepoint of a group commit) with the seed's
``store-postgres.ts`` statements and boundaries, written for SQLite: writes
open with ``BEGIN IMMEDIATE``, which takes the file's single write lock up
front. That lock does the work of Postgres' ``pg_advisory_xact_lock`` and
``FOR UPDATE``: index assignment, the duplicate-id check and the attempt fence
all read and write under it, so several OS processes can share one file (WAL
mode lets their readers run beside the writer). Writes run on the writer's
thread (:mod:`.writer`), reads whole in a worker thread (:mod:`.conn`): Trio
never waits on the disk and a cancelled task never leaves a transaction
open. Timestamps are read from the injected clock on the Trio side, before
the thread call: a ``Clock`` need not work from a thread.

Verdicts (issue 31). SQLite runs in process, so a decision inside a
statement saves no round trip: the transactions read a row's bookkeeping by
key and decide with :mod:`a2trio.stores.rules` in Python, as the memory store
does, then write (the renewal, completion and failure verdicts, the attempt
and operator fences, whether a settled row hands its lane on, and the claim
of appended rows with their lane readiness). What stays SQL, one fragment per
rule in :mod:`.sql`: the predicates that select rows through a partial index
(what a claim takes, whether one would take anything, what a sweep finds),
and the decisions a read into Python measurably costs more than the
statement (an unclaimed row's lane readiness, the lane's next event, the
``drained`` hint, a claim's ``Busy`` or ``Settled``).

Index-bounded statements (issue 17). No statement on the append, claim or
completion path reads a session's history: each seeks an index by its key and
stops after the rows it needs, so an append costs the same at 60,000 events
as at 1,000 and holds the write lock no longer. The session's last index is
the end of the ``(session_id, idx)`` key (``order by idx desc limit 1``);
"pending", "claimable" and "first in its lane" read the partial indexes that
hold only live rows, which a long history never enters. SQLite's planner,
without ``ANALYZE`` statistics, prefers the primary key's ``session_id``
prefix (a walk of the whole session) to those indexes, so the statements name
them with ``INDEXED BY``: SQLite's way to pin a plan, which fails loudly
rather than silently scanning if an index ever goes missing.
``tests/test_sqlite_plans.py`` counts the virtual-machine steps of each
operation at two session lengths and requires them equal.

Live feeds. A commit that adds events notifies this store's feeds at once.
Appends by other processes are found by adaptive polling: ``poll_active_s``
(25 ms) after a read found rows, doubling on every empty read up to
``poll_idle_s`` (2 s).

Where the rest lives. This module holds the store, its event, claim,
outcome and state transactions, and the sweep (``store.sweep``); presence
(the degraded tier) is :mod:`.presence`, the app's own transaction
:mod:`.transaction`, the read-only views :mod:`.inspection`, the operator
actions :mod:`.operator`, retention :mod:`.retention`, every statement and
the decoding of its rows :mod:`.sql`, the one translation of sqlite3
failures, with the transactions it wraps, :mod:`.conn`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Final

import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...ids import IdSource, random_id
from ...timings import DEFAULT_TIMINGS, Timings
from .. import rules as verdicts
from ..base import (
    AppendEvent,
    AppendResult,
    AppTransactions,
    Busy,
    Claimed,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    EventCause,
    FailResult,
    Journal,
    OperatorActions,
    ReleaseResult,
    RenewResult,
    Retention,
    Settled,
    Snapshot,
    StateRead,
    StoredEvent,
    SweepsClaimable,
    WatchesPending,
)
from ..feed import Feed, FeedStatistics, Wakeups, adaptive_poll, open_pump_feed
from . import sql
from .conn import ConnectionPool, Transactions
from .flow import claim_keyed
from .inspection import SqliteInspection
from .journal import SqliteJournal
from .operator import SqliteOperator
from .presence import SqlitePresence
from .retention import SqliteRetention, checked
from .transaction import SqliteTransactions

__all__ = ["DEFAULT_PATH", "SqliteStore", "sqlite"]

#: Where the development default lives, relative to the working directory.
DEFAULT_PATH: Final = ".a2/dev.db"


def _append_rows(
    conn: sqlite3.Connection,
    session_id: str,
    events: Sequence[AppendEvent],
    supplied: Sequence[str],
    claim: ClaimRequest | None,
    now: int,
    ids: Sequence[str] | None = None,
    expected_index: int | None = None,
) -> tuple[AppendResult, bool]:
    """The append transaction's statements; whether it wrote, beside the result.

    ``ids`` are the events' ids, the generated ones included: the store draws
    them in Trio, so its id source never runs in a worker thread (default:
    supplied or :func:`~a2trio.ids.random_id`)."""
    existing = sql.rows_by_ids(conn, supplied)
    if existing:
        return AppendResult(
            verdicts.replayed_batch(session_id, events, existing),
            sql.has_pending(conn, session_id),
            [],
            claim is not None and sql.claimable(conn, session_id, now),
        ), False
    # Attempt-currency fence (store-postgres.ts `append`): the write
    # lock held since BEGIN IMMEDIATE stands in for `for update`.
    for event in events:
        if event.cause is not None:
            parent = conn.execute(sql.READ_BOOKKEEPING, (session_id, event.cause.index)).fetchone()
            verdicts.check_cause(
                session_id, event.cause, None if parent is None else sql.Bookkeeping(*parent)
            )
    top, had_pending, waiting = conn.execute(sql.TOP_AND_PENDING, (session_id,)).fetchone()
    if expected_index is not None and top != expected_index:
        raise verdicts.stale_index(session_id, expected_index, top)
    base = top + 1
    others_claimable = claim is not None and sql.claimable(conn, session_id, now)
    if ids is None:
        ids = [e.id or random_id() for e in events]
    # Claimed as they are written, when `claim` asks: a claim in the same transaction.
    inserted = [
        sql.insert(conn, session_id, base + i, e, event_id, e.cause, now, claim)
        for i, (e, event_id) in enumerate(zip(events, ids, strict=True))
    ]
    if waiting:
        sql.wake(conn, session_id, [e.type for e in events])
    return AppendResult(
        inserted,
        verdicts.has_pending(bool(had_pending), events),
        [row for row in inserted if row.claim_holder is not None],
        others_claimable,
    ), True


def _claim_rows(
    conn: sqlite3.Connection,
    session_id: str,
    now: int,
    holder: str,
    expires_at: int,
    exclude: Sequence[int],
    limit: int | None,
) -> ClaimResult:
    """The claim transaction's statements (keyed rows: ``flow.claim_keyed``)."""
    if conn.execute(sql.KEYED, (session_id, now)).fetchone()[0]:
        return claim_keyed(conn, session_id, now, holder, expires_at, exclude, limit)
    rows = conn.execute(
        sql.CLAIM,
        (session_id, now, holder, expires_at, sql.text(list(exclude)), limit or sql.NO_LIMIT),
    ).fetchall()
    if rows:
        return Claimed(sorted((sql.stored(r) for r in rows), key=sql.index_of))
    (retry_at,) = conn.execute(sql.RETRY_AT, (session_id, now)).fetchone()
    return Settled() if retry_at is None else Busy(retry_at)


def _complete_rows(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    attempt: int,
    events: Sequence[AppendEvent],
    returned_ids: list[str],
    now: int,
) -> tuple[CompleteResult, bool]:
    """The completion transaction's statements; whether it wrote, beside the result."""
    found = conn.execute(sql.COMPLETION_TARGET, (session_id, index)).fetchone()
    if found is None:
        raise verdicts.no_event(session_id, index)
    parent = sql.completion(found)
    verdict = verdicts.complete_verdict(parent, attempt, returned_ids)
    if verdict == "superseded":
        return CompleteResult("superseded"), False
    if verdict == "replay":
        committed = verdicts.replayed_completion(
            session_id, index, attempt, events, sql.rows_by_ids(conn, returned_ids)
        )
        return CompleteResult("completed", committed), False
    if sql.rows_by_ids(conn, returned_ids):
        raise verdicts.returned_id_taken()
    base, waiting = conn.execute(sql.NEXT_AND_WAITING, (session_id,)).fetchone()
    # The trigger first: a returned event never debounces it.
    conn.execute(sql.COMPLETE, (now, attempt, sql.text(returned_ids), session_id, index))
    sql.hand_on(conn, session_id, parent)
    inserted = [
        sql.insert(conn, session_id, base + i, e, returned_ids[i], EventCause(index, attempt), now)
        for i, e in enumerate(events)
    ]
    if waiting and events:
        sql.wake(conn, session_id, [e.type for e in events])
    return CompleteResult("completed", inserted, sql.drained(conn, session_id)), bool(inserted)


class _SqliteSweep:
    """The sweep (``SweepsClaimable``) on the store's ``transactions``,
    stamped by its ``clock``."""

    def __init__(self, transactions: Transactions, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: a range of the
        partial index over dispatch-ready rows, never the history.

        Cancellation: a read; nothing to undo.
        """
        now = self._clock.now_ms()
        end = sql.prefix_end(prefix)

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(sql.CLAIMABLE_SESSIONS, (prefix, end, now, limit)).fetchall()
            return [str(session_id) for (session_id,) in rows]

        return await self._transactions.read("sweep", work)


class SqliteStore:
    """A :class:`~a2trio.stores.Store` in one SQLite file, with presence
    (degraded tier), inspection, the sweep, operator actions, retention and
    the app's own transaction (``transactions``; no cross-process wake-up:
    other processes' sweeps find the work). Build it with :func:`sqlite`.

    Attributes:
      path: the resolved database path (absolute), or ``":memory:"``. A
        durable scheduler can open the same file.
      clock: where stored timestamps come from.
    """

    def __init__(
        self, path: str, *, clock: Clock, timings: Timings, ids: IdSource | None = None
    ) -> None:
        self.path = path if path == ":memory:" else os.path.abspath(path)
        self.clock = clock
        self._new_id: IdSource = random_id if ids is None else ids
        self.timings = timings
        self._pool = ConnectionPool(self.path)
        self.group_statistics = self._pool.group_statistics  # the writer's batches
        self._transactions = Transactions(self._pool)
        self._wakeups = Wakeups()
        self._users = 0
        self.presence: SqlitePresence = SqlitePresence(self._transactions, clock)
        self.inspect: SqliteInspection = SqliteInspection(self._transactions)
        self.sweep: SweepsClaimable = _SqliteSweep(self._transactions, clock)
        self.pending: WatchesPending | None = None
        self.operator: OperatorActions = SqliteOperator(self._transactions, clock)
        self.retention: Retention = SqliteRetention(self._transactions, clock)
        self.journal: Journal = SqliteJournal(self._transactions, clock)
        self.transactions: AppTransactions = SqliteTransactions(
            self._pool, self._wakeups, _append_rows, clock, self._new_id
        )

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    async def __aenter__(self) -> SqliteStore:
        self._users += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._users -= 1
        if self._users == 0:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connections. Idempotent. A file store reopens on its next
        use (the data is in the file); a ``:memory:`` store's data is gone, and
        its later use raises ``trio.ClosedResourceError``.

        Cancellation: shielded; the connections are always closed.
        """
        await self._pool.aclose()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds following this store (leak checks in tests)."""
        return self._wakeups.statistics()

    # -- events ----------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """See :meth:`Store.append`: the seed's ``append``, one ``BEGIN IMMEDIATE``
        (the ``claim`` and the ``expected_index`` check too, when asked).

        Cancellation: committed entirely or not at all; retrying with the
        same ids replays.
        """
        if not events:

            def pending(conn: sqlite3.Connection) -> AppendResult:
                return AppendResult([], sql.has_pending(conn, session_id))

            return await self._transactions.read("append", pending)
        supplied = verdicts.supplied_ids(events)
        ids = [e.id or self._new_id() for e in events]
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[AppendResult, bool]:
            return _append_rows(conn, session_id, events, supplied, claim, now, ids, expected_index)

        appended, wrote = await self._transactions.write("append", work)
        if wrote:
            self._wakeups.notify(session_id, appended.events)
        return appended

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """See :meth:`Store.read`. Cancellation: a read; nothing to undo."""

        def work(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(sql.READ, (session_id, after_index or 0, through_index)).fetchall()
            return checked(conn, session_id, after_index or 0, through_index, rows)

        return await self._transactions.read("read", work)

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`. Cancellation: a read; nothing to undo."""

        def work(conn: sqlite3.Connection) -> StoredEvent | None:
            rows = sql.rows_by_ids(conn, [event_id])
            return rows[0] if rows and rows[0].session_id == session_id else None

        return await self._transactions.read("read", work)

    # -- claims ----------------------------------------------------------

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
        """See :meth:`Store.claim_available` (the seed's ``claimAvailable``).

        Cancellation: committed entirely (the claims hold until they expire)
        or not at all.
        """

        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> ClaimResult:
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            return _claim_rows(conn, session_id, now, holder, expires_at, exclude, limit)

        return await self._transactions.write("claim", work)

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """See :meth:`Store.renew_claims` (the seed's ``renewClaims``).

        Cancellation: committed entirely or not at all; renewing again is safe.
        """
        if not claims:
            await trio.lowlevel.checkpoint()
            return RenewResult([], [])

        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> RenewResult:
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            renewed: list[int] = []
            superseded: list[int] = []
            for claim in claims:
                found = conn.execute(sql.TARGET, (session_id, claim.index)).fetchone()
                row = None if found is None else sql.target(found)
                verdict = verdicts.renew_verdict(row, claim.attempt, holder, now)
                if verdict == "renewed":
                    conn.execute(sql.RENEW, (expires_at, session_id, claim.index))
                    renewed.append(claim.index)
                elif verdict == "superseded":
                    superseded.append(claim.index)
            return RenewResult(sorted(renewed), sorted(superseded))

        return await self._transactions.write("renew", work)

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        """See :meth:`Store.complete_attempt` (the seed's ``completeAttempt``).

        Cancellation: committed entirely or not at all; a retry by the same
        attempt with the same ids replays.
        """
        returned_ids = verdicts.returned_ids(events)
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[CompleteResult, bool]:
            return _complete_rows(conn, session_id, index, attempt, events, returned_ids, now)

        completed, wrote = await self._transactions.write("complete", work)
        if wrote:
            self._wakeups.notify(session_id, completed.events)
        return completed

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
        """See :meth:`Store.fail_attempt` (the seed's ``failAttempt``).

        Cancellation: committed entirely or not at all; a repeat by the same
        attempt reports the recorded outcome.
        """

        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> FailResult:
            row = conn.execute(sql.READ_BOOKKEEPING, (session_id, index)).fetchone()
            if row is None:
                raise verdicts.no_event(session_id, index)
            verdict = verdicts.fail_verdict(sql.Bookkeeping(*row), attempt, max_failures)
            if not verdict.record:
                return verdict.result
            failures = verdict.result.failure_count
            dead = verdict.result.outcome == "dead_lettered"
            retry_at = None if dead or retry_after_ms is None else now + retry_after_ms
            dead_at = now if dead else None
            sql.fail(conn, session_id, index, attempt, error, now, failures, dead_at, retry_at)
            return FailResult(verdict.result.outcome, failures, retry_at)

        return await self._transactions.write("fail", work)

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
        """See :meth:`Store.release_attempt`. Cancellation: committed entirely
        or not at all; a repeat is ``superseded`` (the claim is gone)."""
        now = self.clock.now_ms()
        not_before = verdicts.NEVER_MS if delay_ms is None else now + delay_ms

        def work(conn: sqlite3.Connection) -> ReleaseResult:
            row = conn.execute(sql.READ_BOOKKEEPING, (session_id, index)).fetchone()
            if row is None:
                raise verdicts.no_event(session_id, index)
            if verdicts.release_verdict(sql.Bookkeeping(*row), attempt) == "superseded":
                return ReleaseResult("superseded")
            at = sql.release(conn, session_id, index, not_before, now, wake_on, seen_through)
            return ReleaseResult("released", at)

        return await self._transactions.write("release", work)

    # -- state -----------------------------------------------------------

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """See :meth:`Store.read_state`: snapshot and tail in one read
        transaction (one snapshot). Cancellation: a read; nothing to undo."""
        return await self._transactions.read(
            "read_state", lambda conn: _state_read(conn, session_id, reducer)
        )

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """See :meth:`Store.read_states`; all sessions in one read transaction.
        Cancellation: a read; nothing to undo."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        ids = list(session_ids)

        def work(conn: sqlite3.Connection) -> list[StateRead]:
            return [_state_read(conn, sid, reducer) for sid in ids]

        return await self._transactions.read("read_states", work)

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """See :meth:`Store.put_snapshot`: a guarded upsert that never moves a
        snapshot backwards. Cancellation: written entirely or not at all."""
        encoded = sql.text(state)
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(sql.PUT_SNAPSHOT, (session_id, reducer, index, encoded, now))

        await self._transactions.write("put_snapshot", work)

    # -- feeds -----------------------------------------------------------

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        """A live feed after ``start_after``; see the module docstring for the
        cadence. Closing the block cancels its pump."""

        async def read_after(cursor: int) -> list[StoredEvent]:
            return await self.read(session_id, after_index=cursor)

        return open_pump_feed(
            session_id,
            read_after,
            sql.index_of,
            self._wakeups,
            start_after=start_after,
            poll=adaptive_poll(self.timings),
        )


def _state_read(conn: sqlite3.Connection, session_id: str, reducer: str) -> StateRead:
    snap = conn.execute(sql.READ_SNAPSHOT, (session_id, reducer)).fetchone()
    snapshot = None if snap is None else Snapshot(snap[0], sql.decode(snap[1]))
    after = 0 if snapshot is None else snapshot.index
    rows = conn.execute(sql.READ_TAIL, (session_id, after)).fetchall()
    return StateRead(snapshot, checked(conn, session_id, after, None, rows))


def sqlite(
    path: str = DEFAULT_PATH,
    *,
    clock: Clock = SYSTEM_CLOCK,
    ids: IdSource | None = None,
    timings: Timings = DEFAULT_TIMINGS,
) -> SqliteStore:
    """Create a SQLite store. Does no I/O: the folder, file and schema are
    created on first use.

    Args:
      path: a file path (its folder is created), or ``":memory:"`` for a
        private in-process database.
      clock: where stored timestamps come from (``TrioClock`` in tests).
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`).
      timings: ``poll_active_s`` and ``poll_idle_s`` set the cadence at which
        feeds look for other processes' appends.
    """
    if not isinstance(path, str) or not path:
        raise TypeError(f"sqlite path must be a non-empty string, got {path!r}")
    return SqliteStore(path, clock=clock, timings=timings, ids=ids)
