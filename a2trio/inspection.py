"""Moved to :mod:`a2trio.engine.inspection` (``server.inspect``) and
:mod:`a2trio.engine.inspection_records` (what it answers with); this path
stays for the names users import from it (``a2trio.inspection.event_status``)."""

from .engine.inspection import (
    DEFAULT_BULK_LIMIT,
    MAX_ACTOR_CHARS,
    MAX_BULK_LIMIT,
    MAX_INSPECTION_PAGE,
    MAX_REASON_CHARS,
    BulkFilterError,
    InspectionUnsupportedError,
    ServerInspection,
)
from .engine.inspection_records import (
    BulkItem,
    BulkResult,
    DeadLetterFilter,
    DeadLettersPage,
    EventStatus,
    InspectedEvent,
    SessionEventsPage,
    SessionsPage,
    event_status,
)

__all__ = [
    "DEFAULT_BULK_LIMIT",
    "MAX_ACTOR_CHARS",
    "MAX_BULK_LIMIT",
    "MAX_INSPECTION_PAGE",
    "MAX_REASON_CHARS",
    "BulkFilterError",
    "BulkItem",
    "BulkResult",
    "DeadLetterFilter",
    "DeadLettersPage",
    "EventStatus",
    "InspectedEvent",
    "InspectionUnsupportedError",
    "ServerInspection",
    "SessionEventsPage",
    "SessionsPage",
    "event_status",
]
