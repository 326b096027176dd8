"""The lease window and the watchdogs that back it.

A claim lives ``claim_ttl_s`` without renewal. Whoever asks the store for a
claim (a drain's claim, an append's claim at insert, a heartbeat's renewal)
first takes a :class:`LeaseWindow` here, the one place that arithmetic is
written: the claim's ttl in ms; the *local lease estimate*, Trio time now +
ttl, taken before the request so it is never later than the store's stamp;
and when a watchdog drain is due if the claim is never renewed (expiry +
``watchdog_grace_s``, so a live holder's renewal wins the race).

A watchdog is a drain the scheduler delivers at a due time, rounded up to a
one-second slot. :class:`Watchdogs` arms at most one per (session, slot), as
the seed's ``startSchedulerArm`` does, in the background: a failed arm never
stops the drain or append that asked, and is forgotten so the next one tries
again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec
import trio

from ..clock import Clock
from ..scheduler import DrainTask, Scheduler
from ..stores.records import StoredEvent
from ..timings import Timings
from .background import Background

__all__ = ["LeaseWindow", "Watchdogs"]


class LeaseWindow(msgspec.Struct, frozen=True):
    """One claim request's window, taken just before the request.

    Attributes:
      ttl_ms: the claim's ttl, as the store takes it.
      expires_at: the local lease estimate (Trio time): the deadline of the
        lease scopes of the events claimed.
      watchdog_at_ms: when a watchdog drain is due (epoch ms, unslotted) if the
        claim lapses: its expiry on this clock plus the grace.
    """

    ttl_ms: int
    expires_at: float
    watchdog_at_ms: int


class Watchdogs:
    """The server's lease window and its watchdog arms (see the module docstring).

    Args:
      contract_name: the server's contract (its drain tasks name it).
      scheduler: where watchdog drains are armed; None arms nothing.
      timings: the claim ttl, heartbeat, grace and arm timeout.
      clock: epoch ms, the store's clock unless the server was given one.
      background: where arms run.
    """

    def __init__(
        self,
        contract_name: str,
        scheduler: Scheduler | None,
        timings: Timings,
        clock: Clock,
        background: Background,
    ) -> None:
        self.contract_name = contract_name
        self.scheduler = scheduler
        self.timings = timings
        self.clock = clock
        self.background = background
        self._armed: dict[tuple[str, int], float] = {}

    # -- the lease window -----------------------------------------------------

    def window(self) -> LeaseWindow:
        """The window of a claim asked for now (see :class:`LeaseWindow`)."""
        ttl_s = self.timings.claim_ttl_s
        ttl_ms = int(ttl_s * 1000)
        return LeaseWindow(
            ttl_ms=ttl_ms,
            expires_at=trio.current_time() + ttl_s,
            watchdog_at_ms=self.due_after(self.clock.now_ms() + ttl_ms),
        )

    def due_after(self, expires_at_ms: int) -> int:
        """When a watchdog is due for a claim that expires at ``expires_at_ms``."""
        return expires_at_ms + int(self.timings.watchdog_grace_s * 1000)

    # -- slots ----------------------------------------------------------------

    @staticmethod
    def slot(due_at_ms: int) -> int:
        """The one-second slot a watchdog due at ``due_at_ms`` is armed for."""
        return math.ceil(due_at_ms / 1000) * 1000

    @staticmethod
    def slot_floor(now_ms: int) -> int:
        """The slot that is due now (``dispatch`` arms it)."""
        return (now_ms // 1000) * 1000

    def claim_slot(self, session_id: str, slot_ms: int) -> bool:
        """Record (session, slot) as armed; False if it already is. Entries are
        forgotten a second after their slot, and on a failed arm
        (:meth:`forget_slot`)."""
        now = trio.current_time()
        for key in [k for k, forget_at in self._armed.items() if forget_at <= now]:
            del self._armed[key]
        key = (session_id, slot_ms)
        if key in self._armed:
            return False
        self._armed[key] = now + max(0.0, (slot_ms - self.clock.now_ms()) / 1000) + 1.0
        return True

    def forget_slot(self, session_id: str, slot_ms: int) -> None:
        """Forget an arm that failed, so the next one tries again."""
        self._armed.pop((session_id, slot_ms), None)

    # -- arming ---------------------------------------------------------------

    async def arm_now(self, session_id: str, slot_ms: int) -> None:
        """Ask the scheduler for a drain of ``session_id`` at ``slot_ms``.

        Raises:
          Exception: the scheduler's failure, as it raised it.

        Cancellation: the task is the scheduler's; asking again for the same
        slot is harmless (a drain is idempotent).
        """
        assert self.scheduler is not None
        await self.scheduler.schedule(DrainTask(self.contract_name, session_id, slot_ms))

    def arm(self, session_id: str, due_at_ms: int, *, grid_from_ms: int | None = None) -> None:
        """Arm a watchdog drain at the slotted due time, once per slot, in the
        background; a failure never stops the drain that asked.

        A drain a watchdog started passes that watchdog's due time as
        ``grid_from_ms``: ``due_at_ms`` is then rounded up to a whole number of
        heartbeats after it, so heartbeats re-arm the same slots instead of a
        new one per beat.
        """
        if self.scheduler is None or not self.background.is_open:
            return
        if grid_from_ms is not None:
            beat_ms = int(self.timings.heartbeat_s * 1000)
            beats = max(0, math.ceil((due_at_ms - grid_from_ms) / beat_ms))
            due_at_ms = grid_from_ms + beats * beat_ms
        slot = self.slot(due_at_ms)
        if self.claim_slot(session_id, slot):
            self.background.spawn(self._arm_background, session_id, slot)

    def wake(self, session_id: str, at_ms: int) -> None:
        """Arm a drain of ``session_id`` at exactly ``at_ms`` (epoch ms): the
        not-before a failure's backoff or a debounce stored, when the event
        becomes claimable (a slot would be up to a second late). Once per
        instant, in the background, as :meth:`arm`; without a scheduler the
        sweep finds the event instead."""
        if self.scheduler is None or not self.background.is_open:
            return
        if self.claim_slot(session_id, at_ms):
            self.background.spawn(self._arm_background, session_id, at_ms)

    def wake_delayed(self, session_id: str, rows: Iterable[StoredEvent]) -> None:
        """:meth:`wake` at the not-before of each of ``rows`` (just written:
        an append's, a completion's returned events) that waits for one, a
        debounce's period."""
        for row in rows:
            if row.not_before_ms is not None and row.processed_at_ms is None:
                self.wake(session_id, row.not_before_ms)

    async def _arm_background(self, session_id: str, slot_ms: int) -> None:
        try:
            with trio.fail_after(self.timings.scheduler_arm_timeout_s):
                await self.arm_now(session_id, slot_ms)
        except (Exception, trio.TooSlowError):
            self.forget_slot(session_id, slot_ms)
