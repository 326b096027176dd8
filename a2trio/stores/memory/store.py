"""The in-memory store: a verified fake of the Postgres backend.

It passes the same conformance suite as the durable stores and follows the
seed's SQL statement by statement, so tests on it mean something. Every
verdict it reaches is a call into :mod:`a2trio.stores.rules`: it is the
rules' reference backend. Payloads are
kept as JSON bytes, so what a test reads back went through the same
serialization as on a real backend. Every operation runs without an await
between its reads and writes, which makes each one atomic under Trio.

The rows are :mod:`.rows`, the operator actions :mod:`.operator` (on the
same rows), the presence plane :mod:`.presence`.

Not durable, single process. The default under ``A2_ENV=test``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...ids import IdSource, random_id
from .. import rules
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
    EventPage,
    FailedAttempt,
    FailResult,
    ReleaseResult,
    RenewResult,
    Retention,
    SessionPage,
    SessionSummary,
    Settled,
    Snapshot,
    SnapshotInfo,
    StateRead,
    StoredEvent,
    SweepsClaimable,
    WatchesPending,
)
from ..feed import Feed, FeedStatistics, Wakeups, open_pump_feed
from .flow import Flows
from .journal import MemoryJournal
from .operator import MemoryOperator
from .presence import MemoryPresence
from .retention import MemoryRetention
from .rows import Row, debounce, decode, encode, settle, wake

__all__ = ["MemoryStore", "memory"]


class _MemoryInspection:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        await trio.lowlevel.checkpoint()
        ids = sorted(
            sid
            for sid in self._store._sessions
            if sid.startswith(prefix) and (cursor is None or sid > cursor)
        )
        summaries = []
        for sid in ids[:limit]:
            rows = self._store._sessions[sid][self._store._trimmed.get(sid, 0) :]
            summaries.append(
                SessionSummary(
                    session_id=sid,
                    event_count=len(rows),
                    pending_count=sum(
                        r.processed_at_ms is None and r.failed_at_ms is None for r in rows
                    ),
                    failed_count=sum(r.failed_at_ms is not None for r in rows),
                    attempt_count=sum(r.attempt_count for r in rows),
                    failure_count=sum(r.failure_count for r in rows),
                    first_event_at_ms=min(r.created_at_ms for r in rows),
                    updated_at_ms=max(
                        max(
                            r.created_at_ms,
                            r.first_claimed_at_ms or 0,
                            r.last_claimed_at_ms or 0,
                            r.last_failed_at_ms or 0,
                            r.processed_at_ms or 0,
                            r.failed_at_ms or 0,
                        )
                        for r in rows
                    ),
                )
            )
        more = len(ids) > limit
        return SessionPage(summaries, summaries[-1].session_id if more and summaries else None)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        await trio.lowlevel.checkpoint()
        rows = self._store._sessions.get(session_id, [])
        frontier = len(rows)
        through = frontier if through_index is None else min(through_index, frontier)
        start = max(after_index, self._store._trimmed.get(session_id, 0))
        page = [r.stored() for r in rows[start:through]][:limit]
        return EventPage(page, through)

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        await trio.lowlevel.checkpoint()
        return [
            SnapshotInfo(reducer, index, updated)
            for (sid, reducer), (index, _, updated) in sorted(self._store._snapshots.items())
            if sid == session_id
        ]

    async def read_failures(self, session_id: str, indexes: Sequence[int]) -> list[FailedAttempt]:
        await trio.lowlevel.checkpoint()
        kept = self._store._failures.get(session_id, {})
        return [f for index in sorted(set(indexes)) for f in kept.get(index, ())]


class _MemorySweep:
    """The sweep (``SweepsClaimable``) over the store's unprocessed rows."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: a pass over the
        sessions with unprocessed rows, never the history."""
        await trio.lowlevel.checkpoint()
        store = self._store
        now = store.clock.now_ms()
        found = [
            key
            for key, rows in store._open.items()
            if key.startswith(prefix)
            and any(
                rules.sweepable(row, now) and store._flows.has_room(row, now)
                for row in rows.values()
            )
        ]
        return sorted(found)[:limit]


class MemoryStore:
    """An in-memory :class:`~a2trio.stores.Store` with every capability but
    app transactions and cross-process wake-up (one process).

    Args:
      clock: where stored timestamps come from (``TrioClock`` under a mock clock).
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`).
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, ids: IdSource | None = None) -> None:
        self.clock = clock
        self._new_id: IdSource = random_id if ids is None else ids
        self._sessions: dict[str, list[Row]] = {}
        self._ids: dict[str, Row] = {}
        # Unprocessed rows per session, in index order: claims, lane checks and
        # has_pending look only here, so a long processed history costs nothing.
        self._open: dict[str, dict[int, Row]] = {}
        # The concurrency keys' rows and the throttles' starts (``rules.flow``).
        self._flows = Flows()
        self._snapshots: dict[tuple[str, str], tuple[int, bytes, int]] = {}
        # The failed attempts per session and index, the latest
        # rules.MAX_FAILED_ATTEMPTS each (written by fail_attempt only).
        self._failures: dict[str, dict[int, list[FailedAttempt]]] = {}
        self._wakeups = Wakeups()
        # The indexes of each session's rows with a wake mark: an append
        # into a session without any looks no further.
        self._waiting: dict[str, set[int]] = {}
        self.presence: MemoryPresence = MemoryPresence(clock)
        self.inspect: _MemoryInspection = _MemoryInspection(self)
        self.sweep: SweepsClaimable = _MemorySweep(self)
        self.pending: WatchesPending | None = None
        self.journal: MemoryJournal = MemoryJournal(clock, self._sessions)
        # Each trimmed session's trim point: its rows at or below are husks.
        self._trimmed: dict[str, int] = {}
        self.operator: MemoryOperator = MemoryOperator(
            clock, self._sessions, self._open, self._trimmed
        )
        self.retention: Retention = MemoryRetention(
            clock,
            self._sessions,
            self._ids,
            self._open,
            self._snapshots,
            self._trimmed,
            self._failures,
            self._flows.keyed,
            self.operator,
            self.presence,
            self.journal,
        )
        #: No app transactions: ``Server.transaction`` raises ``TRANSACTIONS_NOT_SUPPORTED``.
        self.transactions: AppTransactions | None = None

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds and presence subscribers (leak checks in tests)."""
        stats = self._wakeups.statistics()
        return FeedStatistics(
            listeners=stats.listeners + self.presence.subscriber_count(), keys=stats.keys
        )

    def _pending(self, session_id: str) -> bool:
        return bool(self._open.get(session_id))

    def _insert(
        self,
        session_id: str,
        rows: list[Row],
        event: AppendEvent,
        event_id: str,
        cause: EventCause | None,
        now: int,
    ) -> Row:
        lane = event.lane
        open_rows = self._open.setdefault(session_id, {})
        index = len(rows) + 1
        if event.debounce_key is not None:
            debounce(open_rows, event.type, event.debounce_key, index, now)
        lane_ready = rules.ready_at_insert(lane, (r.lane for r in open_rows.values()))
        row = Row(
            id=event_id,
            type=event.type,
            payload=encode(event.payload),
            index=index,
            session_id=session_id,
            created_at_ms=now,
            cause=cause,
            lane=lane,
            lane_ready=lane_ready,
            processed_at_ms=now if event.settled else None,
            trace_context=event.trace_context,
            version=event.version,
            concurrency_key=event.concurrency_key,
            concurrency_limit=event.concurrency_limit,
            not_before_ms=None if event.delay_ms is None else now + event.delay_ms,
            debounce_key=event.debounce_key,
            throttle_key=event.throttle_key,
            throttle_limit=event.throttle_limit,
            throttle_period_ms=event.throttle_period_ms,
            priority=event.priority,
        )
        rows.append(row)
        self._ids[event_id] = row
        if not event.settled:
            open_rows[row.index] = row
            self._flows.add(session_id, row)
        return row

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        await trio.lowlevel.checkpoint()
        if not events:
            return AppendResult([], self._pending(session_id))
        existing = [self._ids[i].stored() for i in rules.supplied_ids(events) if i in self._ids]
        if existing:
            return AppendResult(
                rules.replayed_batch(session_id, events, existing),
                self._pending(session_id),
                [],
                claim is not None and self._claimable(session_id),
            )
        rows = self._sessions.get(session_id, [])
        for event in events:
            if event.cause is not None:
                index = event.cause.index
                parent = rows[index - 1] if 1 <= index <= len(rows) else None
                rules.check_cause(session_id, event.cause, parent)
        if expected_index is not None and len(rows) != expected_index:
            raise rules.stale_index(session_id, expected_index, len(rows))
        had_pending = self._pending(session_id)
        others_claimable = claim is not None and self._claimable(session_id)
        now = self.clock.now_ms()
        self._sessions[session_id] = rows
        written = [
            self._insert(session_id, rows, e, e.id or self._new_id(), e.cause, now) for e in events
        ]
        claimed = []
        for row in written:
            if claim is not None and rules.claims_at_insert(row, now):
                # Claimed as it is written: a claim in the same transaction.
                row.attempt_count = 1
                row.first_claimed_at_ms = row.last_claimed_at_ms = now
                row.claim_holder = claim.holder
                row.claim_expires_at_ms = now + claim.ttl_ms
                claimed.append(row.index)
        if session_id in self._waiting:
            self._wake(session_id, rows, written)
        inserted = [row.stored() for row in written]
        self._wakeups.notify(session_id, inserted)
        return AppendResult(
            inserted,
            rules.has_pending(had_pending, events),
            [row for row in inserted if row.index in claimed],
            others_claimable,
        )

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        await trio.lowlevel.checkpoint()
        row = self._ids.get(event_id)
        return row.stored() if row is not None and row.session_id == session_id else None

    def _claimable(self, session_id: str) -> bool:
        """Whether a claim would take any of the session's events now."""
        now = self.clock.now_ms()
        return any(rules.claimable(r, now) for r in self._open.get(session_id, {}).values())

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        await trio.lowlevel.checkpoint()
        rows = self._sessions.get(session_id, [])
        start = max(0, after_index or 0)
        self._check_trimmed(session_id, start, through_index)
        stop = len(rows) if through_index is None else max(start, through_index)
        return [r.stored() for r in rows[start:stop]]

    def _check_trimmed(self, session_id: str, after: int, through: int | None) -> None:
        trimmed = self._trimmed.get(session_id)
        rules.check_read(session_id, after, through, None if trimmed is None else trimmed + 1)

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
        await trio.lowlevel.checkpoint()
        now = self.clock.now_ms()
        expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
        excluded = set(exclude)
        open_rows = self._open.get(session_id, {}).values()
        candidates = sorted(
            (r for r in open_rows if r.index not in excluded and rules.claimable(r, now)),
            key=lambda r: rules.claim_order(r.priority, r.index),
        )
        live = {
            r.concurrency_key: self._flows.live(r.concurrency_key, now)
            for r in candidates
            if r.concurrency_key is not None
        }
        started = {
            r.throttle_key: len(self._flows.started(r.throttle_key, now))
            for r in candidates
            if r.throttle_key is not None
        }
        chosen, waiting, throttled = rules.flow_select(candidates, live, started, limit)
        claimed: list[StoredEvent] = []
        for row in chosen:
            self._flows.start(row, now)
            row.attempt_count += 1
            if row.first_claimed_at_ms is None:
                row.first_claimed_at_ms = now
            row.last_claimed_at_ms = now
            row.claim_holder = holder
            row.claim_expires_at_ms = expires_at
            claimed.append(row.stored())
        if claimed:
            return Claimed(sorted(claimed, key=_index_of), waiting, throttled)
        retry_at = rules.flow_retry_at(
            rules.busy_until(open_rows, now),
            [rules.busy_until(self._flows.slots(key, now), now) for key in waiting]
            + [min(self._flows.started(key, now), default=None) for key in throttled],
        )
        return Settled() if retry_at is None else Busy(retry_at, waiting, throttled)

    def __repr__(self) -> str:
        return "MemoryStore()"

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        await trio.lowlevel.checkpoint()
        if not claims:
            return RenewResult([], [])
        now = self.clock.now_ms()
        expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
        rows = self._sessions.get(session_id, [])
        renewed: list[int] = []
        superseded: list[int] = []
        for claim in claims:
            row = rows[claim.index - 1] if 1 <= claim.index <= len(rows) else None
            verdict = rules.renew_verdict(row, claim.attempt, holder, now)
            if verdict == "renewed":
                assert row is not None
                row.claim_expires_at_ms = expires_at
                renewed.append(claim.index)
            elif verdict == "superseded":
                superseded.append(claim.index)
        return RenewResult(sorted(renewed), sorted(superseded))

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        await trio.lowlevel.checkpoint()
        ids = rules.returned_ids(events)
        rows = self._sessions.get(session_id, [])
        if not 1 <= index <= len(rows):
            raise rules.no_event(session_id, index)
        parent = rows[index - 1]
        verdict = rules.complete_verdict(parent, attempt, ids)
        if verdict == "superseded":
            return CompleteResult("superseded")
        if verdict == "replay":
            stored = [self._ids[i].stored() for i in ids if i in self._ids]
            return CompleteResult(
                "completed",
                rules.replayed_completion(session_id, index, attempt, events, stored),
            )
        if any(i in self._ids for i in ids):
            raise rules.returned_id_taken()
        now = self.clock.now_ms()
        cause = EventCause(index, attempt)
        open_rows = self._open[session_id]
        settle(open_rows, parent, now)  # first: a returned event never debounces it
        parent.processed_by_attempt = attempt
        parent.returned_event_ids = ids
        written = [
            self._insert(session_id, rows, e, event_id, cause, now)
            for e, event_id in zip(events, ids, strict=True)
        ]
        if written and session_id in self._waiting:
            self._wake(session_id, rows, written)
        inserted = [row.stored() for row in written]
        if inserted:
            self._wakeups.notify(session_id, inserted)
        return CompleteResult("completed", inserted, rules.drained(open_rows.values()))

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
        await trio.lowlevel.checkpoint()
        row = self._row(session_id, index)
        verdict = rules.fail_verdict(row, attempt, max_failures)
        if not verdict.record:
            return verdict.result
        now = self.clock.now_ms()
        row.failure_count = verdict.result.failure_count
        row.last_error = error
        row.last_failed_at_ms = now
        row.last_failed_attempt = attempt
        row.not_before_ms = None
        row.wake_on = None
        if verdict.result.outcome == "dead_lettered":
            row.failed_at_ms = now
        elif retry_after_ms is not None:
            row.not_before_ms = now + retry_after_ms
        assert row.claim_holder is not None  # rules.holds_claim
        failed = FailedAttempt(index, attempt, error, now, row.claim_holder, row.last_claimed_at_ms)
        kept = self._failures.setdefault(session_id, {}).setdefault(index, [])
        kept.append(failed)
        del kept[: -rules.MAX_FAILED_ATTEMPTS]
        row.claim_holder = None
        row.claim_expires_at_ms = None
        return FailResult(verdict.result.outcome, row.failure_count, row.not_before_ms)

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
        await trio.lowlevel.checkpoint()
        row = self._row(session_id, index)
        if rules.release_verdict(row, attempt) == "superseded":
            return ReleaseResult("superseded")
        now = self.clock.now_ms()
        row.not_before_ms = rules.NEVER_MS if delay_ms is None else now + delay_ms
        row.wake_on = None
        row.claim_holder = None
        row.claim_expires_at_ms = None
        if wake_on:
            later = [] if seen_through is None else self._sessions[session_id][seen_through:]
            if rules.wakes(wake_on, (r.type for r in later)):
                row.not_before_ms = now
            else:
                row.wake_on = tuple(wake_on)
                self._waiting.setdefault(session_id, set()).add(index)
        return ReleaseResult("released", row.not_before_ms)

    def _wake(self, session_id: str, rows: list[Row], written: list[Row]) -> None:
        waiting = self._waiting[session_id]
        wake(waiting, rows, [row.type for row in written])
        if not waiting:
            del self._waiting[session_id]

    def _row(self, session_id: str, index: int) -> Row:
        rows = self._sessions.get(session_id, [])
        if not 1 <= index <= len(rows):
            raise rules.no_event(session_id, index)
        return rows[index - 1]

    def _state_read(self, session_id: str, reducer: str) -> StateRead:
        snap = self._snapshots.get((session_id, reducer))
        snapshot = None if snap is None else Snapshot(snap[0], decode(snap[1]))
        after = 0 if snapshot is None else snapshot.index
        self._check_trimmed(session_id, after, None)
        rows = self._sessions.get(session_id, [])
        return StateRead(snapshot, [r.stored() for r in rows[after:]])

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        await trio.lowlevel.checkpoint()
        return self._state_read(session_id, reducer)

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        await trio.lowlevel.checkpoint()
        return [self._state_read(sid, reducer) for sid in session_ids]

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        await trio.lowlevel.checkpoint()
        current = self._snapshots.get((session_id, reducer))
        if current is None or index > current[0]:
            self._snapshots[(session_id, reducer)] = (index, encode(state), self.clock.now_ms())

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        async def read_after(cursor: int) -> list[StoredEvent]:
            return await self.read(session_id, after_index=cursor)

        return open_pump_feed(
            session_id, read_after, _index_of, self._wakeups, start_after=start_after
        )


def _index_of(event: StoredEvent) -> int:
    return event.index


def memory(*, clock: Clock = SYSTEM_CLOCK, ids: IdSource | None = None) -> MemoryStore:
    """Create an in-memory store (tests, ``A2_ENV=test``); ``clock`` and
    ``ids`` as :class:`MemoryStore`'s."""
    return MemoryStore(clock=clock, ids=ids)
