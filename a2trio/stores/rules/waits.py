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
from typing import Final, Literal

from .dispatch import alive
from .rows import Bookkeeping

__all__ = ["NEVER_MS", "WakeVerdict", "wake_verdict", "wakes"]

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
