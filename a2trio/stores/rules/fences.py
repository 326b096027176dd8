"""The verdicts of appends, completions and failures: replays, partial
duplicates, returned ids, the attempt and completion fences, the failure and
dead-letter verdict (store-postgres.ts ``append``, ``completeAttempt``,
``failAttempt``), with the seed's codes and messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from ...errors import A2Error, ErrorCode
from ..base import AppendEvent, EventCause, FailResult, StoredEvent, replay
from .rows import Bookkeeping, Completion

__all__ = [
    "MAX_FAILED_ATTEMPTS",
    "CompleteVerdict",
    "FailVerdict",
    "ReleaseVerdict",
    "check_cause",
    "complete_verdict",
    "fail_verdict",
    "has_pending",
    "holds_claim",
    "journals",
    "no_event",
    "release_verdict",
    "replayed_batch",
    "replayed_completion",
    "replays_completion",
    "returned_id_taken",
    "returned_ids",
    "stale_index",
    "superseded_attempt",
    "supplied_ids",
]


class FailVerdict(msgspec.Struct, frozen=True):
    """What ``fail_attempt`` answers, and whether it writes.

    ``record``: the attempt holds the claim, so the caller records the failure
    (``result.failure_count`` is the new count, the error and time, and
    ``failed_at`` when ``result.outcome`` is ``dead_lettered``) and clears the
    claim. Otherwise nothing is written.
    """

    result: FailResult
    record: bool


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


def journals(session_id: str, index: int, attempt: int, row: Bookkeeping | None) -> None:
    """The attempt fence on a durable handler's journal write (issue 34): the
    step is written only by the attempt that holds the event's claim
    (:func:`holds_claim`, as a completion), so a superseded attempt's step
    never lands. ``row`` is the event's, or None. A repeat of a name already
    journaled is answered by the store after this fence.

    Raises:
      ValueError: no event at ``index``.
      A2Error: ``SUPERSEDED_ATTEMPT``.
    """
    if row is None:
        raise no_event(session_id, index)
    if not holds_claim(row, attempt):
        raise superseded_attempt(session_id, EventCause(index, attempt))


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


#: The most failed attempts a store keeps per event (``FailedAttempt``, the
#: error history inspection shows): the latest ones, the older dropped as a
#: new one is recorded. Bounded so that a handler that keeps failing (redriven
#: again and again) cannot grow its event's history without end.
MAX_FAILED_ATTEMPTS = 20


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


ReleaseVerdict = Literal["released", "superseded"]


def release_verdict(row: Bookkeeping, attempt: int) -> ReleaseVerdict:
    """The verdict of ``release_attempt`` (an a2trio addition; issue 33):
    ``released`` when ``attempt`` holds the claim (:func:`holds_claim`: the
    caller clears the claim and stores the not-before, spending no failure),
    else ``superseded`` and nothing is written."""
    return "released" if holds_claim(row, attempt) else "superseded"


CompleteVerdict = Literal["completed", "replay", "superseded"]


def complete_verdict(row: Completion, attempt: int, ids: list[str]) -> CompleteVerdict:
    """The completion verdict (store-postgres.ts ``completeAttempt``):
    ``completed`` writes (the attempt holds the claim: see
    :func:`holds_claim`, a lapsed but untaken claim still completes),
    ``replay`` answers the batch this attempt committed before
    (:func:`replayed_completion`), ``superseded`` writes nothing.

    Raises:
      A2Error: ``PARTIAL_DUPLICATE_BATCH``, a replay with other ids.
    """
    if row.processed_at_ms is not None:
        replays = replays_completion(attempt, ids, row.processed_by_attempt, row.returned_event_ids)
        return "replay" if replays else "superseded"
    return "completed" if holds_claim(row, attempt) else "superseded"
