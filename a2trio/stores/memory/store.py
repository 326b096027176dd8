"""The in-memory store: a verified fake of the Postgres backend.

It passes the same conformance suite as the durable stores and follows the
seed's SQL statement by statement, so tests on it mean something. Every
verdict it reaches is a call into :mod:`a2trio.stores.rules`: it is the
rules' reference backend. Payloads are
kept as JSON bytes, so what a test reads back went through the same
serialization as on a real backend. Every operation runs without an await
between its reads and writes, which makes each one atomic under Trio.

Not durable, single process. The default under ``A2_ENV=test``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

import msgspec
import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...ids import IdSource, random_id
from .. import rules
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
    RenewResult,
    SessionPage,
    SessionSummary,
    Settled,
    Snapshot,
    SnapshotInfo,
    StateRead,
    StoredEvent,
)
from ..feed import Feed, FeedStatistics, Wakeups, open_pump_feed
from .presence import MemoryPresence

__all__ = ["MemoryStore", "memory"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclasses.dataclass(slots=True)
class _Row:
    id: str
    type: str
    payload: bytes
    index: int
    session_id: str
    created_at_ms: int
    cause: EventCause | None
    lane: str | None
    lane_ready: bool
    processed_at_ms: int | None
    processed_by_attempt: int | None = None
    returned_event_ids: list[str] | None = None
    first_claimed_at_ms: int | None = None
    last_claimed_at_ms: int | None = None
    attempt_count: int = 0
    failure_count: int = 0
    last_failed_at_ms: int | None = None
    last_failed_attempt: int | None = None
    last_error: str | None = None
    failed_at_ms: int | None = None
    claim_holder: str | None = None
    claim_expires_at_ms: int | None = None
    trace_context: str | None = None

    def stored(self) -> StoredEvent:
        return StoredEvent(
            id=self.id,
            type=self.type,
            payload=_decode(self.payload),
            index=self.index,
            session_id=self.session_id,
            created_at_ms=self.created_at_ms,
            cause=self.cause,
            lane=self.lane,
            processed_at_ms=self.processed_at_ms,
            processed_by_attempt=self.processed_by_attempt,
            returned_event_ids=(
                None if self.returned_event_ids is None else list(self.returned_event_ids)
            ),
            first_claimed_at_ms=self.first_claimed_at_ms,
            last_claimed_at_ms=self.last_claimed_at_ms,
            attempt_count=self.attempt_count,
            failure_count=self.failure_count,
            last_failed_at_ms=self.last_failed_at_ms,
            last_failed_attempt=self.last_failed_attempt,
            last_error=self.last_error,
            failed_at_ms=self.failed_at_ms,
            claim_holder=self.claim_holder,
            claim_expires_at_ms=self.claim_expires_at_ms,
            trace_context=self.trace_context,
        )


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
            rows = self._store._sessions[sid]
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
        page = [r.stored() for r in rows[after_index:through]][:limit]
        return EventPage(page, through)

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        await trio.lowlevel.checkpoint()
        return [
            SnapshotInfo(reducer, index, updated)
            for (sid, reducer), (index, _, updated) in sorted(self._store._snapshots.items())
            if sid == session_id
        ]


class MemoryStore:
    """An in-memory :class:`~a2trio.stores.Store` with presence and inspection.

    Args:
      clock: where stored timestamps come from (``TrioClock`` under a mock clock).
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`).
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, ids: IdSource | None = None) -> None:
        self.clock = clock
        self._new_id: IdSource = random_id if ids is None else ids
        self._sessions: dict[str, list[_Row]] = {}
        self._ids: dict[str, _Row] = {}
        # Unprocessed rows per session, in index order: claims, lane checks and
        # has_pending look only here, so a long processed history costs nothing.
        self._open: dict[str, dict[int, _Row]] = {}
        self._snapshots: dict[tuple[str, str], tuple[int, bytes, int]] = {}
        self._actions: dict[str, list[OperatorAction]] = {}
        self._wakeups = Wakeups()
        self.presence: MemoryPresence = MemoryPresence(clock)
        self.inspect: _MemoryInspection = _MemoryInspection(self)

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
        rows: list[_Row],
        event: AppendEvent,
        event_id: str,
        cause: EventCause | None,
        now: int,
    ) -> _Row:
        lane = event.lane
        open_rows = self._open.setdefault(session_id, {})
        lane_ready = rules.ready_at_insert(lane, (r.lane for r in open_rows.values()))
        row = _Row(
            id=event_id,
            type=event.type,
            payload=_encode(event.payload),
            index=len(rows) + 1,
            session_id=session_id,
            created_at_ms=now,
            cause=cause,
            lane=lane,
            lane_ready=lane_ready,
            processed_at_ms=now if event.settled else None,
            trace_context=event.trace_context,
        )
        rows.append(row)
        self._ids[event_id] = row
        if not event.settled:
            open_rows[row.index] = row
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
            if claim is not None and rules.claimable(row, now):
                # Claimed as it is written: a claim in the same transaction.
                row.attempt_count = 1
                row.first_claimed_at_ms = row.last_claimed_at_ms = now
                row.claim_holder = claim.holder
                row.claim_expires_at_ms = now + claim.ttl_ms
                claimed.append(row.index)
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
        stop = len(rows) if through_index is None else max(start, through_index)
        return [r.stored() for r in rows[start:stop]]

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
        claimed: list[StoredEvent] = []
        for row in open_rows:
            if limit is not None and len(claimed) >= limit:
                break
            if row.index in excluded or not rules.claimable(row, now):
                continue
            row.attempt_count += 1
            if row.first_claimed_at_ms is None:
                row.first_claimed_at_ms = now
            row.last_claimed_at_ms = now
            row.claim_holder = holder
            row.claim_expires_at_ms = expires_at
            claimed.append(row.stored())
        if claimed:
            return Claimed(claimed)
        retry_at = rules.busy_until(open_rows, now)
        return Settled() if retry_at is None else Busy(retry_at)

    def __repr__(self) -> str:
        return "MemoryStore()"

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`SweepsClaimable.claimable_sessions`: a pass over the
        sessions with unprocessed rows, never the history."""
        await trio.lowlevel.checkpoint()
        now = self.clock.now_ms()
        found = [
            key
            for key, rows in self._open.items()
            if key.startswith(prefix) and any(rules.sweepable(row, now) for row in rows.values())
        ]
        return sorted(found)[:limit]

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
        inserted = [
            self._insert(session_id, rows, e, event_id, cause, now).stored()
            for e, event_id in zip(events, ids, strict=True)
        ]
        open_rows = self._open[session_id]
        self._settle(open_rows, parent, now)
        parent.processed_by_attempt = attempt
        parent.returned_event_ids = ids
        if inserted:
            self._wakeups.notify(session_id, inserted)
        return CompleteResult("completed", inserted, rules.drained(open_rows.values()))

    def _settle(self, open_rows: dict[int, _Row], row: _Row, now: int) -> None:
        """Process ``row`` (a completion, a skip): release it and hand its lane on."""
        del open_rows[row.index]
        hands_on = rules.hands_on(row)
        row.processed_at_ms = now
        row.failed_at_ms = None
        row.lane_ready = False
        row.claim_holder = None
        row.claim_expires_at_ms = None
        if hands_on and row.lane is not None:
            successor = rules.next_in_lane(row.lane, open_rows.values())
            if successor is not None:
                successor.lane_ready = True

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
    ) -> FailResult:
        await trio.lowlevel.checkpoint()
        rows = self._sessions.get(session_id, [])
        if not 1 <= index <= len(rows):
            raise rules.no_event(session_id, index)
        row = rows[index - 1]
        verdict = rules.fail_verdict(row, attempt, max_failures)
        if verdict.record:
            now = self.clock.now_ms()
            row.failure_count = verdict.result.failure_count
            row.last_error = error
            row.last_failed_at_ms = now
            row.last_failed_attempt = attempt
            if verdict.result.outcome == "dead_lettered":
                row.failed_at_ms = now
            row.claim_holder = None
            row.claim_expires_at_ms = None
        return verdict.result

    # -- operator actions (OperatorActions) ------------------------------------

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: dead letters stay open
        (they stall their lane), so a pass over the open rows finds them."""
        await trio.lowlevel.checkpoint()
        found = sorted(
            (key, row.index)
            for key, rows in self._open.items()
            if key.startswith(prefix)
            for row in rows.values()
            if row.failed_at_ms is not None and (after is None or (key, row.index) > after)
        )
        return [self._open[key][index].stored() for key, index in found[:limit]]

    def _target(self, session_id: str, index: int) -> _Row | None:
        rows = self._sessions.get(session_id, [])
        return rows[index - 1] if 1 <= index <= len(rows) else None

    def _record(
        self, session_id: str, index: int, action: ActionKind, by: str, reason: str, now: int
    ) -> OperatorAction:
        record = OperatorAction(action, session_id, index, by, reason, now)
        self._actions.setdefault(session_id, []).append(record)
        return record

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`."""
        await trio.lowlevel.checkpoint()
        now = self.clock.now_ms()
        row = self._target(session_id, index)
        rules.check_action("redrive", session_id, index, row, now)
        assert row is not None
        row.failure_count = 0
        row.failed_at_ms = None
        return self._record(session_id, index, "redrive", by, reason, now)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`."""
        await trio.lowlevel.checkpoint()
        now = self.clock.now_ms()
        row = self._target(session_id, index)
        rules.check_action("skip", session_id, index, row, now)
        assert row is not None
        self._settle(self._open[session_id], row, now)
        return self._record(session_id, index, "skip", by, reason, now)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`."""
        await trio.lowlevel.checkpoint()
        now = self.clock.now_ms()
        candidates = [
            (row.index, row.claim_expires_at_ms)
            for row in self._open.get(session_id, {}).values()
            if rules.alive(row) and row.lane_ready
        ]
        targets = rules.retry_targets(session_id, candidates, now)
        return [self._record(session_id, i, "retry_now", by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`."""
        await trio.lowlevel.checkpoint()
        found = [
            a for a in self._actions.get(session_id, []) if after_index < a.index <= through_index
        ]
        return sorted(found, key=lambda a: a.index)

    def _state_read(self, session_id: str, reducer: str) -> StateRead:
        snap = self._snapshots.get((session_id, reducer))
        snapshot = None if snap is None else Snapshot(snap[0], _decode(snap[1]))
        after = 0 if snapshot is None else snapshot.index
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
            self._snapshots[(session_id, reducer)] = (index, _encode(state), self.clock.now_ms())

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
