"""Suspended attempts' wake marks (issue 34): ``release_attempt(wake_on=,
seen_through=)`` and the appends and completions that wake a marked row at
once (``rules.wake_verdict``, ``rules.wakes``)."""

from __future__ import annotations

from ..base import Claimed, ClaimResult, Store
from ..rules import NEVER_MS
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    claim,
    claimed_events,
    ev,
    new_sid,
)
from .operator import refused

__all__ = [
    "check_a_marked_event_wakes_a_released_attempt",
    "check_a_release_sees_what_landed_after_its_read",
    "check_a_stale_mark_wakes_nothing",
    "check_operator_wake",
]


async def _suspend(store: Store, sid: str, **kw: object) -> int | None:
    """The trigger appended, claimed at attempt 1 and released with ``kw``."""
    await store.append(sid, [ev("ordered")])
    claimed_events(await claim(store, sid))
    released = await store.release_attempt(sid, index=1, attempt=1, **kw)  # type: ignore[arg-type]
    assert released.outcome == "released", released
    return released.not_before_ms


def _indexes(result: ClaimResult) -> list[int]:
    return [e.index for e in result.events] if isinstance(result, Claimed) else []


async def check_a_marked_event_wakes_a_released_attempt(open_store: StoreFactory) -> None:
    """A release with ``wake_on`` and no wake time stores ``rules.NEVER_MS``;
    an append of another type leaves it asleep, one of a marked type (an
    append's, or a completion's returned event) makes it claimable at once,
    its not-before cleared."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("wake")
        not_before = await _suspend(store, sid, delay_ms=None, wake_on=["shipped", "cancelled"])
        assert not_before == NEVER_MS, not_before
        assert (await store.read(sid))[0].not_before_ms == NEVER_MS
        await store.append(sid, [ev("note")])
        clock.advance(3_600_000)
        assert _indexes(await claim(store, sid, holder="h2")) == [2], "an unmarked type woke it"
        await store.complete_attempt(sid, index=2, attempt=1, events=[])
        await store.append(sid, [ev("shipped")])
        woken = claimed_events(await claim(store, sid, holder="h3"))
        assert [(e.index, e.attempt_count) for e in woken] == [(1, 2), (3, 1)], woken
        assert woken[0].not_before_ms is None, woken
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        released = await store.release_attempt(
            sid, index=1, attempt=2, delay_ms=60_000, wake_on=["cancelled"]
        )
        assert released.not_before_ms == clock.now_ms() + 60_000, released
        await store.append(sid, [ev("note")])
        assert _indexes(await claim(store, sid, holder="h4")) == [4]
        done = await store.complete_attempt(
            sid, index=4, attempt=1, events=[ev("cancelled", id=f"{sid}-c")]
        )
        assert done.outcome == "completed", done
        taken = await claim(store, sid, holder="h5")
        assert _indexes(taken) == [1, 5], f"a returned event did not wake it: {taken!r}"


async def check_a_release_sees_what_landed_after_its_read(open_store: StoreFactory) -> None:
    """An event of a marked type after ``seen_through`` (it landed between
    the attempt's read and its release) releases claimable at once (the
    not-before now), with no mark; one at or before it, or one of another
    type after it, does not."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("landed")
        await store.append(sid, [ev("ordered"), ev("shipped"), ev("note")])
        assert _indexes(await claim(store, sid)) == [1, 2, 3]
        for index in (2, 3):
            await store.complete_attempt(sid, index=index, attempt=1, events=[])
        kept = await store.release_attempt(
            sid, index=1, attempt=1, delay_ms=5_000, wake_on=["shipped"], seen_through=2
        )
        assert kept.not_before_ms == T0 + 5_000, f"a seen shipment woke it: {kept!r}"
        assert _indexes(await claim(store, sid, holder="h2")) == []
        clock.advance(5_000)
        assert _indexes(await claim(store, sid, holder="h2")) == [1]
        woke = await store.release_attempt(
            sid, index=1, attempt=2, delay_ms=5_000, wake_on=["shipped"], seen_through=1
        )
        assert woke.not_before_ms == clock.now_ms(), f"the unseen shipment did not: {woke!r}"
        [taken] = claimed_events(await claim(store, sid, holder="h3"))
        assert (taken.index, taken.attempt_count) == (1, 3), taken


async def check_a_stale_mark_wakes_nothing(open_store: StoreFactory) -> None:
    """A mark goes stale once its row is claimed again (its wake time came):
    an event of its type then leaves the running claim alone, and after the
    rerun fails, neither clears its retry-at."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("stale")
        await _suspend(store, sid, delay_ms=1_000, wake_on=["shipped"])
        clock.advance(1_000)
        assert _indexes(await claim(store, sid, holder="h2", ttl_ms=60_000)) == [1]
        await store.append(sid, [ev("shipped")])
        row = (await store.read(sid))[0]
        assert (row.claim_holder, row.attempt_count) == ("h2", 2), row
        failed = await store.fail_attempt(
            sid, index=1, attempt=2, error="boom", max_failures=5, retry_after_ms=30_000
        )
        assert failed.retry_at_ms == clock.now_ms() + 30_000, failed
        await store.append(sid, [ev("shipped")])
        row = (await store.read(sid))[0]
        assert row.not_before_ms == clock.now_ms() + 30_000, f"a stale mark woke it: {row!r}"


async def check_operator_wake(open_store: StoreFactory) -> None:
    """An operator's wake makes a suspended attempt's event claimable at once
    (its not-before and its wake mark cleared, the action recorded); an
    event under a live claim, one no wake time holds back, a dead letter and
    a missing one are refused and nothing is written."""
    clock = ManualClock()
    async with open_store(clock) as store:
        ops = store.operator
        if ops is None:
            raise CapabilityMissing("operator")
        sid = new_sid("op-wake")
        await _suspend(store, sid, delay_ms=None, wake_on=["shipped"])
        await store.append(sid, [ev("note")])
        claimed_events(await claim(store, sid, holder="h2"))
        with refused("claimed"):
            await ops.wake(sid, 2, by="op", reason="r")
        clock.advance(1_000)
        with refused("not_waiting"):
            await ops.wake(sid, 2, by="op", reason="r")
        with refused("no_event"):
            await ops.wake(sid, 9, by="op", reason="r")
        woke = await ops.wake(sid, 1, by="ann", reason="shipped by hand")
        assert (woke.action, woke.index, woke.by, woke.at_ms) == ("wake", 1, "ann", T0 + 1_000)
        row = (await store.read(sid))[0]
        assert (row.not_before_ms, row.claim_holder) == (None, None), row
        assert _indexes(await claim(store, sid, holder="h3")) == [1, 2]
        with refused("claimed"):
            await ops.wake(sid, 1, by="op", reason="again")
        actions = await ops.read_actions(sid, after_index=0, through_index=2)
        assert [(a.action, a.index) for a in actions] == [("wake", 1)], actions
        await store.fail_attempt(sid, index=1, attempt=2, error="x", max_failures=1)
        with refused("settled"):
            await ops.wake(sid, 1, by="op", reason="dead")
