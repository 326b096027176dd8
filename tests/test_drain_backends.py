"""The drain scenarios on the durable stores, time moved by ``MockClock.jump``.

Autojump treats a task waiting on a thread or socket as idle, so on sqlite and
Postgres the test kit's harness jumps the clock itself: to the next deadline,
then waits until every store call in flight has answered (``Harness.advance``).
The memory-store versions of these scenarios, with exact instants, are in
``test_drain.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import Harness, TrioClock, open_harness

from .apps import Cancelled, Note, Ordered, Shipped, orders

TTL = a2trio.DEFAULT_TIMINGS.claim_ttl_s


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def harness(backend: str, handlers: dict[str, Any]) -> AsyncIterator[Harness]:
    open_store = importlib.import_module(f"tests.backends.{backend}").open_store
    async with open_store(TrioClock()) as store:
        async with open_harness(orders, handlers=handlers, store=store, scheduler=None) as h:
            yield h


async def test_heartbeats_keep_a_long_handler_claimed(
    backend: str, mock_clock: trio.testing.MockClock
) -> None:
    runs: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append(ctx.attempt)
        await trio.sleep(45)
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    async with harness(backend, {"ordered": ship}) as h:
        await h.session("s1").append(orders.event("ordered", Ordered("book")))
        await h.advance(50)
        await h.assert_log("s1", ["ordered", "shipped"])
        assert runs == [1]


async def test_failed_renewals_surrender_and_the_retry_completes(
    backend: str, mock_clock: trio.testing.MockClock
) -> None:
    runs: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append((ctx.attempt, trio.current_time()))
        await trio.sleep(45 if ctx.attempt == 1 else 1)
        return orders.event("shipped", Shipped("a"))

    async with harness(backend, {"ordered": ship}) as h:
        h.store.fail("renew_claims")
        await h.session("s1").append(orders.event("ordered", Ordered("a")))
        await h.advance(TTL + 5)
        h.store.clear()
        await h.settle()
        await h.assert_log("s1", ["ordered", "shipped"])
        assert [attempt for attempt, _ in runs] == [1, 2]
        assert runs[1][1] >= TTL
        late = await h.store.inner.complete_attempt(
            h.server.key("s1"), index=1, attempt=1, events=[]
        )
        assert late.outcome == "superseded"


async def test_dead_letter_after_ten_failures_blocks_the_lane(
    backend: str, mock_clock: trio.testing.MockClock
) -> None:
    attempts: list[int] = []
    ran: list[str] = []

    async def explode(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.event.payload.item == "bad":
            attempts.append(ctx.attempt)
            raise RuntimeError("boom")
        ran.append(ctx.event.payload.item)

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        ran.append(ctx.event.payload.text)

    handlers = {"ordered": a2trio.handler(explode, lane="fulfil"), "note": note}
    async with harness(backend, handlers) as h:
        s = h.session("s1")
        await s.append(
            orders.event("ordered", Ordered("bad")), orders.event("ordered", Ordered("next"))
        )
        await h.settle()
        results = [await h.drain("s1") for _ in range(9)]
        assert attempts == list(range(1, 11))
        assert results[-1].outcome == "stalled"
        await s.append(orders.event("note", Note("unlaned")))
        await h.settle()
        assert ran == ["unlaned"]


async def test_lane_order_and_abort_on(backend: str, mock_clock: trio.testing.MockClock) -> None:
    order: list[int] = []
    aborted: list[str] = []

    async def work(ctx: a2trio.HandlerContext[Ordered]) -> None:
        order.append(ctx.event.index)
        try:
            await trio.sleep(100 if ctx.event.payload.item == "slow" else 1)
        except trio.Cancelled:
            aborted.append(ctx.event.payload.item)
            raise

    handlers = {"ordered": a2trio.handler(work, lane="one", abort_on=["cancelled"])}
    async with harness(backend, handlers) as h:
        s = h.session("s1")
        await s.append(*(orders.event("ordered", Ordered(str(n))) for n in range(5)))
        await s.append(orders.event("ordered", Ordered("slow")))
        await h.advance(10)
        await s.append(orders.event("cancelled", Cancelled("slow")))
        await h.settle()
        assert order == [1, 2, 3, 4, 5, 6]
        assert aborted == ["slow"]
        assert trio.current_time() < 100


async def test_restart_mid_handler_leaves_the_event_for_the_next_server(
    backend: str, mock_clock: trio.testing.MockClock
) -> None:
    runs: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            await trio.sleep(5)  # the crash lands mid-sleep
        return orders.event("shipped", Shipped("a"))

    async with harness(backend, {"ordered": ship}) as h:
        await h.session("s1").append(orders.event("ordered", Ordered("a")))
        await h.advance(1)
        await h.restart()
        assert (await h.drain("s1")).outcome == "busy"
        await h.advance(TTL)
        assert (await h.drain("s1")).settled
        await h.assert_log("s1", ["ordered", "shipped"])
        assert runs == [1, 2]
