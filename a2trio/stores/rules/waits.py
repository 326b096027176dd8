"""Suspended attempts' wake marks (issue 34): a durable ``wait_for`` (and a
sleep of a handler with ``abort_on``) releases its attempt with the event
types that must wake it (``release_attempt(wake_on=...)``), stored on the
row; an event of one of those types landing in the session (an append, a
completion's returned events) makes the row claimable at once.

A mark is *stale* once the row is claimed again (a rerun runs: it marks the
row anew if it suspends again) or settled; a store drops a stale mark when
it meets one, and never wakes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Literal, Protocol

from ..records import OperatorActionError
from .actions import check_action
from .dispatch import alive, ripe
from .rows import ActionTarget, Bookkeeping

__all__ = ["NEVER_MS", "WakeVerdict", "Waking", "check_wake", "wake_verdict", "wakes"]

#: The not-before of a release with no wake time (a ``wait_for`` without a
#: timeout): only a marked event, or an operator, wakes it. Below 10^14, as
#: every number the Redis scripts' cjson handles.
NEVER_MS: Final = 90_000_000_000_000

WakeVerdict = Literal["wake", "stale", "keep"]


def wakes(wake_on: Sequence[str], types: Iterable[str]) -> bool:
    """Whether events of ``types`` wake a row marked ``wake_on``. Also the
    release's own check over the events after what the attempt read
    (``seen_through``): one that landed meanwhile wakes it at once."""
    return any(t in wake_on for t in types)


def wake_verdict(row: Bookkeeping, wake_on: Sequence[str], types: Iterable[str]) -> WakeVerdict:
    """What an append of events of ``types`` does to a row marked ``wake_on``:
    ``wake`` (clear its not-before and its mark: claimable at once),
    ``stale`` (claimed again or settled: clear the mark only) or ``keep``."""
    if not alive(row) or row.claim_holder is not None:
        return "stale"
    return "wake" if wakes(wake_on, types) else "keep"


class Waking(ActionTarget, Protocol):
    """The columns an operator's wake reads."""

    @property
    def not_before_ms(self) -> int | None: ...


def check_wake(session_id: str, index: int, row: Waking | None, now_ms: int) -> None:
    """The fence of an operator's wake (issue 34): the event is alive, under
    no live claim (``check_action``'s) and held back by a not-before still
    to come (a suspended attempt's wake time); the store then clears the
    not-before and the wake mark, so a claim takes it at once.

    Raises:
      OperatorActionError: ``no_event``, ``claimed``, ``settled`` (processed
        or dead-lettered), ``not_waiting``.
    """
    check_action("skip", session_id, index, row, now_ms)
    assert row is not None
    if row.failed_at_ms is not None:
        raise OperatorActionError(
            "settled", session_id, index, "is dead-lettered: redrive it instead"
        )
    if ripe(row.not_before_ms, now_ms):
        raise OperatorActionError(
            "not_waiting", session_id, index, "is not held back by a wake time: nothing to wake"
        )
