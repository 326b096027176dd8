"""One exponential backoff for every retry, redelivery and reconnect."""

from __future__ import annotations

import random

from .errors import A2Error

__all__ = ["STORE_RECONNECT", "Backoff"]


class Backoff:
    """Exponential backoff with jitter and a cap: every wait-and-try-again of
    a2trio (a client's reconnects and push retries, the default reconnect
    policy; a scheduler's redelivery; a store listener's reconnects; the
    failure backoff of events, ``a2trio.stores.rules.EVENT_RETRY``).

    The delay of ``attempt`` n is ``min(cap_s, base_s * factor ** (n - 1))``,
    scaled by a random factor in ``[1 - jitter, 1]`` so that clients which lost
    one server together do not come back together ("full jitter" when
    ``jitter=1``). It never pauses; wrap it to pause on some errors::

        def policy(session_id, error, attempt):
            if error is not None and error.code is ErrorCode.FORBIDDEN:
                return False
            return DEFAULT_RECONNECT(session_id, error, attempt)

    Args:
      base_s: the first delay.
      factor: the growth per attempt.
      cap_s: the longest delay.
      jitter: the fraction of each delay that is random, in ``[0, 1]``.
      rng: the random source (seed one in tests).
    """

    def __init__(
        self,
        base_s: float = 0.5,
        factor: float = 2.0,
        cap_s: float = 30.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if base_s < 0 or cap_s < 0:
            raise ValueError(f"`base_s` and `cap_s` must be non-negative, got {base_s}, {cap_s}")
        if factor < 1:
            raise ValueError(f"`factor` must be at least 1, got {factor}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"`jitter` must be within [0, 1], got {jitter}")
        self.base_s = base_s
        self.factor = factor
        self.cap_s = cap_s
        self.jitter = jitter
        self._rng = rng or random.Random()

    def delay(self, attempt: int) -> float:
        """The jittered delay before try ``attempt`` (1-based; less counts as 1)."""
        ceiling = min(self.cap_s, self.base_s * self.factor ** min(max(attempt, 1) - 1, 64))
        return ceiling * (1 - self.jitter * self._rng.random())

    def __call__(self, session_id: str, error: A2Error | None, attempt: int) -> float:
        return self.delay(attempt)

    def __repr__(self) -> str:
        return (
            f"Backoff(base_s={self.base_s}, factor={self.factor}, "
            f"cap_s={self.cap_s}, jitter={self.jitter})"
        )


#: A store's connections that carry no request (the Postgres listener, the
#: Redis subscriber and command pool) reopen after 50 ms, doubling to 2 s.
#: No jitter: one process holds one such connection per server.
STORE_RECONNECT = Backoff(base_s=0.05, cap_s=2.0, jitter=0.0)
