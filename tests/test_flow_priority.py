"""``priority=`` (issue 33) in the engine, on the autojump clock: among a
session's waiting events a claim takes higher first (under a concurrency
limit, the server's ``max_handlers``), lanes still hold; a bad option fails
at construction; a priority that raises or returns no int dead-letters its
event."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import open_harness

from .apps import Ordered, orders


def by_qty(event: a2trio.AppendInput) -> int:
    payload: Ordered = event.payload
    return payload.qty


class Order:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def ship(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        self.ran.append(ctx.event.payload.item)
        await trio.sleep(1)


async def test_waiting_events_run_higher_priority_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order = Order()
    spec = a2trio.handler(order.ship, concurrency=a2trio.Concurrency(1), priority=by_qty)
    async with open_harness(orders, handlers={"ordered": spec}) as app:
        session = app.session("s1")
        await session.append(
            *(orders.event("ordered", Ordered(f"q{q}", qty=q)) for q in (1, 5, 3, 5, 2))
        )
        await app.advance(30)
        # One at a time: the highest first, equal ones in their order.
        assert order.ran == ["q5", "q5", "q3", "q2", "q1"]


async def test_a_lane_holds_whatever_the_priority(autojump_clock: trio.testing.MockClock) -> None:
    order = Order()
    spec = a2trio.handler(order.ship, lane="one", priority=by_qty)
    async with open_harness(orders, handlers={"ordered": spec}) as app:
        await app.session("s1").append(
            *(orders.event("ordered", Ordered(f"q{q}", qty=q)) for q in (1, 9, 4))
        )
        await app.advance(30)
        assert order.ran == ["q1", "q9", "q4"], "FIFO within the lane"


def test_a_priority_that_is_no_function_fails_at_construction() -> None:
    with pytest.raises(TypeError, match=r"priority must be a function of the event, got 3"):
        a2trio.handler(Order().ship, priority=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("priority", "error"),
    [
        (lambda event: 1 / 0, "the priority of 'ordered' raised ZeroDivisionError"),
        (lambda event: "high", "the priority of 'ordered' must return an int, got 'high'"),
    ],
)
async def test_a_priority_that_fails_dead_letters_its_event(
    autojump_clock: trio.testing.MockClock, priority: Any, error: str
) -> None:
    order = Order()
    spec = a2trio.handler(order.ship, priority=priority)
    async with open_harness(orders, handlers={"ordered": spec}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("q1")))
        await app.advance(10)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=1, failures=1)
        assert error in (found.last_error or "")
        assert order.ran == []
