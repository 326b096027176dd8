"""The SQLite claim of a session that holds keyed or prioritized rows
(``rules.flow``): concurrency keys, throttles, ``priority=``.

The write lock held since ``BEGIN IMMEDIATE`` serializes every claim, so the
live slots counted here are the ones the claim writes against. The
decisions are the rules' own, in Python: the candidates and each key's
slots are read through their indexes (``a2_events_dispatch_ready``,
``a2_events_concurrency``), each throttle's starts through
``a2_flow_starts_key`` (the expired ones deleted first), the chosen rows
claimed by key and their starts recorded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import NamedTuple

from .. import rules
from ..base import Busy, Claimed, ClaimResult, Settled
from . import sql

__all__ = ["claim_keyed"]


class _Candidate(NamedTuple):
    idx: int
    concurrency_key: str | None
    concurrency_limit: int | None
    throttle_key: str | None
    throttle_limit: int | None
    throttle_period_ms: int | None
    priority: int | None


def claim_keyed(
    conn: sqlite3.Connection,
    session_id: str,
    now: int,
    holder: str,
    expires_at: int,
    exclude: Sequence[int],
    limit: int | None,
) -> ClaimResult:
    """``claim_available`` over a session with keyed claimable rows."""
    excluded = set(exclude)
    candidates = sorted(
        (
            _Candidate(*row)
            for row in conn.execute(sql.CANDIDATES, (session_id, now))
            if row[0] not in excluded
        ),
        key=lambda r: rules.claim_order(r.priority, r.idx),
    )
    slots: dict[str, tuple[int, int | None]] = {}
    for row in candidates:
        key = row.concurrency_key
        if key is not None and key not in slots:
            count, first = conn.execute(sql.SLOTS, (key, now)).fetchone()
            slots[key] = (count, first)
    live = {key: count for key, (count, _) in slots.items()}
    starts: dict[str, tuple[int, int | None]] = {}
    for row in candidates:
        throttle = row.throttle_key
        if throttle is not None and throttle not in starts:
            conn.execute(sql.PRUNE_STARTS, (throttle, now))
            count, first = conn.execute(sql.STARTS, (throttle, now)).fetchone()
            starts[throttle] = (count, first)
    started = {key: count for key, (count, _) in starts.items()}
    chosen, waiting, throttled = rules.flow_select(candidates, live, started, limit)
    for row in chosen:
        if row.throttle_key is not None:
            conn.execute(sql.RECORD_START, (row.throttle_key, now + (row.throttle_period_ms or 0)))
    claimed = [
        sql.stored(
            conn.execute(sql.CLAIM_ONE, (session_id, now, holder, expires_at, r.idx)).fetchone()
        )
        for r in sorted(chosen, key=lambda r: r.idx)
    ]
    if claimed:
        return Claimed(claimed, waiting, throttled)
    (busy_at,) = conn.execute(sql.RETRY_AT, (session_id, now)).fetchone()
    retry_at = rules.flow_retry_at(
        busy_at, [slots[key][1] for key in waiting] + [starts[key][1] for key in throttled]
    )
    return Settled() if retry_at is None else Busy(retry_at, waiting, throttled)
