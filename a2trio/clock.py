"""Clocks: where every stored timestamp comes from.

Stores stamp rows with epoch milliseconds from an injected :class:`Clock`,
never from the database's ``now()``: tests then control stored time and Trio
time together. :class:`TrioClock` maps Trio's clock onto epoch milliseconds,
so under ``trio.testing.MockClock`` claim expiry, presence TTLs and schedules
advance exactly as the lease scopes' deadlines do.
"""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import trio

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "TrioClock", "ms_to_datetime"]


@runtime_checkable
class Clock(Protocol):
    """A source of epoch milliseconds."""

    def now_ms(self) -> int:
        """Return the current time in whole epoch milliseconds."""
        ...


class SystemClock:
    """Wall-clock epoch milliseconds (``time.time()``)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class TrioClock:
    """Epoch milliseconds that follow Trio's clock: ``epoch_ms + current_time()``.

    Under ``MockClock(autojump_threshold=0)`` stored times jump with the virtual
    clock, so a 30 s lease lapses in the store at the same instant as in the
    drain. Must be read from inside ``trio.run`` or from a thread started by
    ``trio.to_thread``.

    Args:
      epoch_ms: the epoch time that Trio time 0 maps to. Default: a fixed,
        readable instant (2025-01-01T00:00:00Z) so test output is stable.
    """

    def __init__(self, epoch_ms: int = 1_735_689_600_000) -> None:
        self.epoch_ms = epoch_ms

    def now_ms(self) -> int:
        try:
            now = trio.current_time()
        except RuntimeError:
            # A store's worker thread (started by trio.to_thread) asks the run
            # loop, which is free while it waits for that thread.
            now = trio.from_thread.run_sync(trio.current_time)
        return self.epoch_ms + int(now * 1000)

    def __repr__(self) -> str:
        return f"TrioClock(epoch_ms={self.epoch_ms})"


# Cached: the events of a batch or a group commit share their millisecond,
# and every read builds one per event (0.8 µs each; a hit is 0.07 µs).
@functools.lru_cache(maxsize=1024)
def ms_to_datetime(ms: int) -> datetime:
    """An aware UTC datetime for epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
