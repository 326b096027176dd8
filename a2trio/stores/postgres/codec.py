"""The driver's answers as the store's: rows decoded into records, and failures
translated into :class:`~a2trio.errors.A2Error`.

Every module of the store that calls the driver reads its rows with
:func:`stored_event` (the ``EVENT_COLUMNS`` order) and wraps the call in
:func:`errors`, the package's one error translation, so a caller never
translates again. The seed's jsonb shape of a cause is written and read here
(:func:`cause_json`), so both frameworks read each other's rows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...errors import store_unavailable
from ..base import EventCause, StoredEvent
from .conn import PgError, Row

__all__ = ["cause_json", "encode", "errors", "stored_event"]

encode = msgspec.json.Encoder().encode


#: SQLSTATE classes that refuse the data itself (22: data exception, 54: a
#: program limit such as NOTIFY's payload): a retry fails the same way.
_REFUSED_DATA = ("22", "54")


def _refused_data(exc: Exception) -> bool:
    return isinstance(exc, PgError) and exc.sqlstate.startswith(_REFUSED_DATA)


def errors(what: str) -> store_unavailable:
    """The Postgres store's one error translation (see ``store_unavailable``):
    data the server refuses for what it is is ``INVALID_PAYLOAD``; anything
    else, a lost connection, a timeout, a serialization failure, is
    ``STORE_UNAVAILABLE``."""
    return store_unavailable(what, permanent=_refused_data)


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
    )
