"""What an operator reads: ``server.inspect``'s answers in the wire's
camelCase (issue 36), the one shape ``a2trio inspect --json`` prints and
``/_a2/inspect`` answers.

The records mirror :mod:`a2trio.engine.inspection_records` and the store's
:class:`~a2trio.stores.base.OperatorAction` field for field, each with
``rename="camel"``: ``session_id`` travels as ``sessionId``,
``claim_expires_at_ms`` as ``claimExpiresAtMs``. An event travels as the
wire's :class:`~.records.WireEvent`, as every lane carries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import msgspec

from ...engine.crons import CronInfo
from ...engine.inspection_records import (
    BulkAction,
    BulkRefusal,
    BulkResult,
    DeadLetterFilter,
    DeadLettersPage,
    InspectedEvent,
    SessionEventsPage,
    SessionsPage,
    State,
)
from ...stores.base import ActionKind, Erased, FailedAttempt, OperatorAction, Trimmed
from .records import WireEvent, event_to_wire

__all__ = [
    "WireBulkItem",
    "WireBulkRequest",
    "WireBulkResult",
    "WireCron",
    "WireDeadLetterFilter",
    "WireDeadLettersPage",
    "WireErased",
    "WireEventStatus",
    "WireFailedAttempt",
    "WireInspectedEvent",
    "WireOperatorAction",
    "WireSessionEventsPage",
    "WireSessionSummary",
    "WireSessionsPage",
    "WireSnapshotInfo",
    "WireTrimmed",
    "actions_to_wire",
    "bulk_result_to_wire",
    "crons_to_wire",
    "dead_letters_page_to_wire",
    "decode_bulk_request",
    "erased_to_wire",
    "session_events_page_to_wire",
    "sessions_page_to_wire",
    "trimmed_to_wire",
]


class WireEventStatus(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.engine.inspection_records.EventStatus`."""

    state: State
    attempts: int
    failures: int
    claim_holder: str | None
    claim_expires_at_ms: int | None
    processed_by_attempt: int | None
    last_error: str | None
    last_failed_attempt: int | None
    last_failed_at_ms: int | None
    first_claimed_at_ms: int | None
    last_claimed_at_ms: int | None
    processed_at_ms: int | None
    dead_lettered_at_ms: int | None
    lane: str | None
    not_before_ms: int | None = None
    debounced_by: int | None = None
    waiting_for: str | None = None
    waiting_until_ms: int | None = None


class WireOperatorAction(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.stores.base.OperatorAction`."""

    action: ActionKind
    session_id: str
    index: int
    by: str
    reason: str
    at_ms: int


class WireFailedAttempt(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.stores.base.FailedAttempt`."""

    index: int
    attempt: int
    error: str
    failed_at_ms: int
    holder: str
    claimed_at_ms: int | None


class WireInspectedEvent(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.engine.inspection_records.InspectedEvent`."""

    event: WireEvent
    status: WireEventStatus
    actions: list[WireOperatorAction]
    trace_id: str | None
    version: int = 1
    upcast_error: str | None = None
    failed_attempts: list[WireFailedAttempt] = msgspec.field(default_factory=list)


class WireSessionSummary(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.stores.base.SessionSummary`."""

    session_id: str
    event_count: int
    pending_count: int
    failed_count: int
    attempt_count: int
    failure_count: int
    first_event_at_ms: int
    updated_at_ms: int


class WireSnapshotInfo(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.stores.base.SnapshotInfo`."""

    reducer_name: str
    index: int
    updated_at_ms: int


class WireSessionsPage(msgspec.Struct, frozen=True, rename="camel"):
    """``{sessions, cursor}``."""

    sessions: list[WireSessionSummary]
    cursor: str | None


class WireDeadLettersPage(msgspec.Struct, frozen=True, rename="camel"):
    """``{deadLetters, cursor}``."""

    dead_letters: list[WireInspectedEvent]
    cursor: str | None


class WireSessionEventsPage(msgspec.Struct, frozen=True, rename="camel"):
    """``{events, snapshots, throughIndex, nextIndex}``."""

    events: list[WireInspectedEvent]
    snapshots: list[WireSnapshotInfo]
    through_index: int
    next_index: int | None


class WireCron(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.CronInfo`; the slots in ISO 8601 in the cron's timezone."""

    name: str
    spec: str
    session_id: str
    timezone: str
    catch_up: str
    last_slot: datetime | None
    next_slot: datetime


class WireBulkItem(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.engine.inspection_records.BulkItem`."""

    session_id: str
    index: int
    type: str
    outcome: Literal["matched", "acted", "refused"]
    refusal: BulkRefusal | None
    detail: str | None
    action: WireOperatorAction | None


class WireBulkResult(msgspec.Struct, frozen=True, rename="camel"):
    """:class:`~a2trio.engine.inspection_records.BulkResult`."""

    action: BulkAction
    dry_run: bool
    matched: int
    acted: int
    refused: int
    items: list[WireBulkItem]
    limited: bool


class WireDeadLetterFilter(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """:class:`~a2trio.engine.inspection_records.DeadLetterFilter`."""

    event_types: tuple[str, ...] = ()
    error_contains: str | None = None
    session_prefix: str = ""
    dead_lettered_from_ms: int | None = None
    dead_lettered_until_ms: int | None = None


class WireBulkRequest(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """A bulk action's body over HTTP: ``{action, filter, by, reason, dryRun,
    all, limit}`` (``limit`` None: the default)."""

    action: BulkAction
    by: str
    filter: WireDeadLetterFilter = WireDeadLetterFilter()
    reason: str = ""
    dry_run: bool = False
    all: bool = False
    limit: int | None = None

    def dead_letter_filter(self) -> DeadLetterFilter:
        where: DeadLetterFilter = _mirror(self.filter, DeadLetterFilter)
        return where


_decode_bulk = msgspec.json.Decoder(WireBulkRequest).decode


class WireErased(msgspec.Struct, frozen=True, rename="camel"):
    """What an erasure or an archive removed (:class:`~a2trio.stores.base.Erased`)."""

    session_id: str
    events: int
    snapshots: int
    actions: int
    presence: int
    at_ms: int


class WireTrimmed(msgspec.Struct, frozen=True, rename="camel"):
    """What a trim removed (:class:`~a2trio.stores.base.Trimmed`)."""

    session_id: str
    reducer_name: str
    through_index: int
    events: int
    at_ms: int


def decode_bulk_request(raw: bytes) -> WireBulkRequest:
    """A bulk action's JSON body.

    Raises:
      msgspec.ValidationError / msgspec.DecodeError: not that shape.
    """
    return _decode_bulk(raw)


def _mirror(value: Any, into: type[Any]) -> Any:
    # The records match field for field by their Python names.
    return msgspec.convert(value, into, from_attributes=True)


def _inspected(inspected: InspectedEvent) -> WireInspectedEvent:
    return WireInspectedEvent(
        event_to_wire(inspected.event),
        _mirror(inspected.status, WireEventStatus),
        actions_to_wire(inspected.actions),
        inspected.trace_id,
        inspected.version,
        inspected.upcast_error,
        _failures_to_wire(inspected.failed_attempts),
    )


def _failures_to_wire(failures: Sequence[FailedAttempt]) -> list[WireFailedAttempt]:
    return [_mirror(failure, WireFailedAttempt) for failure in failures]


def sessions_page_to_wire(page: SessionsPage) -> WireSessionsPage:
    return WireSessionsPage(
        [_mirror(summary, WireSessionSummary) for summary in page.sessions], page.cursor
    )


def dead_letters_page_to_wire(page: DeadLettersPage) -> WireDeadLettersPage:
    return WireDeadLettersPage([_inspected(dead) for dead in page.dead_letters], page.cursor)


def session_events_page_to_wire(page: SessionEventsPage) -> WireSessionEventsPage:
    return WireSessionEventsPage(
        [_inspected(event) for event in page.events],
        [_mirror(snapshot, WireSnapshotInfo) for snapshot in page.snapshots],
        page.through_index,
        page.next_index,
    )


def actions_to_wire(actions: Sequence[OperatorAction]) -> list[WireOperatorAction]:
    return [_mirror(action, WireOperatorAction) for action in actions]


def crons_to_wire(crons: Sequence[CronInfo]) -> list[WireCron]:
    return [_mirror(cron, WireCron) for cron in crons]


def bulk_result_to_wire(result: BulkResult) -> WireBulkResult:
    wired: WireBulkResult = _mirror(result, WireBulkResult)
    return wired


def erased_to_wire(erased: Erased) -> WireErased:
    wired: WireErased = _mirror(erased, WireErased)
    return wired


def trimmed_to_wire(trimmed: Trimmed) -> WireTrimmed:
    wired: WireTrimmed = _mirror(trimmed, WireTrimmed)
    return wired
