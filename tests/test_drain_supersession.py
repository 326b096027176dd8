"""Drain supersession (``a2trio/drain.py``'s theory of operation), on the autojump clock.

A claim is superseded once the store hands its event to a newer attempt. The
drain learns it three ways, and in each the old attempt counts for nothing
(no completion, no failure, its returned events dropped):

* a renewal reports the newer attempt: the lease scope is cancelled at once;
* this drain re-claims an index it still tracks: the old entry is fenced and
  the new attempt runs;
* the old attempt returns anyway (it shielded itself past its lease): its
  completion comes back ``superseded`` from the store's attempt fence.

Plus the store failing under a failure: ``fail_attempt`` raising leaves the
claim to lapse (no failure spent) and a later drain retries.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

import a2trio
from a2trio.stores.base import Claimed
from a2trio.stores.memory import MemoryStore
from a2trio.testing import FaultyStore, RecordingTelemetry, open_harness

from .apps import Note, Ordered, Shipped, orders

TTL = a2trio.Timings().claim_ttl_s
HEARTBEAT = a2trio.Timings().heartbeat_s


def outcomes(telemetry: RecordingTelemetry, index: int) -> list[tuple[Any, Any]]:
    """(attempt, outcome) of each ``a2.event`` span of the event at ``index``."""
    return [
        (span.attributes["a2.event.attempt"], span.attributes.get("a2.event.outcome"))
        for span in telemetry.find("a2.event", {"a2.event.index": index})
    ]


async def test_a_renewal_reporting_a_newer_attempt_cancels_the_handler_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The stored clock steps forward 31 s (an NTP step on the database host):
    the store considers the claim expired and another holder takes it while
    the drain's own lease estimate still runs. The next heartbeat's renewal
    reports the newer attempt, and the handler is cancelled right then."""
    cancelled: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append((ctx.attempt, trio.current_time()))
            raise
        return orders.event("shipped", Shipped("a"))

    async with open_harness(orders, handlers={"ordered": ship}, scheduler=None) as app:
        session = app.session("s1")
        key = app.server.key("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        app.clock.epoch_ms += int(TTL * 1000) + 1_000
        other = await app.store.inner.claim_available(key, holder="other", ttl_ms=60_000)
        assert isinstance(other, Claimed)
        assert [(e.index, e.attempt_count) for e in other.events] == [(1, 2)]
        await app.advance(HEARTBEAT - 5)
        assert cancelled == [(1, HEARTBEAT)]
        assert app.store.statistics().calls["renew_claims"] == 1
        await app.settle()
        # Nothing completed or failed: the event is the other holder's attempt 2.
        found = await app.assert_outcome(session, 1, "pending", attempts=2, failures=0)
        assert found.returned_ids == []
        assert outcomes(app.telemetry, 1) == [(1, "superseded")]
        [drain] = app.telemetry.find("a2.drain")
        assert drain.attributes["a2.drain.outcome"] == "busy"
        assert drain.attributes["a2.drain.processed"] == 0
        # The other holder's attempt still completes through the fence.
        done = await app.store.inner.complete_attempt(key, index=1, attempt=2, events=[])
        assert done.outcome == "completed"
        await app.assert_log(session, ["ordered"])


async def test_a_re_claim_by_the_same_drain_fences_the_attempt_it_still_tracks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Renewals fail, the lease lapses at the ttl but the handler shields its
    cleanup and keeps running. An append wakes the drain, whose claim gets
    the lapsed event back as attempt 2: the old attempt is fenced, attempt 2
    runs, and what the old one returns later is dropped."""
    runs: list[tuple[int, float, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        start = trio.current_time()
        if ctx.attempt == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(TTL + 10)
        else:
            await trio.sleep(1)
        runs.append((ctx.attempt, start, trio.current_time()))
        return orders.event("shipped", Shipped(f"attempt {ctx.attempt}"))

    async with open_harness(orders, handlers={"ordered": ship}, scheduler=None) as app:
        session = app.session("s1")
        with app.store.fail("renew_claims"):
            await session.append(orders.event("ordered", Ordered("a")))
            await app.advance(TTL + 2)
            await session.append(orders.event("note", Note("wakes the drain")))
            await app.settle()
        assert runs == [(2, TTL + 2, TTL + 3), (1, 0.0, TTL + 10)]
        assert outcomes(app.telemetry, 1) == [(1, "superseded"), (2, "processed")]
        found = await app.assert_outcome(session, 1, "processed", attempts=2, failures=0)
        assert len(found.returned_ids) == 1
        [ordered, _, shipped] = await app.assert_log(session, ["ordered", "note", "shipped"])
        assert shipped.payload == Shipped("attempt 2")
        assert found.returned_ids == [shipped.id]
        assert ordered.index == 1


async def test_another_holder_re_claims_after_the_lease_lapsed_and_the_zombie_is_fenced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two servers on one store. The first's renewals fail, so its lease lapses
    at the ttl while its handler is in a shielded cleanup; the second server
    re-claims the event (attempt 2) and completes it. The first handler's
    late return comes back ``superseded``: its events are never stored."""
    inner = MemoryStore(clock=a2trio.TrioClock())
    flaky = FaultyStore(inner)
    flaky.fail("renew_claims")
    runs: list[tuple[str, int, float, float]] = []

    def handler(server_name: str, seconds: float) -> Any:
        async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
            start = trio.current_time()
            with trio.CancelScope(shield=True):
                await trio.sleep(seconds)
            runs.append((server_name, ctx.attempt, start, trio.current_time()))
            return orders.event("shipped", Shipped(server_name))

        return ship

    first_telemetry = RecordingTelemetry()
    first = a2trio.Server(
        orders,
        store=flaky,
        handlers={"ordered": handler("first", TTL + 20)},
        telemetry=first_telemetry,
    )
    second = a2trio.Server(orders, store=inner, handlers={"ordered": handler("second", 5)})
    async with first, second:
        await first.session("s1").append(orders.event("ordered", Ordered("a")))
        await trio.sleep(TTL - 1)
        busy = await second.drain("s1")
        assert (busy.outcome, busy.retry_at_ms) == ("busy", inner.clock.now_ms() + 1_000)
        await trio.sleep(1)
        result = await second.drain("s1")
        assert (result.settled, result.processed) == (True, 1)
        await first.settle()
    assert runs == [("second", 2, TTL, TTL + 5), ("first", 1, 0.0, TTL + 20)]
    assert outcomes(first_telemetry, 1) == [(1, "superseded")]
    [drain] = first_telemetry.find("a2.drain")
    assert drain.attributes["a2.drain.processed"] == 0
    history = await second.session("s1").history()
    assert [(e.type, e.payload) for e in history] == [
        ("ordered", Ordered("a")),
        ("shipped", Shipped("second")),
    ]
    [row, _] = await inner.read(second.key("s1"))
    assert (row.attempt_count, row.processed_by_attempt, row.failure_count) == (2, 2, 0)


async def test_a_failure_the_store_cannot_record_leaves_the_claim_to_lapse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[tuple[int, float]] = []

    async def flaky(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.attempt, trio.current_time()))
        if ctx.attempt == 1:
            raise RuntimeError("handler bug")

    async with open_harness(orders, handlers={"ordered": flaky}) as app:
        session = app.session("s1")
        with app.store.fail("fail_attempt", times=1) as fault:
            await session.append(orders.event("ordered", Ordered("a")))
            await app.settle()
        assert fault.fired == 1
        # Surrendered: no failure spent, and the claim is still the store's.
        await app.assert_outcome(session, 1, "pending", attempts=1, failures=0)
        assert outcomes(app.telemetry, 1) == [(1, "surrendered")]
        [span] = app.telemetry.find("a2.event")
        assert [type(e).__name__ for e in span.errors] == ["RuntimeError", "A2Error"]
        # The watchdog armed with the claim retries it once the claim lapsed.
        await app.advance(TTL + a2trio.Timings().watchdog_grace_s)
        assert attempts == [(1, 0.0), (2, TTL + a2trio.Timings().watchdog_grace_s)]
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=0)


async def test_a_renewal_failing_after_every_lease_lapsed_keeps_the_heartbeat_cadence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A renewal slower than the remaining lease fails after the lease lapsed
    (the handler is in a shielded cleanup): nothing is left to save, so the
    heartbeat does not retry and keeps its cadence. An append then wakes the
    drain, which re-claims the event; the next beat renews that claim."""
    runs: list[tuple[int, float, float]] = []
    renewals: list[tuple[float, list[tuple[int, int]]]] = []

    class Recording(MemoryStore):
        async def renew_claims(self, session_id: str, **kwargs: Any) -> Any:
            claims = [(c.index, c.attempt) for c in kwargs["claims"]]
            renewals.append((trio.current_time(), claims))
            return await super().renew_claims(session_id, **kwargs)

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        start = trio.current_time()
        if ctx.attempt == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(TTL + 10)
        else:
            await trio.sleep(12)
        runs.append((ctx.attempt, start, trio.current_time()))

    store = FaultyStore(Recording(clock=a2trio.TrioClock()))
    # The first renewal (t=10) hangs 25 s, then fails at t=35: past the lease (t=30).
    store.delay("renew_claims", seconds=25, times=1)
    store.fail("renew_claims", times=1, after=True)
    async with open_harness(orders, handlers={"ordered": ship}, store=store, scheduler=None) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(TTL + 8)
        await session.append(orders.event("note", Note("wakes the drain")))
        await app.settle()
    assert runs == [(1, 0.0, TTL + 10), (2, TTL + 8, TTL + 20)]
    # The failed renewal answered at t=35 (the delay came first); the next beat
    # is 10 s later, not a jittered retry.
    assert renewals == [(HEARTBEAT + 25, [(1, 1)]), (HEARTBEAT + 35, [(1, 2)])]
