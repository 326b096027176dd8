"""The memory store's rows: an event's row with its bookkeeping (the seed's
``a2_events`` columns, the payload kept as JSON bytes), and the hand-off a
completion and a skip both make. The store (``store``) and its operator
actions (``operator``) share the rows.
"""

from __future__ import annotations

import dataclasses

import msgspec

from .. import rules
from ..base import EventCause, StoredEvent

__all__ = ["Row", "debounce", "decode", "encode", "husk", "settle", "wake"]

encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode


@dataclasses.dataclass(slots=True)
class Row:
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
    not_before_ms: int | None = None
    version: int | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    debounce_key: str | None = None
    debounced_by: int | None = None
    throttle_key: str | None = None
    throttle_limit: int | None = None
    throttle_period_ms: int | None = None
    priority: int | None = None
    # A suspended wait's wake mark (``release_attempt(wake_on=...)``).
    wake_on: tuple[str, ...] | None = None

    def stored(self) -> StoredEvent:
        return StoredEvent(
            id=self.id,
            type=self.type,
            payload=decode(self.payload),
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
            not_before_ms=self.not_before_ms,
            version=self.version,
            concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
            debounce_key=self.debounce_key,
            debounced_by=self.debounced_by,
            throttle_key=self.throttle_key,
            throttle_limit=self.throttle_limit,
            throttle_period_ms=self.throttle_period_ms,
            priority=self.priority,
        )


def husk(row: Row) -> Row:
    """What stays of a trimmed event: its place in the session (its index),
    processed by no attempt, with no id, type or payload."""
    return Row(
        id="",
        type="",
        payload=b"null",
        index=row.index,
        session_id=row.session_id,
        created_at_ms=row.created_at_ms,
        cause=None,
        lane=None,
        lane_ready=False,
        processed_at_ms=row.processed_at_ms,
    )


def settle(open_rows: dict[int, Row], row: Row, now: int) -> None:
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


def debounce(open_rows: dict[int, Row], type: str, key: str, index: int, now: int) -> None:
    """Skip the open rows ``rules.debounces`` says a debounced row of
    ``type`` and ``key`` at ``index`` settles (:func:`settle` each)."""
    for earlier in list(open_rows.values()):
        if rules.debounces(earlier, type, key, now):
            settle(open_rows, earlier, now)
            earlier.debounced_by = index


def wake(waiting: set[int], rows: list[Row], types: list[str]) -> None:
    """``rules.wake_verdict`` over a session's marked rows (``waiting``, their
    indexes, updated) for events of ``types`` just written."""
    for index in list(waiting):
        row = rows[index - 1] if index <= len(rows) else None
        if row is None or row.wake_on is None:
            waiting.discard(index)
            continue
        verdict = rules.wake_verdict(row, row.wake_on, types)
        if verdict == "keep":
            continue
        waiting.discard(index)
        row.wake_on = None
        if verdict == "wake":
            row.not_before_ms = None
