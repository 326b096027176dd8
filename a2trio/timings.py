"""Time constants, overridable per server through one :class:`Timings` object."""

from __future__ import annotations

import msgspec

__all__ = ["DEFAULT_TIMINGS", "Timings"]


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Every duration the engine waits for, in seconds (Trio time).

    Attributes:
      claim_ttl_s: how long a claim lives without renewal (the seed's 30 s).
      heartbeat_s: renewal cadence; a third of the ttl leaves two missed beats
        of slack before a lease lapses.
      watchdog_grace_s: how long past a claim's expiry a scheduler-armed
        watchdog drain fires, so a live holder's renewal wins the race.
      renew_retry_s: delay before retrying a failed renewal, jittered to
        50-100 % so a fleet does not retry in step against a struggling store.
      scheduler_arm_timeout_s: an optional watchdog arm never holds an append
        longer than this.
      poll_active_s / poll_idle_s: adaptive polling for feeds without push
        notifications: fast while rows flow, doubling to the idle ceiling.
      notify_safety_s: with push notifications, re-read this often anyway so a
        lost notification delays a feed but never loses an event.
      presence_ttl_s: how long a presence value lives without a refreshing set.
      max_failures: failures before an event is dead-lettered.
      sweep_s: how often a server that runs handlers asks its store for
        sessions with claimable work (pending, claims expired, failures due),
        so work a crashed process left is taken up within ``claim_ttl_s +
        sweep_s`` with no scheduler and no further append. The watchdog grace:
        a scheduler's watchdog and the sweep rescue in the same time.
    """

    claim_ttl_s: float = 30.0
    heartbeat_s: float = 10.0
    watchdog_grace_s: float = 5.0
    renew_retry_s: float = 1.0
    scheduler_arm_timeout_s: float = 5.0
    poll_active_s: float = 0.025
    poll_idle_s: float = 2.0
    notify_safety_s: float = 10.0
    presence_ttl_s: float = 60.0
    max_failures: int = 10
    sweep_s: float = 5.0

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"Timings.{name} must be positive, got {value!r}")
        if self.heartbeat_s >= self.claim_ttl_s:
            raise ValueError(
                f"Timings.heartbeat_s ({self.heartbeat_s}) must be shorter than "
                f"claim_ttl_s ({self.claim_ttl_s}), or every lease lapses between beats"
            )


DEFAULT_TIMINGS = Timings()
Timings.__module__ = "a2trio"
