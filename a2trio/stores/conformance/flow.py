"""Flow limits across sessions (issue 33, ``rules.flow``): a row's
concurrency key counts against its limit in every session's claims; slots
are the live claims (freed by completion, failure or lapse, kept by
renewal); a row's throttle key counts its attempt starts in the period's
window; a keyed row is claimed at insert only while every alive row of its
key fits its limit (a store may leave it to the claim); the sweep skips a session
whose only work waits on a full key or window."""

from __future__ import annotations

from uuid import uuid4

from ..base import AppendEvent, Busy, Claimed, ClaimRef, ClaimRequest
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    claim,
    claimed_events,
    indexes_of,
    new_sid,
)

__all__ = [
    "check_concurrency_across_sessions",
    "check_concurrency_at_insert",
    "check_concurrency_slots_are_leases",
    "check_concurrency_with_lanes_and_the_sweep",
    "check_concurrency_within_a_session",
    "check_priority_orders_a_claim",
    "check_throttle_across_sessions",
    "check_throttle_within_a_session_and_the_sweep",
]


def keyed(key: str, limit: int, *, lane: str | None = None, n: int = 0) -> AppendEvent:
    """A note counted against ``key``'s ``limit``."""
    return AppendEvent("note", {"n": n}, lane=lane, concurrency_key=key, concurrency_limit=limit)


def throttled(key: str, limit: int, period_ms: int, *, n: int = 0) -> AppendEvent:
    """A note counted against throttle ``key``: ``limit`` starts per ``period_ms``."""
    return AppendEvent(
        "note",
        {"n": n},
        throttle_key=key,
        throttle_limit=limit,
        throttle_period_ms=period_ms,
    )


def new_key(name: str) -> str:
    """A concurrency key no other check uses (keys span sessions)."""
    return f"conformance\x1f{name}\x1f{uuid4().hex[:8]}"


async def check_concurrency_across_sessions(open_store: StoreFactory) -> None:
    """At most ``limit`` live claims per key across sessions; the rest wait
    (``Busy`` naming the key, due when the earliest slot lapses) and take a
    slot once a completion or a failure frees one; the key and limit are
    stored with the row."""
    clock = ManualClock()
    async with open_store(clock) as store:
        key = new_key("across")
        sids = [new_sid(f"flow-{i}") for i in range(3)]
        for sid in sids:
            await store.append(sid, [keyed(key, 2)])
        [row] = await store.read(sids[0])
        assert (row.concurrency_key, row.concurrency_limit) == (key, 2), "stored with the row"
        first = claimed_events(await claim(store, sids[0], "h1", ttl_ms=1_000))
        clock.advance(10)
        second = claimed_events(await claim(store, sids[1], "h2", ttl_ms=1_000))
        assert indexes_of(first) == indexes_of(second) == [1]
        waiting = await claim(store, sids[2], "h3")
        assert waiting == Busy(T0 + 1_000, [key]), (
            f"the key is full: Busy until its first slot lapses, naming it; got {waiting!r}"
        )
        done = await store.complete_attempt(sids[0], index=1, attempt=1, events=[])
        assert done.outcome == "completed"
        third = await claim(store, sids[2], "h3")
        assert isinstance(third, Claimed), f"a completion frees its slot; got {third!r}"
        assert indexes_of(third.events) == [1]
        failed = await store.fail_attempt(sids[1], index=1, attempt=1, error="boom", max_failures=3)
        assert failed.outcome == "failed"
        again = await claim(store, sids[1], "h5")
        assert isinstance(again, Claimed), f"a failure frees its slot; got {again!r}"
        assert again.events[0].attempt_count == 2, "the retry takes it"
        assert await claim(store, sids[1], "h6") == Busy(T0 + 10 + 1_000)


async def check_concurrency_slots_are_leases(open_store: StoreFactory) -> None:
    """A slot is the claim: a renewal keeps it past the first expiry, a lapse
    frees it (a crashed holder leaks nothing), and a dead letter frees it."""
    clock = ManualClock()
    async with open_store(clock) as store:
        key = new_key("lease")
        a, b = new_sid("flow-a"), new_sid("flow-b")
        await store.append(a, [keyed(key, 1)])
        await store.append(b, [keyed(key, 1)])
        claimed_events(await claim(store, a, "h1", ttl_ms=1_000))
        clock.advance(900)
        renewed = await store.renew_claims(a, holder="h1", claims=[ClaimRef(1, 1)], ttl_ms=1_000)
        assert renewed.renewed == [1]
        clock.advance(200)
        assert await claim(store, b, "h2") == Busy(T0 + 1_900, [key]), (
            "a renewed claim keeps its slot past its first expiry"
        )
        clock.advance(800)
        taken = await claim(store, b, "h2", ttl_ms=1_000)
        assert isinstance(taken, Claimed), f"a lapsed claim frees its slot; got {taken!r}"
        now = T0 + 1_900
        assert await claim(store, a, "h3") == Busy(now + 1_000, [key])
        dead = await store.fail_attempt(b, index=1, attempt=1, error="x", max_failures=1)
        assert dead.outcome == "dead_lettered"
        back = await claim(store, a, "h3")
        assert isinstance(back, Claimed), f"a dead letter frees its slot; got {back!r}"
        assert back.events[0].attempt_count == 2


async def check_concurrency_within_a_session(open_store: StoreFactory) -> None:
    """In one session the lowest indexes take the key's slots and the claim
    names the key it left waiting; unkeyed rows and other keys are not held
    back; an append with a claim request writes a key's rows unclaimed when
    they do not all fit its limit (a store may claim the others' at insert)."""
    clock = ManualClock()
    async with open_store(clock) as store:
        key, other = new_key("within"), new_key("other")
        sid = new_sid("flow-within")
        result = await store.append(
            sid,
            [
                keyed(key, 2, n=0),
                keyed(key, 2, n=1),
                keyed(key, 2, n=2),
                AppendEvent("note", {"n": 3}),
                keyed(other, 1, n=4),
            ],
            claim=ClaimRequest("h0", 1_000),
        )
        at_insert = indexes_of(result.claimed)
        assert at_insert in ([4], [4, 5]), (
            f"the unkeyed row is claimed at insert, a full key's never; got {at_insert}"
        )
        got = await claim(store, sid, "h1")
        assert isinstance(got, Claimed), got
        assert sorted(at_insert + indexes_of(got.events)) == [1, 2, 4, 5], (
            f"two slots of the key, the other key's one; got {got!r}"
        )
        assert got.waiting == [key], f"event 3 waits on its key; got {got!r}"
        assert await claim(store, sid, "h2") == Busy(T0 + 1_000, [key])
        await store.complete_attempt(sid, index=2, attempt=1, events=[])
        later = await claim(store, sid, "h2")
        assert isinstance(later, Claimed), later
        assert indexes_of(later.events) == [3]
        limited = await store.claim_available(sid, holder="h3", ttl_ms=1, limit=1)
        assert isinstance(limited, Busy), f"nothing is left to claim; got {limited!r}"


async def check_concurrency_at_insert(open_store: StoreFactory) -> None:
    """Appends with a claim request in several sessions never claim more of
    a key at insert than its limit leaves, counting the claims of other
    sessions and of the drain; what is not claimed at insert is claimed once
    a slot frees."""
    clock = ManualClock()
    async with open_store(clock) as store:
        key = new_key("insert")
        sids = [new_sid(f"flow-insert-{i}") for i in range(4)]
        claimed: dict[str, int] = {}
        for n, sid in enumerate(sids):
            result = await store.append(sid, [keyed(key, 2, n=n)], claim=ClaimRequest("h0", 1_000))
            if result.claimed:
                claimed[sid] = result.claimed[0].attempt_count
        assert len(claimed) <= 2, f"at most two slots of the key; got {sorted(claimed)}"
        for sid in sids:
            if sid not in claimed and len(claimed) < 2:
                claimed[sid] = claimed_events(await claim(store, sid, "h1"))[0].attempt_count
        assert len(claimed) == 2, f"the key's two slots are taken; got {sorted(claimed)}"
        waiting = [sid for sid in sids if sid not in claimed]
        for sid in waiting:
            assert await claim(store, sid, "h2") == Busy(T0 + 1_000, [key])
        late = new_sid("flow-insert-late")
        result = await store.append(late, [keyed(key, 2)], claim=ClaimRequest("h0", 1_000))
        assert result.claimed == [], "a full key's row is written unclaimed"
        done = sorted(claimed)[0]
        await store.complete_attempt(done, index=1, attempt=claimed[done], events=[])
        freed = await claim(store, waiting[0], "h3")
        assert isinstance(freed, Claimed), f"a completion frees a slot; got {freed!r}"
        assert await claim(store, late, "h3") == Busy(T0 + 1_000, [key])


async def check_concurrency_with_lanes_and_the_sweep(open_store: StoreFactory) -> None:
    """A lane's later events wait for their head as always; the sweep skips a
    session whose only work waits on a full key, and finds it once a slot
    frees."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sweep = store.sweep
        if sweep is None:
            raise CapabilityMissing("sweep")
        key = new_key("sweep")
        prefix = f"conformance-flow-sweep-{uuid4().hex[:8]}-"
        a, b = prefix + "a", prefix + "b"
        await store.append(a, [keyed(key, 1, lane="l"), keyed(key, 1, lane="l")])
        await store.append(b, [keyed(key, 1)])
        assert await sweep.claimable_sessions(prefix, limit=10) == [a, b]
        got = claimed_events(await claim(store, a, "h1", ttl_ms=1_000))
        assert indexes_of(got) == [1], "the lane holds its second event back"
        assert await sweep.claimable_sessions(prefix, limit=10) == [], (
            "both sessions' work waits on the full key or the lane: nothing to sweep"
        )
        await store.complete_attempt(a, index=1, attempt=1, events=[])
        assert await sweep.claimable_sessions(prefix, limit=10) == [a, b]
        taken = claimed_events(await claim(store, b, "h2"))
        assert indexes_of(taken) == [1]
        assert await claim(store, a, "h3") == Busy(T0 + 1_000, [key])
        assert await sweep.claimable_sessions(prefix, limit=10) == []


async def check_throttle_across_sessions(open_store: StoreFactory) -> None:
    """At most ``limit`` attempt starts per period per throttle key across
    sessions: the excess waits (``Busy`` naming the throttle, due when the
    window's first start leaves it); a completion frees nothing; a retry is
    a new start; the key, limit and period are stored with the row."""
    clock = ManualClock()
    async with open_store(clock) as store:
        key = new_key("throttle")
        sids = [new_sid(f"throttle-{i}") for i in range(3)]
        for sid in sids:
            await store.append(sid, [throttled(key, 2, 1_000)])
        [row] = await store.read(sids[0])
        assert (row.throttle_key, row.throttle_limit, row.throttle_period_ms) == (key, 2, 1_000)
        claimed_events(await claim(store, sids[0], "h1"))
        clock.advance(10)
        claimed_events(await claim(store, sids[1], "h2"))
        clock.advance(10)
        assert await claim(store, sids[2], "h3") == Busy(T0 + 1_000, [], [key]), (
            "two starts in the window: Busy until the first leaves it"
        )
        for sid in sids[:2]:
            done = await store.complete_attempt(sid, index=1, attempt=1, events=[])
            assert done.outcome == "completed"
        assert await claim(store, sids[2], "h3") == Busy(T0 + 1_000, [], [key]), (
            "a completion frees no start"
        )
        clock.advance(980)
        first = claimed_events(await claim(store, sids[2], "h3", ttl_ms=5_000))
        assert first[0].attempt_count == 1, "the first start left the window exactly at its end"
        failed = await store.fail_attempt(sids[2], index=1, attempt=1, error="boom", max_failures=3)
        assert failed.outcome == "failed"
        assert await claim(store, sids[2], "h4") == Busy(T0 + 1_010, [], [key]), (
            "a retry is a new start: the window holds two"
        )
        clock.advance(10)
        again = claimed_events(await claim(store, sids[2], "h4"))
        assert again[0].attempt_count == 2


async def check_throttle_within_a_session_and_the_sweep(open_store: StoreFactory) -> None:
    """In one session the lowest indexes take the window's starts and the
    claim names the throttle it left waiting; an append with a claim request
    writes throttled rows unclaimed; the sweep skips the session until the
    window has room."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sweep = store.sweep
        if sweep is None:
            raise CapabilityMissing("sweep")
        key = new_key("throttle-within")
        prefix = f"conformance-throttle-{uuid4().hex[:8]}-"
        sid = prefix + "a"
        result = await store.append(
            sid,
            [throttled(key, 2, 500, n=i) for i in range(3)],
            claim=ClaimRequest("h0", 1_000),
        )
        assert result.claimed == [], "throttled rows are not claimed at insert"
        got = await claim(store, sid, "h1", ttl_ms=5_000)
        assert isinstance(got, Claimed), got
        assert indexes_of(got.events) == [1, 2]
        assert got.throttled == [key], f"event 3 waits on its throttle; got {got!r}"
        assert await sweep.claimable_sessions(prefix, limit=10) == []
        clock.advance(500)
        assert await sweep.claimable_sessions(prefix, limit=10) == [sid]
        later = claimed_events(await claim(store, sid, "h2"))
        assert indexes_of(later) == [3]


async def check_priority_orders_a_claim(open_store: StoreFactory) -> None:
    """A claim considers its candidates higher priority first, then by index
    (``rules.claim_order``): its limit and a key's free slots go to them; the
    claimed events come back in index order; a lane still holds its later
    events back; the priority is stored with the row."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("priority")
        await store.append(
            sid,
            [AppendEvent("note", {"n": n}, priority=p) for n, p in enumerate((None, 5, 1, 5, -2))],
        )
        rows = await store.read(sid)
        assert [r.priority for r in rows] == [None, 5, 1, 5, -2], "stored with the row"
        first = await store.claim_available(sid, holder="h1", ttl_ms=1_000, limit=2)
        assert indexes_of(claimed_events(first)) == [2, 4], "the two of priority 5"
        second = await store.claim_available(sid, holder="h1", ttl_ms=1_000, limit=2)
        assert indexes_of(claimed_events(second)) == [1, 3], "then 1, then None (0)"
        last = await store.claim_available(sid, holder="h1", ttl_ms=1_000, limit=2)
        assert indexes_of(claimed_events(last)) == [5]
        key = new_key("priority")
        keyed_sid = new_sid("priority-keyed")
        await store.append(
            keyed_sid,
            [
                AppendEvent("note", {"n": n}, concurrency_key=key, concurrency_limit=1, priority=p)
                for n, p in enumerate((0, 9, 3))
            ],
        )
        got = await claim(store, keyed_sid, "h2")
        assert isinstance(got, Claimed), got
        assert indexes_of(got.events) == [2], "the key's one slot goes to priority 9"
        assert got.waiting == [key]
        laned = new_sid("priority-lane")
        await store.append(
            laned,
            [AppendEvent("note", {"n": n}, lane="l", priority=p) for n, p in enumerate((0, 9))],
        )
        assert indexes_of(claimed_events(await claim(store, laned, "h3"))) == [1], (
            "a lane's later event waits for its head, whatever its priority"
        )
