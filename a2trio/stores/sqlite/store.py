"""The SQLite store: the embedded default for development, on stdlib ``sqlite3``.

Theory of operation. Every operation is one transaction with the seed's
``store-postgres.ts`` statements and boundaries, written for SQLite: writes
open with ``BEGIN IMMEDIATE``, which takes the file's single write lock up
front. That lock does the work of Postgres' ``pg_advisory_xact_lock`` and
``FOR UPDATE``: index assignment, the duplicate-id check and the attempt fence
all read and write under it, so several OS processes can share one file (WAL
mode lets their readers run beside the writer). Each transaction runs whole in
a worker thread (:mod:`._sqlite_conn`), so Trio never waits on the disk and a
cancelled task never leaves a transaction open. Timestamps are read from the
injected clock on the Trio side, before the thread call, as the seed reads
``clock.now()`` before its query: a ``Clock`` need not work from a thread.

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

Presence is the degraded tier: rows with a TTL on the store's clock, re-read
and diffed by the server on the feed's cadence (``presence.push`` is False and
``subscribe`` never calls back).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, TypeVar

import msgspec
import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import store_unavailable
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
from .conn import ConnectionPool

__all__ = ["DEFAULT_PATH", "SqliteStore", "sqlite"]

T = TypeVar("T")

#: Where the development default lives, relative to the working directory.
DEFAULT_PATH: Final = ".a2/dev.db"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_decode_cause = msgspec.json.Decoder(EventCause).decode
_decode_ids = msgspec.json.Decoder(list[str]).decode

# The columns of a StoredEvent, in its field order.
_COLS: Final = (
    "event_id, event_type, payload, idx, session_id, created_at, cause, lane, processed_at, "
    "processed_by_attempt, returned_event_ids, first_claimed_at, last_claimed_at, "
    "attempt_count, failure_count, last_failed_at, last_failed_attempt, last_error, "
    "failed_at, claim_holder, claim_expires_at, trace_context"
)

_INSERT: Final = """
insert into a2_events
  (session_id, idx, event_type, payload, event_id, created_at, cause, lane, lane_ready,
   processed_at, trace_context)
values (
  ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
  ?8 is null or not exists (
    select 1 from a2_events indexed by a2_events_lane_pending
    where session_id = ?1 and lane = ?8 and processed_at is null
  ),
  ?9, ?10
)
"""

#: Events after ``?2`` through ``?3`` (None: the end). The upper bound is one
#: the key range stops at, where ``(?3 is null or idx <= ?3)`` would walk on
#: to the session's end.
_READ: Final = f"""
select {_COLS} from a2_events
where session_id = ?1 and idx > ?2 and idx <= coalesce(?3, {2**63 - 1})
order by idx
"""

#: The session's last index, off the end of its primary key: a seek, where
#: ``max(idx)`` beside other columns walks the whole session.
_TOP: Final = "select idx from a2_events where session_id = ?1 order by idx desc limit 1"

#: Whether any row of the session is unprocessed: the first entry of the
#: partial index that holds only those.
_ANY_PENDING: Final = """exists(
  select 1 from a2_events indexed by a2_events_unprocessed
  where session_id = ?1 and processed_at is null
)"""

_PENDING: Final = f"select {_ANY_PENDING}"

_NEXT_INDEX: Final = f"select coalesce(({_TOP}), 0) + 1"

#: Both at once, as the seed's `maxRows` query.
_TOP_AND_PENDING: Final = f"select coalesce(({_TOP}), 0), {_ANY_PENDING}"

#: Whether a claim would take any event now: the live, ready rows only.
_CLAIMABLE: Final = """
select exists(
  select 1 from a2_events indexed by a2_events_dispatch_ready
  where session_id = ?1 and lane_ready and processed_at is null and failed_at is null
    and (claim_expires_at is null or claim_expires_at <= ?2)
)
"""

#: The seed's `claimAvailable` update, over the ready rows only.
_CLAIM: Final = f"""
update a2_events indexed by a2_events_dispatch_ready set
  attempt_count = attempt_count + 1,
  first_claimed_at = coalesce(first_claimed_at, ?2),
  last_claimed_at = ?2,
  claim_holder = ?3,
  claim_expires_at = ?4
where session_id = ?1
  and processed_at is null
  and failed_at is null
  and lane_ready
  and (claim_expires_at is null or claim_expires_at <= ?2)
  and idx not in (select value from json_each(?5))
  and idx <= coalesce((
    select idx from a2_events indexed by a2_events_dispatch_ready
    where session_id = ?1 and lane_ready and processed_at is null and failed_at is null
      and (claim_expires_at is null or claim_expires_at <= ?2)
      and idx not in (select value from json_each(?5))
    order by idx limit 1 offset ?6 - 1
  ), idx)
returning {_COLS}
"""

#: An offset past any session's end: "no limit" for the claim's bound lookup.
_NO_LIMIT: Final = 2**62

#: When the earliest live claim lapses (nothing claimable now).
_RETRY_AT: Final = """
select min(claim_expires_at) from a2_events indexed by a2_events_dispatch_ready
where session_id = ?1 and processed_at is null and failed_at is null
  and lane_ready and claim_expires_at > ?2
"""

#: Readies the first unprocessed event of a lane whose head was completed.
_READY_LANE: Final = """
update a2_events set lane_ready = 1
where session_id = ?1 and idx = (
  select idx from a2_events indexed by a2_events_lane_pending
  where session_id = ?1 and lane = ?2 and processed_at is null
  order by idx limit 1
)
"""

# Sessions with work a claim would take now (`claimable_sessions`). The index
# holds only dispatch-ready rows, so the cost is the pending work; a failed
# row waits out `rules.retry_backoff_ms`, spelled here in SQL.
_CLAIMABLE_SESSIONS = """
    select distinct session_id from a2_events indexed by a2_events_dispatch_ready
    where lane_ready and processed_at is null and failed_at is null
      and session_id >= ? and session_id < ?
      and (claim_expires_at is null or claim_expires_at <= ?)
      and (failure_count = 0
           or last_failed_at + min(1000 << min(failure_count - 1, 6), 60000) <= ?)
    order by session_id limit ?
"""


def _errors(what: str) -> store_unavailable:
    """The SQLite store's one error translation (see ``store_unavailable``):
    data SQLite refuses for what it is (``sqlite3.DataError``: a string or blob
    over its limits) is ``INVALID_PAYLOAD``; anything else, a locked or full
    database, an I/O error, is ``STORE_UNAVAILABLE``."""
    return store_unavailable(f"sqlite {what}", permanent=_refused_data)


def _refused_data(exc: Exception) -> bool:
    return isinstance(exc, sqlite3.DataError)


def _prefix_end(prefix: str) -> str:
    """The least string above every string starting with ``prefix`` (binary
    order, as SQLite compares text)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


# What the attempt fences read (`rules.Bookkeeping`), in `_Bookkeeping` order.
_BOOKKEEPING: Final = (
    "processed_at, failed_at, attempt_count, claim_holder, failure_count, last_failed_attempt"
)


class _Bookkeeping(NamedTuple):
    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None


class _Target(NamedTuple):
    """What an operator action's fence reads (``rules.ActionTarget``)."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None
    lane: str | None
    lane_ready: int


_RECORD_ACTION: Final = """
insert into a2_operator_actions (session_id, idx, action, actor, reason, at)
values (?, ?, ?, ?, ?, ?)
"""


def _text(value: Any) -> str:
    return _encode(value).decode()


def _stored(row: tuple[Any, ...]) -> StoredEvent:
    fields = list(row)
    fields[2] = _decode(fields[2])
    if fields[6] is not None:
        fields[6] = _decode_cause(fields[6])
    if fields[10] is not None:
        fields[10] = _decode_ids(fields[10])
    return StoredEvent(*fields)


def _claimable(conn: sqlite3.Connection, session_id: str, now: int) -> bool:
    """Whether a claim would take any of the session's events now."""
    (found,) = conn.execute(_CLAIMABLE, (session_id, now)).fetchone()
    return bool(found)


def _claim_range(
    conn: sqlite3.Connection, session_id: str, first: int, last: int, now: int, claim: ClaimRequest
) -> list[StoredEvent]:
    """Claim the just-written events in ``[first, last]`` that are claimable."""
    rows = conn.execute(
        f"""
        update a2_events set
          attempt_count = 1, first_claimed_at = ?4, last_claimed_at = ?4,
          claim_holder = ?5, claim_expires_at = ?6
        where session_id = ?1 and idx between ?2 and ?3
          and lane_ready and processed_at is null
        returning {_COLS}
        """,
        (session_id, first, last, now, claim.holder, now + claim.ttl_ms),
    ).fetchall()
    return sorted((_stored(r) for r in rows), key=_index_of)


def _has_pending(conn: sqlite3.Connection, session_id: str) -> bool:
    return bool(conn.execute(_PENDING, (session_id,)).fetchone()[0])


def _rows_by_ids(conn: sqlite3.Connection, ids: Sequence[str]) -> list[StoredEvent]:
    if not ids:
        return []  # no query for the common batch, which supplies none
    rows = conn.execute(
        f"select {_COLS} from a2_events where event_id in (select value from json_each(?)) "
        "order by idx",
        (_text(list(ids)),),
    ).fetchall()
    return [_stored(row) for row in rows]


def _insert(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    event: AppendEvent,
    event_id: str,
    cause: EventCause | None,
    now: int,
) -> StoredEvent:
    processed_at = now if event.settled else None
    conn.execute(
        _INSERT,
        (
            session_id,
            index,
            event.type,
            _text(event.payload),
            event_id,
            now,
            None if cause is None else _text(cause),
            event.lane,
            processed_at,
            event.trace_context,
        ),
    )
    return StoredEvent(
        id=event_id,
        type=event.type,
        payload=event.payload,
        index=index,
        session_id=session_id,
        created_at_ms=now,
        cause=cause,
        lane=event.lane,
        processed_at_ms=processed_at,
        trace_context=event.trace_context,
    )


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
    existing = _rows_by_ids(conn, supplied)
    if existing:
        return AppendResult(
            verdicts.replayed_batch(session_id, events, existing),
            _has_pending(conn, session_id),
            [],
            claim is not None and _claimable(conn, session_id, now),
        ), False
    # Attempt-currency fence (store-postgres.ts `append`): the write
    # lock held since BEGIN IMMEDIATE stands in for `for update`.
    for event in events:
        if event.cause is not None:
            parent = conn.execute(
                f"select {_BOOKKEEPING} from a2_events where session_id = ? and idx = ?",
                (session_id, event.cause.index),
            ).fetchone()
            verdicts.check_cause(
                session_id, event.cause, None if parent is None else _Bookkeeping(*parent)
            )
    top, had_pending = conn.execute(_TOP_AND_PENDING, (session_id,)).fetchone()
    if expected_index is not None and top != expected_index:
        raise verdicts.stale_index(session_id, expected_index, top)
    base = top + 1
    others_claimable = claim is not None and _claimable(conn, session_id, now)
    if ids is None:
        ids = [e.id or random_id() for e in events]
    inserted = [
        _insert(conn, session_id, base + i, e, event_id, e.cause, now)
        for i, (e, event_id) in enumerate(zip(events, ids, strict=True))
    ]
    claimed: list[StoredEvent] = []
    if claim is not None:
        # Claimed as they are written: a claim in the same transaction.
        claimed = _claim_range(conn, session_id, base, base + len(events) - 1, now, claim)
        by_index = {row.index: row for row in claimed}
        inserted = [by_index.get(row.index, row) for row in inserted]
    return AppendResult(
        inserted,
        verdicts.has_pending(bool(had_pending), events),
        claimed,
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
    """The claim transaction's statements. Without a limit the bound lookup
    finds no row (offset past the end) and every eligible row is claimed."""
    rows = conn.execute(
        _CLAIM,
        (session_id, now, holder, expires_at, _text(list(exclude)), limit or _NO_LIMIT),
    ).fetchall()
    if rows:
        return Claimed(sorted((_stored(r) for r in rows), key=_index_of))
    (retry_at,) = conn.execute(_RETRY_AT, (session_id, now)).fetchone()
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
    row = conn.execute(
        f"select {_BOOKKEEPING}, processed_by_attempt, returned_event_ids, lane "
        "from a2_events where session_id = ? and idx = ?",
        (session_id, index),
    ).fetchone()
    if row is None:
        raise verdicts.no_event(session_id, index)
    parent = _Bookkeeping(*row[:6])
    by_attempt, stored_ids, lane = row[6:]
    if parent.processed_at_ms is not None:
        stored = None if stored_ids is None else _decode_ids(stored_ids)
        if not verdicts.replays_completion(attempt, returned_ids, by_attempt, stored):
            return CompleteResult("superseded"), False
        committed = verdicts.replayed_completion(
            session_id, index, attempt, events, _rows_by_ids(conn, returned_ids)
        )
        return CompleteResult("completed", committed), False
    if not verdicts.holds_claim(parent, attempt):
        return CompleteResult("superseded"), False
    if _rows_by_ids(conn, returned_ids):
        raise verdicts.returned_id_taken()
    base = _next_index(conn, session_id)
    cause = EventCause(index, attempt)
    inserted = [
        _insert(conn, session_id, base + i, e, returned_ids[i], cause, now)
        for i, e in enumerate(events)
    ]
    conn.execute(
        """
        update a2_events set
          processed_at = ?, processed_by_attempt = ?, returned_event_ids = ?,
          lane_ready = 0, claim_holder = null, claim_expires_at = null
        where session_id = ? and idx = ?
        """,
        (now, attempt, _text(returned_ids), session_id, index),
    )
    if lane is not None:
        conn.execute(_READY_LANE, (session_id, lane))
    return CompleteResult("completed", inserted), bool(inserted)


def _next_index(conn: sqlite3.Connection, session_id: str) -> int:
    (following,) = conn.execute(_NEXT_INDEX, (session_id,)).fetchone()
    return int(following)


class SqliteStore:
    """A :class:`~a2trio.stores.Store` in one SQLite file, with presence
    (degraded tier) and inspection. Build it with :func:`sqlite`.

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
        self._wakeups = Wakeups()
        self._users = 0
        self.presence: _SqlitePresence = _SqlitePresence(self)
        self.inspect: _SqliteInspection = _SqliteInspection(self)

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

    async def _write(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        self._pool.check_open()
        with _errors(what):
            return await self._pool.write(work)

    async def _read(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        self._pool.check_open()
        with _errors(what):
            return await self._pool.read(work)

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
                return AppendResult([], _has_pending(conn, session_id))

            return await self._read("append", pending)
        supplied = verdicts.supplied_ids(events)
        ids = [e.id or self._new_id() for e in events]
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[AppendResult, bool]:
            return _append_rows(conn, session_id, events, supplied, claim, now, ids, expected_index)

        appended, wrote = await self._write("append", work)
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
            rows = conn.execute(_READ, (session_id, after_index or 0, through_index)).fetchall()
            return [_stored(row) for row in rows]

        return await self._read("read", work)

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`. Cancellation: a read; nothing to undo."""

        def work(conn: sqlite3.Connection) -> StoredEvent | None:
            rows = _rows_by_ids(conn, [event_id])
            return rows[0] if rows and rows[0].session_id == session_id else None

        return await self._read("read", work)

    # -- claims ----------------------------------------------------------

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: a range of the
        partial index over dispatch-ready rows, never the history.

        Cancellation: a read; nothing to undo.
        """
        now = self.clock.now_ms()
        end = _prefix_end(prefix)

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(_CLAIMABLE_SESSIONS, (prefix, end, now, now, limit)).fetchall()
            return [str(session_id) for (session_id,) in rows]

        return await self._read("sweep", work)

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

        return await self._write("claim", work)

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
                moved = conn.execute(
                    """
                    update a2_events set claim_expires_at = ?
                    where session_id = ? and idx = ? and attempt_count = ?
                      and processed_at is null and failed_at is null
                      and claim_holder = ? and claim_expires_at > ?
                    returning idx
                    """,
                    (expires_at, session_id, claim.index, claim.attempt, holder, now),
                ).fetchone()
                if moved is not None:
                    renewed.append(claim.index)
                    continue
                current = conn.execute(
                    "select attempt_count from a2_events where session_id = ? and idx = ?",
                    (session_id, claim.index),
                ).fetchone()
                if current is not None and current[0] > claim.attempt:
                    superseded.append(claim.index)
            return RenewResult(sorted(renewed), sorted(superseded))

        return await self._write("renew", work)

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

        completed, wrote = await self._write("complete", work)
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
    ) -> FailResult:
        """See :meth:`Store.fail_attempt` (the seed's ``failAttempt``).

        Cancellation: committed entirely or not at all; a repeat by the same
        attempt reports the recorded outcome.
        """

        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> FailResult:
            row = conn.execute(
                f"select {_BOOKKEEPING} from a2_events where session_id = ? and idx = ?",
                (session_id, index),
            ).fetchone()
            if row is None:
                raise verdicts.no_event(session_id, index)
            verdict = verdicts.fail_verdict(_Bookkeeping(*row), attempt, max_failures)
            if verdict.record:
                failures = verdict.result.failure_count
                dead = verdict.result.outcome == "dead_lettered"
                conn.execute(
                    """
                    update a2_events set
                      failure_count = ?, last_error = ?, last_failed_at = ?,
                      last_failed_attempt = ?, failed_at = ?,
                      claim_holder = null, claim_expires_at = null
                    where session_id = ? and idx = ?
                    """,
                    (
                        failures,
                        error,
                        now,
                        attempt,
                        now if dead else None,
                        session_id,
                        index,
                    ),
                )
            return verdict.result

        return await self._write("fail", work)

    # -- operator actions (OperatorActions) ----------------------------------

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: a range of the partial
        index over dead rows. Cancellation: a read."""
        low, low_index = after if after is not None else (prefix, 0)

        def work(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(
                f"""
                select {_COLS} from a2_events indexed by a2_events_dead_letters
                where failed_at is not null and session_id < ?3
                  and (session_id > ?1 or (session_id = ?1 and idx > ?2))
                order by session_id, idx limit ?4
                """,
                (low, low_index, _prefix_end(prefix), limit),
            ).fetchall()
            return [_stored(row) for row in rows]

        return await self._read("dead_letters", work)

    async def _act(
        self, action: Literal["redrive", "skip"], session_id: str, index: int, by: str, reason: str
    ) -> OperatorAction:
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> OperatorAction:
            found = conn.execute(
                f"select {_BOOKKEEPING}, claim_expires_at, lane, lane_ready from a2_events "
                "where session_id = ? and idx = ?",
                (session_id, index),
            ).fetchone()
            row = None if found is None else _Target(*found)
            verdicts.check_action(action, session_id, index, row, now)
            assert row is not None
            if action == "redrive":
                conn.execute(
                    "update a2_events set failure_count = 0, failed_at = null "
                    "where session_id = ? and idx = ?",
                    (session_id, index),
                )
            else:
                conn.execute(
                    """
                    update a2_events set processed_at = ?, failed_at = null, lane_ready = 0,
                      claim_holder = null, claim_expires_at = null
                    where session_id = ? and idx = ?
                    """,
                    (now, session_id, index),
                )
                if row.lane is not None and row.lane_ready:
                    conn.execute(_READY_LANE, (session_id, row.lane))
            conn.execute(_RECORD_ACTION, (session_id, index, action, by, reason, now))
            return OperatorAction(action, session_id, index, by, reason, now)

        return await self._write(action, work)

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`: one write transaction.
        Cancellation: committed entirely or not at all."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`: one write transaction, the lane
        handed on as a completion does. Cancellation: all or nothing."""
        return await self._act("skip", session_id, index, by, reason)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`. Other processes' sweeps
        find the events once their backoff ends. Cancellation: all or nothing."""
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> list[OperatorAction]:
            candidates = conn.execute(
                """
                select idx, claim_expires_at from a2_events indexed by a2_events_dispatch_ready
                where session_id = ? and lane_ready and processed_at is null
                  and failed_at is null
                order by idx
                """,
                (session_id,),
            ).fetchall()
            targets = verdicts.retry_targets(session_id, candidates, now)
            conn.executemany(
                _RECORD_ACTION,
                [(session_id, i, "retry_now", by, reason, now) for i in targets],
            )
            return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

        return await self._write("retry_now", work)

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> list[OperatorAction]:
            rows = conn.execute(
                "select action, session_id, idx, actor, reason, at from a2_operator_actions "
                "where session_id = ? and idx > ? and idx <= ? order by idx, id",
                (session_id, after_index, through_index),
            ).fetchall()
            return [OperatorAction(*row) for row in rows]

        return await self._read("read_actions", work)

    # -- state -----------------------------------------------------------

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """See :meth:`Store.read_state`: snapshot and tail in one read
        transaction (one snapshot). Cancellation: a read; nothing to undo."""
        return await self._read("read_state", lambda conn: _state_read(conn, session_id, reducer))

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """See :meth:`Store.read_states`; all sessions in one read transaction.
        Cancellation: a read; nothing to undo."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        ids = list(session_ids)

        def work(conn: sqlite3.Connection) -> list[StateRead]:
            return [_state_read(conn, sid, reducer) for sid in ids]

        return await self._read("read_states", work)

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """See :meth:`Store.put_snapshot`: a guarded upsert that never moves a
        snapshot backwards. Cancellation: written entirely or not at all."""
        encoded = _text(state)
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                """
                insert into a2_snapshots (session_id, reducer_name, up_to_index, state, updated_at)
                values (?, ?, ?, ?, ?)
                on conflict (session_id, reducer_name) do update set
                  up_to_index = excluded.up_to_index,
                  state = excluded.state,
                  updated_at = excluded.updated_at
                where excluded.up_to_index > a2_snapshots.up_to_index
                """,
                (session_id, reducer, index, encoded, now),
            )

        await self._write("put_snapshot", work)

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
            _index_of,
            self._wakeups,
            start_after=start_after,
            poll=adaptive_poll(self.timings),
        )


def _state_read(conn: sqlite3.Connection, session_id: str, reducer: str) -> StateRead:
    snap = conn.execute(
        "select up_to_index, state from a2_snapshots where session_id = ? and reducer_name = ?",
        (session_id, reducer),
    ).fetchone()
    snapshot = None if snap is None else Snapshot(snap[0], _decode(snap[1]))
    rows = conn.execute(
        f"select {_COLS} from a2_events where session_id = ? and idx > ? order by idx",
        (session_id, 0 if snapshot is None else snapshot.index),
    ).fetchall()
    return StateRead(snapshot, [_stored(row) for row in rows])


def _index_of(event: StoredEvent) -> int:
    return event.index


class _SqlitePresence:
    """Presence rows with a TTL; the degraded tier (the server re-reads)."""

    push = False

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

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
        """Field-wise LWW on ``at_ms`` (store-postgres.ts ``presence.set``), all
        fields in one transaction. Cancellation: applied entirely or not at all."""
        encoded = {field: None if v is None else _text(v) for field, v in values.items()}

        now = self._store.clock.now_ms()

        def work(conn: sqlite3.Connection) -> StoredPresencePatch | None:
            # Sweep here, under the write lock we hold anyway, so reads stay reads.
            conn.execute(
                "delete from a2_presence where ns = ? and expires_at <= ?", (session_id, now)
            )
            expires_at = now + ttl_ms
            applied: dict[str, Any] = {}
            for field, value in encoded.items():
                # A stored row with a strictly newer `at` survives; ties go to
                # the incoming write.
                newer = conn.execute(
                    "select 1 from a2_presence where ns = ? and participant = ? "
                    "and field = ? and at > ?",
                    (session_id, participant, field, at_ms),
                ).fetchone()
                if newer is not None:
                    continue
                if value is None:
                    conn.execute(
                        "delete from a2_presence where ns = ? and participant = ? and field = ?",
                        (session_id, participant, field),
                    )
                else:
                    conn.execute(
                        """
                        insert into a2_presence
                          (ns, participant, field, value, seen, at, expires_at)
                        values (?, ?, ?, ?, ?, ?, ?)
                        on conflict (ns, participant, field) do update set
                          value = excluded.value, seen = excluded.seen,
                          at = excluded.at, expires_at = excluded.expires_at
                        """,
                        (session_id, participant, field, value, seen, at_ms, expires_at),
                    )
                applied[field] = values[field]
            if not applied:
                return None
            return StoredPresencePatch(participant, applied, seen, at_ms)

        return await self._store._write("presence set", work)

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, ordered by participant and field (expired rows are
        filtered out here and swept by the next ``set``). Cancellation: a read."""
        now = self._store.clock.now_ms()

        def work(conn: sqlite3.Connection) -> list[PresenceRow]:
            rows = conn.execute(
                "select participant, field, value, seen, at, expires_at from a2_presence "
                "where ns = ? and expires_at > ? order by participant, field",
                (session_id, now),
            ).fetchall()
            return [PresenceRow(p, f, _decode(v), s, a, e) for p, f, v, s, a, e in rows]

        return await self._store._read("presence read", work)

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        """Degraded tier: never calls ``on_patch``; the server re-reads instead."""
        return _unsubscribed


def _unsubscribed() -> None:
    return None


class _SqliteInspection:
    """Read-only views (the seed's ``inspect``)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions starting with ``prefix``, after ``cursor``. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> SessionPage:
            rows = conn.execute(
                """
                select session_id, count(*),
                  count(*) filter (where processed_at is null and failed_at is null),
                  count(*) filter (where failed_at is not null),
                  sum(attempt_count), sum(failure_count), min(created_at),
                  max(max(created_at, coalesce(first_claimed_at, 0),
                          coalesce(last_claimed_at, 0), coalesce(last_failed_at, 0),
                          coalesce(processed_at, 0), coalesce(failed_at, 0)))
                from a2_events
                where substr(session_id, 1, length(?1)) = ?1 and (?2 is null or session_id > ?2)
                group by session_id order by session_id limit ?3
                """,
                (prefix, cursor, limit + 1),
            ).fetchall()
            summaries = [SessionSummary(*row) for row in rows[:limit]]
            more = len(rows) > limit
            return SessionPage(summaries, summaries[-1].session_id if more and summaries else None)

        return await self._store._read("list_sessions", work)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """Events after ``after_index`` through ``min(through_index, frontier)``,
        frontier and page in one snapshot. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> EventPage:
            frontier = _next_index(conn, session_id) - 1
            through = frontier if through_index is None else min(through_index, frontier)
            rows = conn.execute(
                f"select {_COLS} from a2_events where session_id = ? and idx > ? and idx <= ? "
                "order by idx limit ?",
                (session_id, after_index, through, limit),
            ).fetchall()
            return EventPage([_stored(row) for row in rows], through)

        return await self._store._read("read_events", work)

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> list[SnapshotInfo]:
            rows = conn.execute(
                "select reducer_name, up_to_index, updated_at from a2_snapshots "
                "where session_id = ? order by reducer_name",
                (session_id,),
            ).fetchall()
            return [SnapshotInfo(*row) for row in rows]

        return await self._store._read("list_snapshots", work)


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
