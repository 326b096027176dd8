"""The store's rows: JSON parameters encoded, and rows decoded into records.

Every module of the store reads event rows with :func:`stored_event` (the
``EVENT_COLUMNS`` order). The seed's jsonb shape of a cause is written and
read here (:func:`cause_json`), so both frameworks read each other's rows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..base import EventCause, StoredEvent
from .conn import Row

__all__ = ["cause_json", "encode", "stored_event"]

encode = msgspec.json.Encoder().encode


def cause_json(cause: EventCause) -> dict[str, int]:
    # The seed's jsonb shape, so both frameworks read each other's rows.
    out = {"index": cause.index, "attempt": cause.attempt}
    if cause.batch_size is not None:
        out["batchSize"] = cause.batch_size
    return out


def _cause(raw: Any) -> EventCause | None:
    if raw is None:
        return None
    return EventCause(raw["index"], raw["attempt"], raw.get("batchSize"))


def stored_event(row: Row, at: int = 0) -> StoredEvent:
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
        not_before_ms=r[22],
        version=r[23],
        concurrency_key=r[24],
        concurrency_limit=r[25],
        debounce_key=r[26],
        debounced_by=r[27],
        throttle_key=r[28],
        throttle_limit=r[29],
        throttle_period_ms=r[30],
        priority=r[31],
    )
