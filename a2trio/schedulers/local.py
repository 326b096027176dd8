"""The in-process scheduler: Trio timers over a dict of tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._engine import DEFAULT_LEASE_S, DEFAULT_MAX_IN_FLIGHT, QueueScheduler
from ._queue import MemoryQueue

if TYPE_CHECKING:
    from ..clock import Clock

__all__ = ["LocalScheduler"]


class LocalScheduler(QueueScheduler):
    """Delayed appends and watchdog drains on Trio timers in this process.

    Not durable: tasks live as long as this object, so they survive a
    server's restart in the same process but not the process. The default for
    tests and single-process development. With ``MockClock(autojump_threshold=0)``
    and a store and server on :class:`~a2trio.TrioClock`, a ``"30s"`` schedule
    fires at exactly +30 s of Trio time. Idempotent by
    :func:`~a2trio.scheduler.task_id` while a task is queued.

    Args:
      clock: epoch ms for due times; default: each bound server's ``clock``.
      lease_s: how long a delivery holds its task between renewals.
      max_in_flight: deliveries at once per bound server.

    ``schedule()`` works before any server is bound; the tasks wait for one.
    """

    _needs_open = False

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(MemoryQueue(), clock=clock, lease_s=lease_s, max_in_flight=max_in_flight)

    def __repr__(self) -> str:
        return "LocalScheduler()"
