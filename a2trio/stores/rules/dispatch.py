"""Which events a claim takes and a sweep finds, lanes, renewals.

The claim-free test, claim eligibility, the not-before instant, the failure
backoff, lane readiness and hand-off, the renewal verdict (store-postgres.ts
``claimAvailable``, ``renewClaims``, the insert's and the completion's lane
columns).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar

from ...backoff import Backoff
from .rows import Bookkeeping, Claim, Debounced, Dispatch, Laned, Retrying

__all__ = [
    "EVENT_RETRY",
    "RETRY_CAP_MS",
    "RETRY_FIRST_MS",
    "RETRY_MAX_DOUBLINGS",
    "RenewVerdict",
    "alive",
    "busy_until",
    "claim_free",
    "claimable",
    "debounces",
    "drained",
    "due",
    "hands_on",
    "held",
    "next_in_lane",
    "ready_at_insert",
    "renew_verdict",
    "retry_backoff_ms",
    "ripe",
    "sweepable",
]

_R = TypeVar("_R", bound=Laned)


#: The failure backoff: a failed event waits ``RETRY_FIRST_MS`` after its
#: first failure, doubling per failure up to ``RETRY_MAX_DOUBLINGS`` times,
#: never more than ``RETRY_CAP_MS`` (1 s, 2 s, ... 32 s, then a minute). The
#: SQL and Lua spellings interpolate these numbers.
RETRY_FIRST_MS = 1_000
RETRY_MAX_DOUBLINGS = 6
RETRY_CAP_MS = 60_000
#: The same schedule as a :class:`~a2trio.backoff.Backoff` (no jitter: every
#: backend computes the same instant).
EVENT_RETRY = Backoff(base_s=RETRY_FIRST_MS / 1000, cap_s=RETRY_CAP_MS / 1000, jitter=0.0)


def retry_backoff_ms(failure_count: int) -> int:
    """How long after its last failure an event waits for a sweep's retry
    (:data:`RETRY_FIRST_MS` and friends). A drain running anyway (an append,
    a watchdog) retries it sooner: claims do not wait out the backoff."""
    if failure_count <= 0:
        return 0
    return round(EVENT_RETRY.delay(failure_count) * 1000)


def alive(row: Dispatch | Bookkeeping) -> bool:
    """Unprocessed and not dead-lettered: the event still has work."""
    return row.processed_at_ms is None and row.failed_at_ms is None


def claim_free(expires_at_ms: int | None, now_ms: int) -> bool:
    """No live claim: never claimed, released, or its lease lapsed (a claim
    expiring exactly now is free)."""
    return expires_at_ms is None or expires_at_ms <= now_ms


def ripe(not_before_ms: int | None, now_ms: int) -> bool:
    """No stored not-before instant, or it has come (an event whose
    not-before is exactly now is ripe). An a2trio addition (issue 33): a
    per-handler backoff's retry-at (``fail_attempt(retry_after_ms=...)``), a
    released attempt's wake time (``release_attempt``), a debounce window."""
    return not_before_ms is None or not_before_ms <= now_ms


def debounces(row: Debounced, type: str, key: str, now_ms: int) -> bool:
    """Whether appending a debounced event of ``type`` and ``key`` settles
    the earlier ``row`` of its session as skipped (an a2trio addition, issue
    33): the same type and key, alive, and not under a live claim (a running
    attempt is left alone; a lapsed claim is not running)."""
    return (
        row.type == type
        and row.debounce_key == key
        and row.processed_at_ms is None
        and row.failed_at_ms is None
        and claim_free(row.claim_expires_at_ms, now_ms)
    )


def claimable(row: Dispatch, now_ms: int) -> bool:
    """Claim eligibility (store-postgres.ts ``claimAvailable``): alive, first
    in its lane, free, and ripe (:func:`ripe`). The seed's failure backoff
    does not hold a claim back; a stored not-before does."""
    return (
        alive(row)
        and row.lane_ready
        and claim_free(row.claim_expires_at_ms, now_ms)
        and ripe(row.not_before_ms, now_ms)
    )


def held(row: Dispatch, now_ms: int) -> bool:
    """Alive, ready and under a live claim: what a ``Busy`` answer waits for."""
    return alive(row) and row.lane_ready and not claim_free(row.claim_expires_at_ms, now_ms)


def due(row: Retrying, now_ms: int) -> bool:
    """Never failed, or its failure backoff has passed."""
    if row.failure_count == 0:
        return True
    return (row.last_failed_at_ms or 0) + retry_backoff_ms(row.failure_count) <= now_ms


def sweepable(row: Retrying, now_ms: int) -> bool:
    """What a sweep (``claimable_sessions``) looks for: claimable (so ripe)
    and due."""
    return claimable(row, now_ms) and due(row, now_ms)


def busy_until(rows: Iterable[Dispatch], now_ms: int) -> int | None:
    """When the earliest live claim among ``rows`` lapses (a ``Busy``
    answer's ``retry_at_ms``), or None: nothing is held (``Settled``)."""
    return min(
        (r.claim_expires_at_ms for r in rows if held(r, now_ms) and r.claim_expires_at_ms),
        default=None,
    )


def ready_at_insert(lane: str | None, open_lanes: Iterable[str | None]) -> bool:
    """Lane readiness of a new row: no lane, or no unprocessed event of its
    lane in the session (dead letters are unprocessed: they block it).

    Args:
      open_lanes: the lanes of the session's unprocessed rows."""
    return lane is None or lane not in set(open_lanes)


def hands_on(row: Laned) -> bool:
    """Whether settling ``row`` (a completion, a skip) hands its lane on to
    the lane's next unprocessed event: it has a lane and was its head."""
    return row.lane is not None and row.lane_ready


def next_in_lane(lane: str, open_rows: Iterable[_R]) -> _R | None:
    """The lane's next head: its first unprocessed row.

    Args:
      open_rows: the session's unprocessed rows in index order, the row
        being settled excluded."""
    return next((r for r in open_rows if r.lane == lane), None)


def drained(open_rows: Iterable[Dispatch]) -> bool:
    """A completion's ``drained`` hint: nothing alive is left (only dead letters)."""
    return all(r.failed_at_ms is not None for r in open_rows)


RenewVerdict = Literal["renewed", "superseded", "lost"]


def renew_verdict(row: Claim | None, attempt: int, holder: str, now_ms: int) -> RenewVerdict:
    """The renewal verdict (store-postgres.ts ``renewClaims``): ``renewed``
    when ``holder``'s live claim of ``attempt`` stands, ``superseded`` when a
    newer attempt took the event (the holder stops its handler), ``lost``
    otherwise (settled, dead, released, lapsed or another holder's: nothing
    written, and the holder's next completion decides)."""
    if row is None:
        return "lost"
    if (
        row.attempt_count == attempt
        and row.processed_at_ms is None
        and row.failed_at_ms is None
        and row.claim_holder == holder
        and not claim_free(row.claim_expires_at_ms, now_ms)
    ):
        return "renewed"
    return "superseded" if row.attempt_count > attempt else "lost"
