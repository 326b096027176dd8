"""The seed's verdict rules for appends, completions and failures, written once.

Each backend fetches the rows a rule reads and persists what the rule decides;
the rules themselves are pure functions over those rows, so the memory, SQLite
and Postgres stores refuse, replay and fence alike, with the same codes and
messages. Postgres computes most verdicts inside its statements (``sql``)
and applies these rules to what comes back.

Lane readiness is not here: only the memory store decides it in Python (the
SQL backends decide it in their insert and completion statements).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from ..errors import A2Error, ErrorCode
from .base import (
    AppendEvent,
    EventCause,
    FailResult,
    OperatorActionError,
    StoredEvent,
    replay,
)

__all__ = [
    "ActionTarget",
    "Bookkeeping",
    "FailVerdict",
    "check_action",
    "check_cause",
    "fail_verdict",
    "has_pending",
    "holds_claim",
    "no_event",
    "replayed_batch",
    "replayed_completion",
    "replays_completion",
    "retry_backoff_ms",
    "retry_targets",
    "returned_id_taken",
    "returned_ids",
    "stale_index",
    "superseded_attempt",
    "supplied_ids",
]


class Bookkeeping(Protocol):
    """The dispatch columns of one event row that the attempt fences read."""

    @property
    def processed_at_ms(self) -> int | None: ...
    @property
    def failed_at_ms(self) -> int | None: ...
    @property
    def attempt_count(self) -> int: ...
    @property
    def claim_holder(self) -> str | None: ...
    @property
    def failure_count(self) -> int: ...
    @property
    def last_failed_attempt(self) -> int | None: ...


class FailVerdict(msgspec.Struct, frozen=True):
    """What ``fail_attempt`` answers, and whether it writes.

    ``record``: the attempt holds the claim, so the caller records the failure
    (``result.failure_count`` is the new count, the error and time, and
    ``failed_at`` when ``result.outcome`` is ``dead_lettered``) and clears the
    claim. Otherwise nothing is written.
    """

    result: FailResult
    record: bool


def retry_backoff_ms(failure_count: int) -> int:
    """How long after its last failure an event waits for a sweep's retry:
    1 s after the first, doubling, at most a minute (``1000 << min(n - 1, 6)``
    capped at 60,000, the same expression in every store's SQL). A drain
    running anyway (an append, a watchdog) retries it sooner."""
    if failure_count <= 0:
        return 0
    return min(1000 << min(failure_count - 1, 6), 60_000)


def no_event(session_id: str, index: int) -> ValueError:
    """The seed's ``TypeError`` for an index the session does not have."""
    return ValueError(f"no event at index {index} in session {session_id!r}")


def supplied_ids(events: Sequence[AppendEvent]) -> list[str]:
    """The ids an append batch supplies (store-postgres.ts ``append``).

    Raises:
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, the same id twice in the batch.
    """
    supplied = [e.id for e in events if e.id is not None]
    if len(set(supplied)) != len(supplied):
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH, "batch contains the same event id more than once"
        )
    return supplied


def replayed_batch(
    session_id: str, events: Sequence[AppendEvent], stored: Sequence[StoredEvent]
) -> list[StoredEvent]:
    """The duplicate-batch verdict (store-postgres.ts ``append``), for a batch
    some of whose ids are stored: the rows of a whole replay, in batch order.

    It comes before the attempt fence, as in the seed: a retried handler append
    replays even after its attempt was superseded.

    Args:
      stored: every stored row holding one of the batch's ids, in any session
        (not empty).

    Raises:
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, an id stored in another session
        (the least such id is named, as Postgres' ``min(event_id)``), stored and
        fresh ids mixed, or a stored id under another type (``replay``).
    """
    foreign = min((r.id for r in stored if r.session_id != session_id), default=None)
    if foreign is not None:
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH,
            f"event id {foreign!r} already exists in another session",
        )
    if len(stored) != len(events):
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH,
            f"batch mixes {len(stored)} already-appended and "
            f"{len(events) - len(stored)} fresh events",
        )
    return replay(events, stored)


def stale_index(session_id: str, expected: int, frontier: int) -> A2Error:
    """``INDEX_CONFLICT`` for a conditional append (``expected_index``) that
    found the session's log elsewhere: nothing was written."""
    return A2Error(
        ErrorCode.INDEX_CONFLICT,
        f"session {session_id!r} is at index {frontier}, not the expected {expected}",
        {"expected": expected, "index": frontier},
    )


def superseded_attempt(session_id: str, cause: EventCause) -> A2Error:
    """``SUPERSEDED_ATTEMPT`` for a handler append whose attempt lost its event."""
    return A2Error(
        ErrorCode.SUPERSEDED_ATTEMPT,
        f"attempt {cause.attempt} no longer owns event {cause.index} in session {session_id!r}",
    )


def check_cause(session_id: str, cause: EventCause, parent: Bookkeeping | None) -> None:
    """The attempt-currency fence on a handler append (store-postgres.ts
    ``append``): the cause's attempt must be the parent's latest, and the parent
    not dead-lettered. ``parent`` is the row at ``cause.index``, or None.

    Raises:
      ValueError: no event at ``cause.index``.
      A2Error: ``SUPERSEDED_ATTEMPT``.
    """
    if parent is None:
        raise no_event(session_id, cause.index)
    if parent.attempt_count != cause.attempt or parent.failed_at_ms is not None:
        raise superseded_attempt(session_id, cause)


def has_pending(had_pending: bool, events: Sequence[AppendEvent]) -> bool:
    """``hasPending`` after a written append (store-postgres.ts ``append``): the
    session had unprocessed events, or the batch adds one."""
    return had_pending or any(not e.settled for e in events)


def returned_ids(events: Sequence[AppendEvent]) -> list[str]:
    """The ids of a completion's returned events (store-postgres.ts
    ``completeAttempt``).

    Raises:
      ValueError: an event without an id (the server derives them).
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, the same id twice.
    """
    ids = [e.id for e in events if e.id is not None]
    if len(ids) != len(events):
        raise ValueError("returned events need ids (the server derives them)")
    if len(set(ids)) != len(ids):
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH,
            "returned event batch contains the same event id more than once",
        )
    return ids


def holds_claim(row: Bookkeeping, attempt: int) -> bool:
    """Whether ``attempt`` owns the event's live claim, the fence of
    completion and failure (store-postgres.ts ``completeAttempt``,
    ``failAttempt``): unprocessed, alive, the latest attempt, still held."""
    return (
        row.processed_at_ms is None
        and row.failed_at_ms is None
        and row.attempt_count == attempt
        and row.claim_holder is not None
    )


def returned_id_taken() -> A2Error:
    """A completion returning an id that is already stored (store-postgres.ts
    ``completeAttempt``)."""
    return A2Error(
        ErrorCode.PARTIAL_DUPLICATE_BATCH,
        "returned event batch contains an already-appended event id",
    )


def replays_completion(
    attempt: int,
    ids: list[str],
    processed_by_attempt: int | None,
    returned_event_ids: list[str] | None,
) -> bool:
    """For a completion of an already-processed event (store-postgres.ts
    ``completeAttempt``): True when this attempt processed it (replay with
    :func:`replayed_completion`), False when another did (``superseded``).

    Raises:
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, the same attempt returning other ids.
    """
    if processed_by_attempt != attempt:
        return False
    if returned_event_ids != ids:
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH,
            "completed attempt does not match the returned event batch",
        )
    return True


def replayed_completion(
    session_id: str,
    index: int,
    attempt: int,
    events: Sequence[AppendEvent],
    stored: Sequence[StoredEvent],
) -> list[StoredEvent]:
    """The committed returned events of a replayed completion, in batch order.

    Args:
      stored: the stored rows holding the returned ids (any order, any session).

    Raises:
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, an id not committed by this
        attempt of this event, or stored under another type.
    """
    by_id = {r.id: r for r in stored}
    for event in events:
        row = by_id.get(event.id or "")
        if (
            row is None
            or row.session_id != session_id
            or row.cause is None
            or (row.cause.index, row.cause.attempt) != (index, attempt)
        ):
            raise A2Error(
                ErrorCode.PARTIAL_DUPLICATE_BATCH,
                "returned event retry does not match the committed batch",
            )
    return replay(events, stored)


def fail_verdict(row: Bookkeeping, attempt: int, max_failures: int) -> FailVerdict:
    """The failure verdict (store-postgres.ts ``failAttempt``, its ``case``).

    The holder of the claim records a failure, dead-lettering at
    ``max_failures``. Any other call writes nothing: a processed event or a
    newer attempt is ``superseded``, a dead letter stays ``dead_lettered``, and
    a repeat by the attempt that failed last reports ``failed`` again.
    """
    if holds_claim(row, attempt):
        failures = row.failure_count + 1
        outcome: Literal["failed", "dead_lettered"] = (
            "dead_lettered" if failures >= max_failures else "failed"
        )
        return FailVerdict(FailResult(outcome, failures), record=True)
    if row.processed_at_ms is not None or row.attempt_count != attempt:
        result = FailResult("superseded", row.failure_count)
    elif row.failed_at_ms is not None:
        result = FailResult("dead_lettered", row.failure_count)
    elif row.claim_holder is None and row.last_failed_attempt == attempt:
        result = FailResult("failed", row.failure_count)
    else:
        result = FailResult("superseded", row.failure_count)
    return FailVerdict(result, record=False)


class ActionTarget(Bookkeeping, Protocol):
    """The columns an operator action's fence reads."""

    @property
    def claim_expires_at_ms(self) -> int | None: ...


def _live_claim(expires_at_ms: int | None, now_ms: int) -> bool:
    return expires_at_ms is not None and expires_at_ms > now_ms


def check_action(
    action: Literal["redrive", "skip"],
    session_id: str,
    index: int,
    row: ActionTarget | None,
    now_ms: int,
) -> None:
    """The fence of an operator's redrive or skip (an a2trio addition; issue
    18), over the target's row as read in the action's transaction.

    A live claim refuses both: the attempt running now decides, and an
    expired claim is fair game (its zombie's completion is then fenced by
    the processed row or the reset). A redrive needs a dead letter; a skip
    needs an unprocessed event (dead or alive).

    Raises:
      OperatorActionError: ``no_event``, ``claimed``, ``not_dead_lettered``,
        ``settled``.
    """
    if row is None:
        raise OperatorActionError("no_event", session_id, index, "does not exist")
    if _live_claim(row.claim_expires_at_ms, now_ms) and row.claim_holder is not None:
        raise OperatorActionError(
            "claimed",
            session_id,
            index,
            f"is claimed by {row.claim_holder!r} (attempt {row.attempt_count}) "
            f"until {row.claim_expires_at_ms}: wait for the attempt to end or its lease to lapse",
        )
    if action == "redrive" and row.failed_at_ms is None:
        raise OperatorActionError(
            "not_dead_lettered",
            session_id,
            index,
            "is not dead-lettered: only a dead letter can be redriven",
        )
    if action == "skip" and row.processed_at_ms is not None:
        raise OperatorActionError(
            "settled", session_id, index, "is already processed: nothing to skip"
        )


def retry_targets(
    session_id: str, candidates: Sequence[tuple[int, int | None]], now_ms: int
) -> list[int]:
    """The events a retry-now records (an a2trio addition; issue 18).

    Args:
      candidates: ``(index, claim_expires_at_ms)`` of the session's
        unprocessed, not dead-lettered, lane-ready events, by index.

    Returns the indexes without a live claim (failure backoff ignored).

    Raises:
      OperatorActionError: ``claimed`` when every candidate is under a live
        claim, ``nothing_to_retry`` when there is none.
    """
    targets = [index for index, expires in candidates if not _live_claim(expires, now_ms)]
    if targets:
        return targets
    if candidates:
        raise OperatorActionError(
            "claimed", session_id, None, "has its work under live claims: its drain is running"
        )
    raise OperatorActionError(
        "nothing_to_retry", session_id, None, "has no event to retry (dead letters need a redrive)"
    )
