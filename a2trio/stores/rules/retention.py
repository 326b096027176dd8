"""The fences of retention (an a2trio addition; issue 35): when a store may
erase or archive a session.

No retention operation removes a session under work: a live claim (its
lease unexpired on the store's clock) on any of its events refuses it, since
its attempt is running and would complete into a hole. An expired claim is
fair game, as for the operator's actions (``check_action``).

A trim removes a session's processed events up to a snapshot and keeps the
last event, so the indexes go on; a trimmed session's first stored index is
then past 1, and a read whose range starts below it (``check_read``) is
refused with ``TRIMMED`` instead of answering a silent gap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol, TypeVar

from ...errors import A2Error, ErrorCode
from ..records import StoredEvent
from ..retention import RetentionError
from .dispatch import alive, claim_free

__all__ = [
    "HeldClaim",
    "Holding",
    "check_expected",
    "check_finished",
    "check_read",
    "check_trim",
    "check_unclaimed",
    "live_claim",
    "needs_first_index",
    "trim_point",
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


def trim_point(snapshot_index: int, index: int) -> int:
    """Where a trim at a snapshot of ``snapshot_index`` cuts a session whose
    last index is ``index``: the events at or below it go. The last event
    always stays, so the session's indexes go on from it."""
    return max(0, min(snapshot_index, index - 1))


def check_trim(
    session_id: str,
    reducer: str,
    snapshot_index: int | None,
    index: int,
    first_open: int | None,
) -> int:
    """The trim point of a session (see :func:`trim_point`).

    Args:
      snapshot_index: the reducer's snapshot's index, None without one.
      index: the session's last index.
      first_open: the lowest index of an unprocessed event (alive or dead), or None.

    Raises:
      RetentionError: ``no_snapshot``, ``unprocessed``.
    """
    if snapshot_index is None:
        raise RetentionError(
            "no_snapshot",
            session_id,
            f"has no snapshot of reducer {reducer!r}: read its state once "
            "(session.state) so one is written, then trim",
        )
    point = trim_point(snapshot_index, index)
    if first_open is not None and first_open <= point:
        raise RetentionError(
            "unprocessed",
            session_id,
            f"has event {first_open} unprocessed at or below the trim point {point}: "
            "let it run, or skip or redrive it, first",
        )
    return point


def needs_first_index(after_index: int, through_index: int | None, found: bool) -> bool:
    """Whether a read of ``(after_index, through_index]`` that found no row
    (``found`` False) must look up the session's first stored index to
    tell a trimmed range from an empty one. A read up to the frontier never
    does: the last event is never trimmed, so it would have found a row."""
    return not found and through_index is not None and through_index > after_index


def check_read(
    session_id: str, after_index: int, through_index: int | None, first_index: int | None
) -> None:
    """Refuse a read of ``(after_index, through_index]`` that starts below
    the session's trim point.

    Args:
      first_index: the first row the read found, or, when it found none and
        :func:`needs_first_index` says so, the session's first stored index
        (None: no rows).

    Raises:
      A2Error: ``TRIMMED`` (``details``: ``trimmedThrough``, the trim point).
    """
    empty = through_index is not None and through_index <= after_index
    if first_index is None or empty or first_index <= after_index + 1:
        return
    trimmed = first_index - 1
    raise A2Error(
        ErrorCode.TRIMMED,
        f"session {session_id!r} is trimmed through index {trimmed}: its events from "
        f"{after_index + 1} to {trimmed} were removed; read after {trimmed}",
        {"trimmedThrough": trimmed},
    )
