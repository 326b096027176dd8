"""Durable waits and sleeps (issue 34): ``ctx.wait_for`` and ``ctx.sleep`` /
``ctx.sleep_until`` on the autojump clock (the memory store).

A wait answers the first matching event after the trigger, or None at its
timeout, counted from the journaled instant it began; its answer is
journaled, so a rerun answers the same. A short sleep sleeps in the attempt;
a long one suspends it: the claim released with no failure, the event not
claimable until the wake instant, when the handler reruns with its steps
answered from the journal.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import open_harness

from .apps import Cancelled, Ordered, Shipped, orders

TTL = a2trio.Timings().claim_ttl_s
DAY = 24 * 3600.0


async def test_wait_for_answers_the_first_matching_event_after_the_trigger(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[float, int | None]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        item = ctx.event.payload.item
        found = await ctx.wait_for("shipped", where=lambda e: e.payload.item == item)
        seen.append((trio.current_time(), None if found is None else found.index))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        # Before the trigger: not an answer.
        await session.append(orders.event("shipped", Shipped("book")))
        await session.append(orders.event("ordered", Ordered("book")))
        await app.advance(10)
        await session.append(orders.event("shipped", Shipped("pen")))
        await app.advance(10)
        assert seen == []
        await session.append(orders.event("shipped", Shipped("book")))
        await app.advance(1)
        # Suspended (no timeout): each shipment wakes it, the pen's to no
        # answer (attempt 2 suspends again), the book's to its answer.
        await app.assert_outcome(session, 2, "processed", attempts=3)
    assert seen == [(20.0, 4)]


async def test_an_event_already_in_the_log_answers_at_once_and_a_rerun_answers_the_same(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[int, float, Any]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        found = await ctx.wait_for("shipped")
        seen.append((ctx.attempt, trio.current_time(), found and found.payload))
        if ctx.attempt == 1:
            raise RuntimeError("after the wait")

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(
            orders.event("ordered", Ordered("a")), orders.event("shipped", Shipped("first"))
        )
        await app.advance(0.5)
        await session.append(orders.event("shipped", Shipped("second")))
        await app.advance(60)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
    first = Shipped("first")
    assert [(a, payload) for a, _, payload in seen] == [(1, first), (2, first)]
    assert seen[0][1] == 0.0


async def test_a_wait_times_out_from_when_it_began_and_a_rerun_keeps_the_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Attempt 1's renewals fail, so its lease lapses mid-wait (at the claim
    ttl) and attempt 2 waits on: its timeout still counts from attempt 1's
    start, so it answers None at 100 s, not 100 s after it began."""
    seen: list[tuple[int, float, object]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        found = await ctx.wait_for("shipped", timeout=100)
        seen.append((ctx.attempt, trio.current_time(), found))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        app.store.fail("renew_claims", end=TTL + 5)
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(150)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=0)
        # A shipment after the timeout changes nothing for this trigger.
        await session.append(orders.event("shipped", Shipped("a")))
        await app.advance(1)
    assert seen == [(2, 100.0, None)]


async def test_wait_for_refuses_an_unknown_type_and_a_negative_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raised: list[str] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        for type_, timeout in (("refunded", None), ("shipped", -1)):
            try:
                await ctx.wait_for(type_, timeout=timeout)
            except ValueError as exc:
                raised.append(str(exc))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.advance(1)
    assert raised == [
        "contract 'orders' has no event type 'refunded' to wait for",
        "timeout must be a non-negative number of seconds, got -1",
    ]


async def test_abort_on_cancels_a_waiting_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        try:
            await ctx.wait_for("shipped", timeout=DAY)
        except trio.Cancelled:
            log.append(("cancelled", trio.current_time()))
            raise

    handlers = {"ordered": a2trio.handler(ship, abort_on=["cancelled"])}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(300)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.advance(1)
        # The wait suspended its attempt; the abort woke it, and attempt 2
        # was aborted at once (its first await cancelled).
        await app.assert_outcome(session, 1, "aborted", attempts=2)
    assert log == [("cancelled", 300.0)]


async def test_a_short_sleep_sleeps_in_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await ctx.sleep(TTL / 2)
        woke.append((ctx.attempt, trio.current_time()))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(TTL)
        await app.assert_outcome(session, 1, "processed", attempts=1)
    assert woke == [(1, TTL / 2)]


async def test_a_long_sleep_suspends_the_attempt_and_resumes_at_its_wake_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    charged: list[float] = []
    woke: list[tuple[int, float]] = []

    async def charge() -> str:
        charged.append(trio.current_time())
        return "ch-1"

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        receipt = await ctx.step("charge", charge)
        await ctx.sleep(DAY)
        woke.append((ctx.attempt, trio.current_time()))
        return orders.event("shipped", Shipped(receipt))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(DAY - 1)
        # Suspended: no claim, no failure, not claimable before the wake time.
        row = (await app.store.inner.read(app.server.key("s1")))[0]
        assert (row.claim_holder, row.failure_count, row.attempt_count) == (None, 0, 1)
        assert row.not_before_ms == app.clock.now_ms() + 1_000
        assert woke == []
        await app.advance(2)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=0)
        events = await app.assert_log(session, ["ordered", "shipped"])
        assert events[1].payload == Shipped("ch-1")
    assert charged == [0.0], "the step before the sleep ran once"
    assert woke == [(2, DAY)]


async def test_sleep_until_a_past_instant_returns_at_once_and_a_naive_one_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raised: list[str] = []
    done: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await ctx.sleep_until(ctx.event.created_at - timedelta(seconds=5))
        done.append(trio.current_time())
        try:
            await ctx.sleep_until(datetime(2030, 1, 1))
        except ValueError as exc:
            raised.append(str(exc))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.advance(1)
    assert done == [0.0]
    assert raised == [
        "sleep_until needs an aware datetime, got naive datetime.datetime(2030, 1, 1, 0, 0)"
    ]


@pytest.mark.parametrize("seconds", [-1, float("inf")])
async def test_sleep_refuses_negative_and_infinite_seconds(
    autojump_clock: trio.testing.MockClock, seconds: float
) -> None:
    raised: list[str] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        try:
            await ctx.sleep(seconds)
        except ValueError as exc:
            raised.append(str(exc))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.advance(1)
    assert raised == [f"seconds must be non-negative and finite, got {seconds!r}"]


async def test_inspection_shows_waiting_attempts_what_for_and_until_when(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await ctx.wait_for("shipped", timeout=600)
        await ctx.sleep(DAY)

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(60)
        start_ms = app.clock.now_ms() - 60_000

        async def status() -> tuple[str, str | None, int | None, str | None]:
            page = await app.server.inspect.read_session_page("s1")
            s = page.events[0].status
            return (s.state, s.waiting_for, s.waiting_until_ms, s.claim_holder)

        # A suspended wait_for: waiting, for its type, until its timeout, no claim.
        assert await status() == ("waiting", "shipped", start_ms + 600_000, None)
        await session.append(orders.event("shipped", Shipped("a")))
        await app.advance(1)
        # A suspended sleep: waiting, for the sleep, until it wakes, no claim.
        assert await status() == ("waiting", "sleep", start_ms + 60_000 + int(DAY * 1000), None)
        await app.advance(DAY)
        assert (await status())[:3] == ("processed", None, None)


async def test_an_abort_that_lands_during_a_suspended_sleep_aborts_the_handler_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[float] = []
    started: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append(trio.current_time())
        await ctx.sleep(3600)
        woke.append(trio.current_time())

    handlers = {"ordered": a2trio.handler(ship, abort_on=["cancelled"])}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(100)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.advance(1)
        await app.assert_outcome(session, 1, "aborted", attempts=2, failures=0)
    assert woke == []
    assert started == [0.0, 100.0]


async def test_an_abort_predicate_that_refuses_does_not_wake_a_suspended_sleep_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The refused abort wakes the attempt once (the store cannot run the
    predicate); the rerun reads it, refuses it again and suspends with it
    seen, so it sleeps to its wake time instead of waking over and over."""
    started: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append(trio.current_time())
        await ctx.sleep(3600)

    def mine(event: Any, trigger: Any, _: dict[str, int]) -> bool:
        return bool(event.payload.item == trigger.payload.item)

    handlers = {"ordered": a2trio.handler(ship, abort_on={"cancelled": mine})}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(100)
        await session.append(orders.event("cancelled", Cancelled("b")))
        await app.advance(3600)
        await app.assert_outcome(session, 1, "processed", attempts=3, failures=0)
    assert started == [0.0, 100.0, 3600.0]


async def test_a_long_sleep_in_a_child_task_stays_in_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        async def nap() -> None:
            await ctx.sleep(3600)
            woke.append((ctx.attempt, trio.current_time()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(nap)

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(3601)
        await app.assert_outcome(session, 1, "processed", attempts=1, failures=0)
    assert woke == [(1, 3600.0)]


async def test_a_24_hour_wait_holds_no_claim_and_no_task_and_wakes_when_its_event_lands(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 34: a day-long ``wait_for`` in virtual time suspends its
    attempt (no claim, no handler frame, no feed: the store's row holds no
    claim and the process no task for it), an event of its type that lands
    makes it claimable at once, and one without any answers None a day on."""
    running = 0
    answers: list[tuple[str, float, object]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        nonlocal running
        running += 1
        try:
            found = await ctx.wait_for("shipped", timeout=DAY)
        finally:
            running -= 1
        answers.append((ctx.event.payload.item, trio.current_time(), found and found.index))

    def tasks() -> int:
        def count(task: trio.lowlevel.Task) -> int:
            children = (c for n in task.child_nurseries for c in n.child_tasks)
            return 1 + sum(count(child) for child in children)

        root = trio.lowlevel.current_root_task()
        assert root is not None
        return count(root)

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.advance(1)
        idle = tasks()
        woken, timed_out = app.session("woken"), app.session("timed-out")
        await woken.append(orders.event("ordered", Ordered("a")))
        await timed_out.append(orders.event("ordered", Ordered("b")))
        await app.advance(3600)
        for session_id in ("woken", "timed-out"):
            [row] = await app.store.inner.read(app.server.key(session_id))
            assert (row.claim_holder, row.processed_at_ms) == (None, None), row
        assert running == 0
        assert tasks() <= idle
        await woken.append(orders.event("shipped", Shipped("a")))
        await app.advance(1)
        await app.assert_outcome(woken, 1, "processed", attempts=2)
        await app.advance(DAY)
        await app.assert_outcome(timed_out, 1, "processed", attempts=2)
    assert answers == [("a", 3601.0, 2), ("b", DAY + 1.0, None)]
