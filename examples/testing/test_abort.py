"""An ``abort_on`` cancellation.

The handler for ``ordered`` waits for a courier. A ``cancelled`` event for the
same item aborts it: the handler is cancelled where it waits, the attempt
completes with no returned events, and the span is marked aborted. A
cancellation for another item aborts nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory

pytestmark = pytest.mark.trio


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Cancelled(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


shop = a2trio.contract(
    "shop", events={"ordered": Ordered, "cancelled": Cancelled, "shipped": Shipped}
)


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.Returned:
    await trio.sleep(60)  # the courier takes a minute
    return shop.event("shipped", Shipped(ctx.event.payload.item))


def same_item(event: a2trio.Event[Any], trigger: a2trio.Event[Any], _: dict[str, int]) -> bool:
    return bool(event.payload.item == trigger.payload.item)


handlers = {"ordered": a2trio.handler(ship, abort_on={"cancelled": same_item})}


async def test_cancellation_aborts_the_running_handler(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    app = await a2_app(shop, handlers=handlers)
    s = app.session("order-1")
    await s.append(shop.event("ordered", Ordered("lamp")))
    await app.advance(10)
    await s.append(shop.event("cancelled", Cancelled("sofa")))  # another item
    await app.advance(10)
    await s.append(shop.event("cancelled", Cancelled("lamp")))
    await app.settle()

    assert trio.current_time() == 20  # aborted at once, not after the minute
    await app.assert_outcome(s, 1, "aborted", attempts=1)
    await app.assert_log(s, ["ordered", "cancelled", "cancelled"])
    span = app.telemetry.one("a2.event", {"a2.event.type": "ordered"})
    assert span.attributes["a2.event.aborted"] is True
