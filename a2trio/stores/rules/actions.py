"""The fences of an operator's redrive, skip and retry-now (an a2trio
addition; issue 18)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..base import OperatorActionError
from .dispatch import claim_free
from .rows import ActionTarget

__all__ = [
    "check_action",
    "retry_targets",
]


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
    if not claim_free(row.claim_expires_at_ms, now_ms) and row.claim_holder is not None:
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
    targets = [index for index, expires in candidates if claim_free(expires, now_ms)]
    if targets:
        return targets
    if candidates:
        raise OperatorActionError(
            "claimed", session_id, None, "has its work under live claims: its drain is running"
        )
    raise OperatorActionError(
        "nothing_to_retry", session_id, None, "has no event to retry (dead letters need a redrive)"
    )
