"""The stored not-before instant (issue 33): ``release_attempt``,
``fail_attempt(retry_after_ms=...)``, and how claims, the sweep and lanes
honour it (``rules.ripe``)."""

from __future__ import annotations

from ..base import Settled, Store
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
)

__all__ = [
    "check_fail_attempt_stores_a_retry_at",
    "check_not_before_holds_its_lane_and_the_sweep",
    "check_release_attempt",
]


async def _swept(store: Store, sid: str) -> bool:
    if store.sweep is None:
        raise CapabilityMissing("sweep")
    return sid in await store.sweep.claimable_sessions(sid, limit=10)


async def check_release_attempt(open_store: StoreFactory) -> None:
    """A release gives the claim up without a failure; no claim takes the
    event before its not-before (exactly then, one does, at the next
    attempt); only the attempt holding the claim releases."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("release")
        await append_n(store, sid, 1)
        claimed_events(await claim(store, sid))
        released = await store.release_attempt(sid, index=1, attempt=1, delay_ms=5_000)
        assert (released.outcome, released.not_before_ms) == ("released", T0 + 5_000), released
        [row] = await store.read(sid)
        assert row.not_before_ms == T0 + 5_000, row
        assert (row.claim_holder, row.claim_expires_at_ms) == (None, None), row
        assert (row.attempt_count, row.failure_count, row.last_error) == (1, 0, None), row
        again = await store.release_attempt(sid, index=1, attempt=1, delay_ms=1)
        assert again.outcome == "superseded", f"a repeat release: {again!r}"
        assert (await store.read(sid))[0].not_before_ms == T0 + 5_000, "a repeat wrote"
        clock.advance(4_999)
        early = await claim(store, sid, holder="h2")
        assert isinstance(early, Settled), f"claimed 1 ms before its not-before: {early!r}"
        clock.advance(1)
        [taken] = claimed_events(await claim(store, sid, holder="h2"))
        assert (taken.index, taken.attempt_count, taken.claim_holder) == (1, 2, "h2"), taken
        stale = await store.release_attempt(sid, index=1, attempt=1, delay_ms=1_000)
        assert stale.outcome == "superseded", f"an old attempt released: {stale!r}"
        done = await store.complete_attempt(sid, index=1, attempt=2, events=[])
        assert done.outcome == "completed", done
        settled = await store.release_attempt(sid, index=1, attempt=2, delay_ms=1_000)
        assert settled.outcome == "superseded", f"a processed event released: {settled!r}"
        try:
            await store.release_attempt(sid, index=9, attempt=1, delay_ms=1)
        except ValueError:
            pass
        else:
            raise AssertionError("release_attempt of a missing index did not raise ValueError")


async def check_fail_attempt_stores_a_retry_at(open_store: StoreFactory) -> None:
    """``retry_after_ms`` stores the failure's retry-at, which holds every
    claim back until it comes; a dead letter and a failure without it store
    none (the seed's rule: a claim may retry at once)."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("retry-at")
        await append_n(store, sid, 1)
        claimed_events(await claim(store, sid))
        failed = await store.fail_attempt(
            sid, index=1, attempt=1, error="e1", max_failures=3, retry_after_ms=2_500
        )
        assert (failed.outcome, failed.failure_count, failed.retry_at_ms) == (
            "failed",
            1,
            T0 + 2_500,
        ), failed
        assert (await store.read(sid))[0].not_before_ms == T0 + 2_500
        repeat = await store.fail_attempt(
            sid, index=1, attempt=1, error="e1", max_failures=3, retry_after_ms=9_000
        )
        assert (repeat.outcome, repeat.retry_at_ms) == ("failed", None), repeat
        assert (await store.read(sid))[0].not_before_ms == T0 + 2_500, "a repeat wrote"
        clock.advance(2_499)
        assert isinstance(await claim(store, sid), Settled), "claimed before its retry-at"
        clock.advance(1)
        claimed_events(await claim(store, sid))
        plain = await store.fail_attempt(sid, index=1, attempt=2, error="e2", max_failures=3)
        assert (plain.outcome, plain.retry_at_ms) == ("failed", None), plain
        assert (await store.read(sid))[0].not_before_ms is None, "the old retry-at stayed"
        claimed_events(await claim(store, sid))
        dead = await store.fail_attempt(
            sid, index=1, attempt=3, error="e3", max_failures=3, retry_after_ms=1_000
        )
        assert (dead.outcome, dead.retry_at_ms) == ("dead_lettered", None), dead
        assert (await store.read(sid))[0].not_before_ms is None, "a dead letter kept a retry-at"


async def check_not_before_holds_its_lane_and_the_sweep(open_store: StoreFactory) -> None:
    """A lane head waiting for its not-before still heads its lane (the
    next event waits behind it), events outside the lane are claimed, and
    the sweep finds the session only once the instant comes."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("not-before-lane")
        await store.append(sid, [ev(lane="a"), ev(lane="a")])
        claimed_events(await claim(store, sid))
        await store.release_attempt(sid, index=1, attempt=1, delay_ms=3_000)
        assert isinstance(await claim(store, sid), Settled), "the lane moved past its head"
        if store.sweep is not None:
            assert not await _swept(store, sid), "swept before the not-before"
        await store.append(sid, [ev()])
        assert indexes_of(claimed_events(await claim(store, sid))) == [3]
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        clock.advance(3_000)
        if store.sweep is not None:
            assert await _swept(store, sid), "not swept once the not-before came"
        assert indexes_of(claimed_events(await claim(store, sid))) == [1]
