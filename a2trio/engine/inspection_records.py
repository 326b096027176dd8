"""What ``server.inspect`` answers with: an event's processing status, and
the pages of sessions, events and dead letters (``inspection.py``); the
filter a bulk action takes and its result.

:func:`event_status` is the one reading of a stored row's bookkeeping as a
status, for every store: the store keeps the bookkeeping, this says what it
means.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..contract import Event
from ..identifiers import MAX_SAFE_INTEGER, check_session_id
from ..stores.base import (
    FailedAttempt,
    OperatorAction,
    RefusalReason,
    SessionSummary,
    SnapshotInfo,
    StoredEvent,
)
from .durable import Waiting

__all__ = [
    "BulkAction",
    "BulkFilterError",
    "BulkItem",
    "BulkRefusal",
    "BulkResult",
    "DeadLetterFilter",
    "DeadLettersPage",
    "EventStatus",
    "InspectedEvent",
    "InspectionUnsupportedError",
    "SessionEventsPage",
    "SessionsPage",
    "State",
    "dead_cursor",
    "event_status",
]

State = Literal[
    "settled", "processed", "skipped", "pending", "claimed", "waiting", "failed", "dead_lettered"
]


class EventStatus(msgspec.Struct, frozen=True):
    """Where an event is in its processing.

    ``state``: ``settled`` (stored with nothing to run), ``processed`` (a
    handler completed it, by ``processed_by_attempt``), ``skipped`` (an
    operator marked it processed without running it, or a later event of
    its debounce key did: ``debounced_by`` that event's index), ``pending`` (waiting
    for a claim), ``claimed`` (``claim_holder`` runs attempt ``attempts``
    until ``claim_expires_at``), ``failed`` (``failures`` so far, waiting for
    a retry), ``waiting`` (a durable handler waits: ``waiting_for`` an event
    type in a running ``wait_for``, holding its claim, or ``sleep``, its
    attempt suspended; ``waiting_until_ms`` when it wakes or times out, None
    for no timeout), ``dead_lettered`` (failed for good; its lane is blocked).

    The row keeps the last failure: ``last_error`` is the error of attempt
    ``last_failed_attempt``, at ``last_failed_at_ms`` (each failed attempt is
    in :attr:`InspectedEvent.failed_attempts`). The other
    times (epoch milliseconds, the store's clock) are when the event was
    first and last claimed, processed, and dead-lettered; ``lane`` is its
    handler's lane (None outside one). ``not_before_ms`` is the instant
    before which no attempt starts (a backoff's retry-at, a wake time; None
    for none).
    """

    state: State
    attempts: int
    failures: int
    claim_holder: str | None = None
    claim_expires_at_ms: int | None = None
    processed_by_attempt: int | None = None
    last_error: str | None = None
    last_failed_attempt: int | None = None
    last_failed_at_ms: int | None = None
    first_claimed_at_ms: int | None = None
    last_claimed_at_ms: int | None = None
    processed_at_ms: int | None = None
    dead_lettered_at_ms: int | None = None
    lane: str | None = None
    not_before_ms: int | None = None
    debounced_by: int | None = None
    waiting_for: str | None = None
    waiting_until_ms: int | None = None


class InspectedEvent(msgspec.Struct, frozen=True):
    """A typed event, its status, and the operator actions recorded on it
    (oldest first; their ``session_id`` without the namespace).

    ``trace_id`` is the W3C trace id of the span that appended the event
    (None when it was not traced): the same trace holds the request that
    pushed it and its handler's spans, so it finds them in a tracing backend.

    ``version`` is the payload version the event was stored at (1 for one
    stored without a version: :mod:`a2trio.upcasting`); ``event`` has its
    current version's payload. When it cannot be upcast, ``event.payload``
    is as stored (JSON builtins) and ``upcast_error`` says why.

    ``failed_attempts``: each failed attempt's error, when it failed, the
    holder that ran it and when it was claimed, oldest first: the latest
    :data:`~a2trio.stores.rules.MAX_FAILED_ATTEMPTS` (20) of the event. Read
    only for events that failed (empty on a store without inspection).
    """

    event: Event[Any]
    status: EventStatus
    actions: list[OperatorAction] = msgspec.field(default_factory=list)
    trace_id: str | None = None
    version: int = 1
    upcast_error: str | None = None
    failed_attempts: list[FailedAttempt] = msgspec.field(default_factory=list)


class DeadLettersPage(msgspec.Struct, frozen=True):
    """Dead letters of the contract, by (session, index), with the cursor
    for the next page (None at the end)."""

    dead_letters: list[InspectedEvent]
    cursor: str | None


class SessionsPage(msgspec.Struct, frozen=True):
    """Sessions of the contract (ids without the namespace), and the cursor
    for the next page (None at the end)."""

    sessions: list[SessionSummary]
    cursor: str | None


class SessionEventsPage(msgspec.Struct, frozen=True):
    """Events in ``(after_index, through_index]``; ``next_index`` is the
    ``after_index`` of the next page, None when this one reached
    ``through_index``. Snapshots come with the first page (``after_index=0``)."""

    events: list[InspectedEvent]
    snapshots: list[SnapshotInfo]
    through_index: int
    next_index: int | None


BulkAction = Literal["redrive", "skip"]
#: Why a bulk action left one event alone: the store's refusal of the single
#: action, or ``forbidden`` (the caller's per-event check said no).
BulkRefusal = RefusalReason | Literal["forbidden"]


class DeadLetterFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which dead letters a bulk action takes: each field given must match
    (the default, an empty filter, matches every dead letter).

    ``event_types``: the event's type is one of these (a contract has one
    handler per event type, so this names handlers too). ``error_contains``:
    the last error holds this text (case-sensitive). ``session_prefix``: the
    session id starts with it (without the namespace). ``dead_lettered_from_ms``
    (inclusive) and ``dead_lettered_until_ms`` (exclusive): when the event was
    dead-lettered, epoch milliseconds on the store's clock.
    """

    event_types: tuple[str, ...] = ()
    error_contains: str | None = None
    session_prefix: str = ""
    dead_lettered_from_ms: int | None = None
    dead_lettered_until_ms: int | None = None

    def is_empty(self) -> bool:
        """True when it matches every dead letter."""
        return self == DeadLetterFilter()

    def matches(self, row: StoredEvent) -> bool:
        """Whether a dead-lettered row (its session already within
        ``session_prefix``) matches the other fields."""
        at = row.failed_at_ms
        return (
            (not self.event_types or row.type in self.event_types)
            and (self.error_contains is None or self.error_contains in (row.last_error or ""))
            and (
                self.dead_lettered_from_ms is None
                or (at is not None and at >= self.dead_lettered_from_ms)
            )
            and (
                self.dead_lettered_until_ms is None
                or (at is not None and at < self.dead_lettered_until_ms)
            )
        )


class BulkItem(msgspec.Struct, frozen=True):
    """One dead letter a bulk action matched (``session_id`` without the
    namespace): ``outcome`` is ``matched`` on a dry run, else ``acted`` (with
    the recorded ``action``) or ``refused`` (with the ``refusal`` reason and
    its message, ``detail``)."""

    session_id: str
    index: int
    type: str
    outcome: Literal["matched", "acted", "refused"]
    refusal: BulkRefusal | None = None
    detail: str | None = None
    action: OperatorAction | None = None


class BulkResult(msgspec.Struct, frozen=True):
    """What a bulk action did: ``matched`` dead letters (at most its limit),
    of which ``acted`` were acted on and ``refused`` refused (both 0 on a dry
    run), each in ``items`` by (session, index). ``limited``: the limit
    stopped it while more dead letters matched; run it again for the rest."""

    action: BulkAction
    dry_run: bool
    matched: int
    acted: int
    refused: int
    items: list[BulkItem]
    limited: bool


def event_status(
    row: StoredEvent,
    now_ms: int,
    actions: list[OperatorAction] | None = None,
    wait: Waiting | None = None,
) -> EventStatus:
    r"""The status a stored row's bookkeeping (and the operator ``actions``
    recorded on it, and what its journal says it ``wait``\ s for) implies at
    ``now_ms``."""
    state: State
    if row.failed_at_ms is not None:
        state = "dead_lettered"
    elif row.processed_at_ms is not None and (
        row.debounced_by is not None or (actions and actions[-1].action == "skip")
    ):
        state = "skipped"
    elif row.processed_at_ms is not None:
        state = "settled" if row.attempt_count == 0 else "processed"
    elif row.claim_expires_at_ms is not None and row.claim_expires_at_ms > now_ms:
        state = "claimed"
    elif row.failure_count > 0:
        state = "failed"
    else:
        state = "pending"
    if wait is not None and state in ("pending", "claimed", "failed"):
        state = "waiting"
    expiry = row.claim_expires_at_ms
    claimed = state in ("claimed", "waiting") and expiry is not None and expiry > now_ms
    return EventStatus(
        state,
        row.attempt_count,
        row.failure_count,
        row.claim_holder if claimed else None,
        row.claim_expires_at_ms if claimed else None,
        row.processed_by_attempt,
        row.last_error,
        row.last_failed_attempt,
        row.last_failed_at_ms,
        row.first_claimed_at_ms,
        row.last_claimed_at_ms,
        row.processed_at_ms,
        row.failed_at_ms,
        row.lane,
        row.not_before_ms if state in ("pending", "failed", "waiting") else None,
        row.debounced_by,
        None if wait is None else wait.what,
        None if wait is None else wait.until_ms,
    )


class InspectionUnsupportedError(Exception):
    """The server's store has no inspection capability (the seed's
    ``InspectionUnsupportedError``)."""


InspectionUnsupportedError.__module__ = "a2trio"


class BulkFilterError(ValueError):
    """A bulk action's filter or bounds are malformed (a bad field, a time
    range that ends before it starts, a limit out of range), or the filter is
    empty on a run that acts without ``all=True``. Nothing was read or
    written."""


def dead_cursor(cursor: str) -> tuple[str, int]:
    """``"<index>:<session>"``, as :meth:`~.inspection.ServerInspection.list_dead_letters`
    hands it out."""
    index, colon, session_id = cursor.partition(":")
    # Bounded here, once for every store: past 64 bits SQLite's driver raised
    # OverflowError, which surfaced as the store being unavailable.
    if (
        not colon
        or not session_id
        or not index.isdigit()
        or not index.isascii()
        or len(index) > len(str(MAX_SAFE_INTEGER))
        or int(index) > MAX_SAFE_INTEGER
    ):
        raise ValueError(
            f"a dead-letter cursor reads '<index>:<session>' with an index of at most "
            f"{MAX_SAFE_INTEGER}, got {cursor[:80]!r}"
        )
    return check_session_id(session_id), int(index)
