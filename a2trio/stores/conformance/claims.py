"""Claims: ``claim_available`` (limits, concurrent holders, ``exclude``,
``Busy``, lanes, dead letters), the sweep (``claimable_sessions``) and
``renew_claims``."""

from __future__ import annotations

from uuid import uuid4

import trio

from ..base import Busy, Claimed, ClaimRef, RenewResult, Settled
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
    new_uid,
)

__all__ = [
    "check_claim_available",
    "check_claim_concurrent_holders",
    "check_claim_dead_letters_block_their_lane",
    "check_claim_exclude_and_busy",
    "check_claim_lane_hand_off_to_returned_events",
    "check_claim_lanes",
    "check_claim_limit",
    "check_claimable_sessions",
    "check_renew_claims",
]


async def check_claim_available(open_store: StoreFactory) -> None:
    """Claims every eligible event in order; live claims block, expired ones re-claim."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("claim")
        assert await claim(store, sid) == Settled()
        await append_n(store, sid, 3)
        clock.advance(5)
        first = claimed_events(await claim(store, sid, "h1", ttl_ms=1_000))
        assert indexes_of(first) == [1, 2, 3]
        for row in first:
            assert row.attempt_count == 1
            assert row.claim_holder == "h1"
            assert row.claim_expires_at_ms == T0 + 5 + 1_000
            assert row.first_claimed_at_ms == row.last_claimed_at_ms == T0 + 5
        assert await store.read(sid) == first, "the claim is stored as returned"
        assert await claim(store, sid, "h2") == Busy(T0 + 5 + 1_000)
        clock.advance(999)
        assert await claim(store, sid, "h2") == Busy(T0 + 5 + 1_000)
        clock.advance(1)
        # A claim lapses exactly at its expiry.
        second = claimed_events(await claim(store, sid, "h2", ttl_ms=300))
        assert indexes_of(second) == [1, 2, 3]
        for row in second:
            assert row.attempt_count == 2
            assert row.claim_holder == "h2"
            assert row.claim_expires_at_ms == T0 + 1_005 + 300
            assert row.first_claimed_at_ms == T0 + 5
            assert row.last_claimed_at_ms == T0 + 1_005
        for index in (1, 2, 3):
            done = await store.complete_attempt(sid, index=index, attempt=2, events=[])
            assert done.outcome == "completed"
        assert await claim(store, sid) == Settled()
        assert not (await store.append(sid, [])).has_pending


async def check_claim_limit(open_store: StoreFactory) -> None:
    """``limit`` claims at most that many, lowest indexes first; the rest stay
    claimable, and exclusions do not count against it."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("claim-limit")
        await append_n(store, sid, 5)
        first = claimed_events(await store.claim_available(sid, holder="h", ttl_ms=1_000, limit=2))
        assert indexes_of(first) == [1, 2]
        rest = await store.claim_available(sid, holder="h", ttl_ms=1_000, exclude=[3], limit=1)
        assert indexes_of(claimed_events(rest)) == [4]
        assert indexes_of(claimed_events(await claim(store, sid))) == [3, 5]


async def check_claim_concurrent_holders(open_store: StoreFactory) -> None:
    """Holders claiming at once never share an event."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("holders")
        await append_n(store, sid, 12)
        won: dict[str, list[int]] = {}

        async def holder(name: str) -> None:
            result = await claim(store, sid, name, ttl_ms=60_000)
            won[name] = indexes_of(result.events) if isinstance(result, Claimed) else []

        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(holder, f"h{n}")
        claimed = sorted(i for indexes in won.values() for i in indexes)
        assert claimed == list(range(1, 13)), f"claims overlap or miss: {won}"
        rows = await store.read(sid)
        assert all(r.attempt_count == 1 for r in rows)
        assert {r.index: r.claim_holder for r in rows} == {
            i: name for name, indexes in won.items() for i in indexes
        }


async def check_claim_exclude_and_busy(open_store: StoreFactory) -> None:
    """``exclude`` skips indexes; an explicit expiry wins; Busy names the earliest."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("busy")
        await append_n(store, sid, 3)
        one = claimed_events(
            await store.claim_available(
                sid, holder="h1", ttl_ms=10, expires_at_ms=T0 + 5_000, exclude=[2, 3]
            )
        )
        assert indexes_of(one) == [1]
        assert one[0].claim_expires_at_ms == T0 + 5_000
        two = claimed_events(
            await store.claim_available(sid, holder="h2", ttl_ms=2_000, exclude=[3])
        )
        assert indexes_of(two) == [2]
        assert two[0].claim_expires_at_ms == T0 + 2_000
        # Index 3 is free but excluded, and excluded events never make a store Busy.
        assert await store.claim_available(sid, holder="h3", ttl_ms=1, exclude=[3]) == Busy(
            T0 + 2_000
        )
        three = claimed_events(await claim(store, sid, "h3", ttl_ms=9_000))
        assert indexes_of(three) == [3]
        assert await claim(store, sid, "h4") == Busy(T0 + 2_000)
        clock.advance(2_000)
        again = claimed_events(await claim(store, sid, "h4"))
        assert [(e.index, e.attempt_count) for e in again] == [(2, 2)]
        assert await claim(store, sid, "h5") == Busy(T0 + 3_000)

        idle = new_sid("busy-excluded")
        await append_n(store, idle, 1)
        assert await store.claim_available(idle, holder="h", ttl_ms=1, exclude=[1]) == Settled()


async def check_claim_lanes(open_store: StoreFactory) -> None:
    """Only a lane's oldest unprocessed event is claimable; completion hands on."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("lanes")
        await store.append(
            sid,
            [
                ev("a", lane="x"),
                ev("b", lane="x"),
                ev("c", lane="y"),
                ev("d"),
                ev("s", lane="x", settled=True),
                ev("e", lane="x"),
            ],
        )
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 3, 4]
        assert (await store.complete_attempt(sid, index=1, attempt=1, events=[])).outcome == (
            "completed"
        )
        # The settled event 5 is processed, so it never holds the lane.
        assert indexes_of(claimed_events(await claim(store, sid))) == [2]
        failed = await store.fail_attempt(sid, index=2, attempt=1, error="e", max_failures=5)
        assert failed.outcome == "failed"
        retried = claimed_events(await claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retried] == [(2, 2)]
        await store.complete_attempt(sid, index=2, attempt=2, events=[])
        assert indexes_of(claimed_events(await claim(store, sid))) == [6]

        # A lane whose head completed is ready for a later append at once.
        await store.complete_attempt(sid, index=6, attempt=1, events=[])
        late = await store.append(sid, [ev("f", lane="x")])
        assert indexes_of(claimed_events(await claim(store, sid))) == [late.events[0].index]


async def check_claim_lane_hand_off_to_returned_events(open_store: StoreFactory) -> None:
    """A returned event in the parent's lane waits behind older lane events."""
    async with open_store(ManualClock()) as store:
        alone, queued = new_sid("hand-alone"), new_sid("hand-queued")
        await store.append(alone, [ev("a", lane="x")])
        claimed_events(await claim(store, alone))
        child = new_uid("child")
        done = await store.complete_attempt(
            alone, index=1, attempt=1, events=[ev("c", id=child, lane="x")]
        )
        assert indexes_of(done.events) == [2]
        assert indexes_of(claimed_events(await claim(store, alone))) == [2]

        await store.append(queued, [ev("a", lane="x"), ev("b", lane="x")])
        claimed_events(await claim(store, queued))
        await store.complete_attempt(
            queued, index=1, attempt=1, events=[ev("c", id=new_uid("child"), lane="x")]
        )
        assert indexes_of(claimed_events(await claim(store, queued))) == [2]
        await store.complete_attempt(queued, index=2, attempt=1, events=[])
        assert indexes_of(claimed_events(await claim(store, queued))) == [3]


async def check_claim_dead_letters_block_their_lane(open_store: StoreFactory) -> None:
    """A dead letter is never claimable and stalls the rest of its lane."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("dead-lane")
        await store.append(sid, [ev("a", lane="z"), ev("b", lane="z"), ev("free")])
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 3]
        dead = await store.fail_attempt(sid, index=1, attempt=1, error="e", max_failures=1)
        assert dead.outcome == "dead_lettered"
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        assert await claim(store, sid) == Settled()
        assert (await store.append(sid, [])).has_pending, "a stalled lane is still pending"


async def check_claimable_sessions(open_store: StoreFactory) -> None:
    """The sweep finds exactly the sessions a claim would take work from now:
    pending, claims expired, failures past their backoff; not live claims,
    processed or dead-lettered sessions, nor another prefix's."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sweep = store.sweep
        if sweep is None:
            raise CapabilityMissing("sweep")
        prefix = f"sweep-{uuid4().hex[:8]}\x1f"
        pending, claimed, done, failed, dead = (prefix + n for n in "abcde")
        for key in (pending, claimed, done, failed, dead, f"other-{prefix}a"):
            await store.append(key, [ev("work")])
        await store.append(done, [ev("settled", settled=True)])
        claimed_events(await claim(store, claimed, ttl_ms=10_000))
        claimed_events(await claim(store, done))
        await store.complete_attempt(done, index=1, attempt=1, events=[])
        claimed_events(await claim(store, failed))
        await store.fail_attempt(failed, index=1, attempt=1, error="boom", max_failures=10)
        claimed_events(await claim(store, dead))
        await store.fail_attempt(dead, index=1, attempt=1, error="boom", max_failures=1)
        found = await sweep.claimable_sessions(prefix, limit=10)
        assert found == [pending], f"at once: {found!r}"
        clock.advance(1_000)  # the first failure's backoff has passed
        assert await sweep.claimable_sessions(prefix, limit=10) == [pending, failed]
        clock.advance(9_000)  # and the live claim has expired
        assert await sweep.claimable_sessions(prefix, limit=10) == [pending, claimed, failed]
        assert await sweep.claimable_sessions(prefix, limit=2) == [pending, claimed]
        claimed_events(await claim(store, failed))
        await store.fail_attempt(failed, index=1, attempt=2, error="boom", max_failures=10)
        clock.advance(1_000)  # the second failure waits 2 s
        assert failed not in await sweep.claimable_sessions(prefix, limit=10)
        clock.advance(1_000)
        assert failed in await sweep.claimable_sessions(prefix, limit=10)


async def check_renew_claims(open_store: StoreFactory) -> None:
    """Live claims of this holder renew; newer attempts supersede; expired ones neither."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("renew")
        await append_n(store, sid, 4)
        claimed_events(await claim(store, sid, "h1", ttl_ms=1_000))
        assert await store.renew_claims(sid, holder="h1", claims=[], ttl_ms=1) == RenewResult(
            [], []
        )
        clock.advance(500)
        renewed = await store.renew_claims(
            sid,
            holder="h1",
            claims=[ClaimRef(2, 1), ClaimRef(1, 1), ClaimRef(99, 1)],
            ttl_ms=1_000,
        )
        assert renewed == RenewResult([1, 2], [])
        explicit = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(4, 1)], ttl_ms=1, expires_at_ms=T0 + 9_000
        )
        assert explicit == RenewResult([4], [])
        wrong_holder = await store.renew_claims(
            sid, holder="h2", claims=[ClaimRef(3, 1)], ttl_ms=1_000
        )
        assert wrong_holder == RenewResult([], [])
        wrong_attempt = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(3, 0)], ttl_ms=1_000
        )
        assert wrong_attempt == RenewResult([], [3])
        rows = await store.read(sid)
        assert [r.claim_expires_at_ms for r in rows] == [
            T0 + 1_500,
            T0 + 1_500,
            T0 + 1_000,
            T0 + 9_000,
        ]
        clock.advance(500)
        # Claim 3 lapsed at exactly its expiry and nobody re-claimed it.
        lapsed = await store.renew_claims(sid, holder="h1", claims=[ClaimRef(3, 1)], ttl_ms=1_000)
        assert lapsed == RenewResult([], [])
        assert indexes_of(claimed_events(await claim(store, sid, "h2"))) == [3]
        superseded = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(3, 1), ClaimRef(1, 1)], ttl_ms=1_000
        )
        assert superseded == RenewResult([1], [3])
        await store.complete_attempt(sid, index=1, attempt=1, events=[])
        processed = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(1, 1)], ttl_ms=1_000
        )
        assert processed == RenewResult([], [])
        rows = await store.read(sid)
        assert rows[0].claim_expires_at_ms is None
        assert rows[2].claim_holder == "h2"
        assert rows[2].attempt_count == 2
