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

__all__ = ["BatchRow", "cause_json", "encode", "stored_event"]

encode = msgspec.json.Encoder().encode


class BatchRow(msgspec.Struct, omit_defaults=True):
    """One row of an append's or a completion's ``$batch`` (the statements'
    ``jsonb_to_recordset``, whose missing keys read as null): the options an
    event does not use (most of them, most of the time) are left out of the
    JSON instead of written as nulls."""

    ord: int
    id: str | None
    type: str
    payload: Any
    settled: bool
    cause: dict[str, int] | None = None
    lane: str | None = None
    trace: str | None = None
    version: int | None = None
    flow_key: str | None = None
    flow_limit: int | None = None
    delay: int | None = None
    debounce: str | None = None
    throttle_key: str | None = None
    throttle_limit: int | None = None
    throttle_period: int | None = None
    priority: int | None = None


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
    """A StoredEvent from ``EVENT_COLUMNS`` starting at ``row[at]`` (the
    record's fields in that order: positional, the cheapest construction)."""
    fields = list(row[at : at + 32])
    fields[6] = _cause(fields[6])
    return StoredEvent(*fields)
