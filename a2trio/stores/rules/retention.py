"""The fences of retention (an a2trio addition; issue 35): when a store may
erase or archive a session.

No retention operation removes a session under work: a live claim (its
lease unexpired on the store's clock) on any of its events refuses it, since
its attempt is running and would complete into a hole. An expired claim is
fair game, as for the operator's actions (``check_action``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol, TypeVar

from ..records import StoredEvent
from ..retention import RetentionError
from .dispatch import alive, claim_free

__all__ = [
    "HeldClaim",
    "Holding",
    "check_expected",
    "check_finished",
    "check_unclaimed",
    "live_claim",
]


class Holding(Protocol):
    """The columns the claim fence reads, and the event's index."""

    @property
    def index(self) -> int: ...
    @property
    def claim_holder(self) -> str | None: ...
    @property
    def attempt_count(self) -> int: ...
    @property
    def claim_expires_at_ms(self) -> int | None: ...


H = TypeVar("H", bound=Holding)


@dataclasses.dataclass(frozen=True, slots=True)
class HeldClaim:
    """A live claim as a statement or script found it (a :class:`Holding`)."""

    index: int
    claim_holder: str | None
    attempt_count: int
    claim_expires_at_ms: int | None


def live_claim(rows: Iterable[H], now_ms: int) -> H | None:
    """The first of ``rows`` under a live claim, or None."""
    for row in rows:
        if row.claim_holder is not None and not claim_free(row.claim_expires_at_ms, now_ms):
            return row
    return None


def check_unclaimed(session_id: str, held: Holding | None) -> None:
    """Refuse a retention operation on a session with a live claim
    (``held``: :func:`live_claim`'s answer, or what a statement found so).

    Raises:
      RetentionError: ``claimed``.
    """
    if held is not None:
        raise RetentionError(
            "claimed",
            session_id,
            f"has event {held.index} claimed by {held.claim_holder!r} (attempt "
            f"{held.attempt_count}) until {held.claim_expires_at_ms}: wait for the attempt "
            "to end or its lease to lapse (stop the session's writers first)",
        )


def check_expected(session_id: str, expected_index: int | None, index: int) -> None:
    """An erasure that follows an export expects the session where the
    export left it (``index``: its last index now).

    Raises:
      RetentionError: ``changed``.
    """
    if expected_index is not None and index != expected_index:
        raise RetentionError(
            "changed",
            session_id,
            f"is at index {index}, not the {expected_index} expected: it changed since "
            "it was read (export it again)",
        )


def check_finished(session_id: str, events: Iterable[StoredEvent]) -> None:
    """An archive takes a finished session: no event with work left (dead
    letters may stay: nothing runs them unless redriven).

    Raises:
      RetentionError: ``unprocessed``.
    """
    for event in events:
        if alive(event):
            raise RetentionError(
                "unprocessed",
                session_id,
                f"has event {event.index} still to run: archive a finished session "
                "(let it run, or skip it, first)",
            )
