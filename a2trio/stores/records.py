"""The records a store speaks: what an append takes and returns, a stored
event with its bookkeeping, claim, renewal, completion and failure answers,
snapshots, presence rows, inspection pages, operator actions. msgspec
structs, immutable; :mod:`a2trio.stores.base` re-exports them with the
protocols that use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from ..errors import A2Error, ErrorCode

__all__ = [
    "ActionKind",
    "AppendEvent",
    "AppendResult",
    "Busy",
    "ClaimRef",
    "ClaimRequest",
    "ClaimResult",
    "Claimed",
    "CompleteResult",
    "EventCause",
    "EventPage",
    "FailResult",
    "FailedAttempt",
    "OperatorAction",
    "OperatorActionError",
    "PresenceRow",
    "RefusalReason",
    "ReleaseResult",
    "RenewResult",
    "SessionPage",
    "SessionSummary",
    "Settled",
    "Snapshot",
    "SnapshotInfo",
    "StateRead",
    "StoredEvent",
    "StoredPresencePatch",
    "replay",
]


class EventCause(msgspec.Struct, frozen=True):
    """The handler attempt that appended an event: its trigger's index and attempt.

    ``batch_size`` is set on handler appends whose ids were generated, so the
    replay of a retried attempt can be checked for the same shape.
    """

    index: int
    attempt: int
    batch_size: int | None = None


class AppendEvent(msgspec.Struct, frozen=True):
    """A validated event on its way into a store.

    ``payload`` is JSON builtins (what ``msgspec.to_builtins`` returns).
    ``id`` is None when the store should generate one. ``trace_context`` is
    the appender's trace context, opaque to the store (the telemetry's
    encoding, see :mod:`a2trio.telemetry`): stored with the event and returned
    with it, so a handler in another process continues the appender's trace.
    ``version`` is the schema version of the payload's type (the contract's
    ``versions=``), stored with the event and returned with it; None is
    version 1, which is what every event written before versions existed
    reads as.
    ``concurrency_key`` and ``concurrency_limit`` are the handler's
    :class:`~a2trio.Concurrency` resolved at append: at most that many live
    claims of rows with that key, across sessions (``rules.flow``).

    ``delay_ms`` (issue 33) stores the not-before ``now + delay_ms``: no claim
    takes the event before it (a claim at insert neither). ``debounce_key``
    (issue 33, a debounce): the append settles every earlier event of the
    session with the same type and key that is alive and not under a live
    claim as skipped by this one (``rules.debounces``: processed by no
    attempt, ``debounced_by`` its index, its lane handed on), in the same
    transaction.
    claims of rows with that key, across sessions (``rules.flow``); the
    ``throttle_*`` fields its :class:`~a2trio.Throttle`: at most that many
    attempt starts of the key per period; ``priority`` its ``priority=``
    (a claim takes higher first: ``rules.claim_order``).
    """

    type: str
    payload: Any
    id: str | None = None
    cause: EventCause | None = None
    lane: str | None = None
    settled: bool = False
    trace_context: str | None = None
    version: int | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    delay_ms: int | None = None
    debounce_key: str | None = None
    throttle_key: str | None = None
    throttle_limit: int | None = None
    throttle_period_ms: int | None = None
    priority: int | None = None


class StoredEvent(msgspec.Struct, frozen=True):
    """An event row with its dispatch bookkeeping (the seed's ``StoredEvent``).

    Times are epoch milliseconds from the store's clock. ``not_before_ms``
    (an a2trio addition, issue 33) is the instant before which no claim takes
    the event (``rules.ripe``): a per-handler backoff's retry-at, a released
    attempt's wake time, a debounce window's end; None for none. ``version``
    is the payload's schema version as appended (None: version 1); the engine
    upcasts the payload to its type's current version when it reads it.
    ``debounce_key`` is a debounced event's key (``AppendEvent``), and
    ``debounced_by`` the index of the later event whose append skipped this
    one (it is then processed by no attempt).
    """

    id: str
    type: str
    payload: Any
    index: int
    session_id: str
    created_at_ms: int
    cause: EventCause | None = None
    lane: str | None = None
    processed_at_ms: int | None = None
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


class Claimed(msgspec.Struct, frozen=True, tag="claimed"):
    """Events claimed by this holder, in index order, ``attempt_count`` advanced.

    ``waiting``: the concurrency keys whose full limit held events of this
    session back (claimable once a slot of the key frees), sorted;
    ``throttled``: the throttle keys whose full window did.
    """

    events: list[StoredEvent]
    waiting: list[str] = msgspec.field(default_factory=list)
    throttled: list[str] = msgspec.field(default_factory=list)


class Busy(msgspec.Struct, frozen=True, tag="busy"):
    """Nothing claimable now; live claims held elsewhere expire at
    ``retry_at_ms``. ``waiting`` and ``throttled`` as :class:`Claimed`'s:
    with keys waiting, ``retry_at_ms`` is at latest when a slot of one of
    them lapses; with throttles, when the first of their windows has room."""

    retry_at_ms: int
    waiting: list[str] = msgspec.field(default_factory=list)
    throttled: list[str] = msgspec.field(default_factory=list)


class Settled(msgspec.Struct, frozen=True, tag="settled"):
    """Nothing claimable and no live claim: the session is idle (or stalled)."""


ClaimResult = Claimed | Busy | Settled


class ClaimRequest(msgspec.Struct, frozen=True):
    """Ask :meth:`Store.append` to write its events claimed.

    Each event the append writes that a claim would take at once (not settled,
    first in its lane) is stored claimed by ``holder`` until ``now + ttl_ms``,
    at attempt 1, exactly as if :meth:`Store.claim_available` had claimed it in
    the append's own transaction. A server then starts the handler of an event
    it just appended with no second round trip, and the row is written once.
    A replay or a refused append claims nothing.
    """

    holder: str
    ttl_ms: int


class AppendResult(msgspec.Struct, frozen=True):
    """The appended (or replayed) rows, and whether the session has pending work.

    With a :class:`ClaimRequest`: ``claimed`` holds the rows written claimed
    (index order, also in ``events``), and ``others_claimable`` says whether the
    session held other events a claim would take now (the caller claims those
    the usual way).
    """

    events: list[StoredEvent]
    has_pending: bool
    claimed: list[StoredEvent] = msgspec.field(default_factory=list)
    others_claimable: bool = False


class ClaimRef(msgspec.Struct, frozen=True):
    """A claim this holder believes it owns: (index, attempt)."""

    index: int
    attempt: int


class RenewResult(msgspec.Struct, frozen=True):
    """Indexes whose claims moved forward, and those a newer attempt owns."""

    renewed: list[int]
    superseded: list[int]


class CompleteResult(msgspec.Struct, frozen=True):
    """``completed`` with the returned events as stored, or ``superseded``.

    ``drained`` is a hint that saves a drain its final "nothing left" claim:
    True only if, as of this completion's commit, the session holds no
    unprocessed event that is not dead-lettered (the returned events
    included). A store may always say False; it must never say True falsely.
    """

    outcome: Literal["completed", "superseded"]
    events: list[StoredEvent] = msgspec.field(default_factory=list)
    drained: bool = False


class FailResult(msgspec.Struct, frozen=True):
    """``failed`` (retryable), ``dead_lettered`` (at the limit) or ``superseded``.

    ``retry_at_ms``: the not-before this failure stored (``fail_attempt``'s
    ``retry_after_ms`` after the store's now), when it recorded a retryable
    failure with one; else None.
    """

    outcome: Literal["failed", "dead_lettered", "superseded"]
    failure_count: int
    retry_at_ms: int | None = None


class ReleaseResult(msgspec.Struct, frozen=True):
    """``released`` (the claim cleared, no failure spent, the event not
    claimable before ``not_before_ms``) or ``superseded`` (the attempt no
    longer held the claim: nothing written, ``not_before_ms`` None)."""

    outcome: Literal["released", "superseded"]
    not_before_ms: int | None = None


class FailedAttempt(msgspec.Struct, frozen=True):
    """One failed attempt of the event at ``index``, recorded by the
    ``fail_attempt`` that failed it, in the same transaction: its ``error``
    text, when it failed (``failed_at_ms``), the ``holder`` whose claim ran
    it and when that claim was taken (``claimed_at_ms``). A store keeps the
    latest :data:`~a2trio.stores.rules.MAX_FAILED_ATTEMPTS` per event."""

    index: int
    attempt: int
    error: str
    failed_at_ms: int
    holder: str
    claimed_at_ms: int | None = None


class Snapshot(msgspec.Struct, frozen=True):
    """A cached reducer state folded through ``index``."""

    index: int
    state: Any


class StateRead(msgspec.Struct, frozen=True):
    """A snapshot (if any) and the events after it, read in one consistent view."""

    snapshot: Snapshot | None
    events: list[StoredEvent]


class PresenceRow(msgspec.Struct, frozen=True):
    """One live (participant, field) register."""

    participant: str
    field: str
    value: Any
    seen: int
    at_ms: int
    expires_at_ms: int


class StoredPresencePatch(msgspec.Struct, frozen=True):
    """What a presence write changed, as delivered to subscribers.

    ``values`` maps each applied field to its value, ``None`` for a clear.
    """

    participant: str
    values: dict[str, Any]
    seen: int
    at_ms: int


class SessionSummary(msgspec.Struct, frozen=True):
    """Inspection: one session's counters."""

    session_id: str
    event_count: int
    pending_count: int
    failed_count: int
    attempt_count: int
    failure_count: int
    first_event_at_ms: int
    updated_at_ms: int


class SessionPage(msgspec.Struct, frozen=True):
    """Inspection: a page of sessions, and the cursor for the next (None at the end)."""

    sessions: list[SessionSummary]
    cursor: str | None


class EventPage(msgspec.Struct, frozen=True):
    """Inspection: events in ``(after_index, through_index]``, at most ``limit``."""

    events: list[StoredEvent]
    through_index: int


class SnapshotInfo(msgspec.Struct, frozen=True):
    """Inspection: a snapshot's reducer, index and write time."""

    reducer_name: str
    index: int
    updated_at_ms: int


ActionKind = Literal["redrive", "skip", "retry_now", "wake"]

RefusalReason = Literal[
    "no_event", "not_dead_lettered", "settled", "claimed", "nothing_to_retry", "not_waiting"
]


class OperatorAction(msgspec.Struct, frozen=True):
    """An operator's action on one event, as the store recorded it.

    ``action``: ``redrive`` (a dead letter's failures reset, its lane
    unblocked), ``skip`` (marked processed without running), ``retry_now``
    (its session's drain woken) or ``wake`` (a suspended attempt made
    claimable at once, its not-before and wake mark cleared). ``by`` and
    ``reason`` are the operator's words; ``at_ms`` is the store's clock when
    it committed.
    """

    action: ActionKind
    session_id: str
    index: int
    by: str
    reason: str
    at_ms: int


class OperatorActionError(ValueError):
    """An operator action refused for its target; nothing was written.

    ``reason``: ``no_event`` (the session has no such index),
    ``not_dead_lettered`` (redrive of an event that is not a dead letter),
    ``settled`` (skip of an event already processed), ``claimed`` (a live
    claim holds it: wait for the attempt, or for its lease to lapse),
    ``nothing_to_retry`` (retry now on a session with nothing claimable) or
    ``not_waiting`` (wake or cancel of an event no suspended durable sleep
    or wait holds back).
    The message names the target (``index`` is None for a whole session)
    and then ``detail``.
    """

    def __init__(
        self, reason: RefusalReason, session_id: str, index: int | None, detail: str
    ) -> None:
        self.reason: RefusalReason = reason
        self.session_id = session_id
        self.index = index
        self.detail = detail
        where = f"session {session_id!r}"
        super().__init__(f"{where if index is None else f'event {index} of {where}'} {detail}")


OperatorActionError.__module__ = "a2trio"


def replay(events: Sequence[AppendEvent], stored: Sequence[StoredEvent]) -> list[StoredEvent]:
    """The stored rows of an idempotent re-append, in the batch's order.

    ``stored`` holds the rows of every id in ``events`` (any order). A re-append
    must name the same types as the original: a different type under a stored
    id is a collision, not a replay (``PARTIAL_DUPLICATE_BATCH``).
    """
    by_id = {row.id: row for row in stored}
    replayed = []
    for event in events:
        row = by_id[event.id or ""]
        if row.type != event.type:
            raise A2Error(
                ErrorCode.PARTIAL_DUPLICATE_BATCH,
                f"event id {row.id!r} is already stored with type {row.type!r}, not {event.type!r}",
            )
        replayed.append(row)
    return replayed
