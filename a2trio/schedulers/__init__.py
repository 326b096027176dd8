"""Schedulers: where delayed appends and watchdog drains wait.

* :class:`LocalScheduler` - Trio timers in this process; for tests and
  development.
* :class:`DurableScheduler` - a table in sqlite (one host) or Postgres (any
  number of processes); tasks survive restarts.

Both implement :class:`a2trio.Scheduler`; ``docs/schedules.md`` explains how
to write another (for example over an HTTP queue service).
"""

from __future__ import annotations

from ._engine import SchedulerStatistics
from .durable import DurableScheduler
from .local import LocalScheduler

__all__ = ["DurableScheduler", "LocalScheduler", "SchedulerStatistics"]
