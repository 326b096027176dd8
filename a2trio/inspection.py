"""Moved to :mod:`a2trio.engine.inspection` (``server.inspect``) and
:mod:`a2trio.engine.inspection_records` (what it answers with); this path
stays for the names users import from it (``a2trio.inspection.event_status``)."""

from .engine.inspection import (
    MAX_ACTOR_CHARS,
    MAX_INSPECTION_PAGE,
    MAX_REASON_CHARS,
    InspectionUnsupportedError,
    ServerInspection,
)
from .engine.inspection_records import (
    DeadLettersPage,
    EventStatus,
    InspectedEvent,
    SessionEventsPage,
    SessionsPage,
    event_status,
)

__all__ = [
    "MAX_ACTOR_CHARS",
    "MAX_INSPECTION_PAGE",
    "MAX_REASON_CHARS",
    "DeadLettersPage",
    "EventStatus",
    "InspectedEvent",
    "InspectionUnsupportedError",
    "ServerInspection",
    "SessionEventsPage",
    "SessionsPage",
    "event_status",
]
