"""A small shop declared in the typed forms, for the files beside it.

Type-checked clean by ``tests/test_typing.py`` (every ``assert_type`` holds);
``mistakes.py`` imports it to make each mistake once.
"""

from __future__ import annotations

from typing import assert_type

import msgspec

import a2trio


class OrderPlaced(msgspec.Struct, frozen=True):
    order_id: str


class OrderShipped(msgspec.Struct, frozen=True):
    order_id: str
    carrier: str


placed = a2trio.event_type("placed", OrderPlaced)
shipped = a2trio.event_type("shipped", OrderShipped)
cancelled = a2trio.event_type("cancelled", None)
orders = a2trio.contract("orders", events=[placed, shipped, cancelled])

assert_type(placed, a2trio.EventType[OrderPlaced])
assert_type(cancelled, a2trio.EventType[None])
assert_type(placed(OrderPlaced("o-1"), id="c-1"), a2trio.AppendInput)


async def ship(ctx: a2trio.HandlerContext[OrderPlaced]) -> a2trio.Returned:
    assert_type(ctx.event.payload, OrderPlaced)
    return shipped(OrderShipped(ctx.event.payload.order_id, "post"))


async def track(ctx: a2trio.HandlerContext[OrderShipped]) -> None:
    assert_type(ctx.event.payload.carrier, str)


async def notify(ctx: a2trio.HandlerContext[OrderPlaced | OrderShipped]) -> None:
    assert_type(ctx.event.payload, OrderPlaced | OrderShipped)


async def audit(ctx: a2trio.HandlerContext[object]) -> None:
    return None


server = a2trio.Server(
    orders,
    store=a2trio.stores.memory(),
    handlers=[
        a2trio.on(placed, ship, lane="fulfilment", abort_on=[cancelled]),
        a2trio.on(shipped, track),
    ],
)
# A handler typed for a wider payload may be registered for a narrower event.
notifier = a2trio.Server(
    orders,
    store=a2trio.stores.memory(),
    handlers=[a2trio.on(placed, notify), a2trio.on(shipped, notify), a2trio.on(cancelled, audit)],
)
# The string forms keep working (checked when they run, not by the type checker).
legacy = a2trio.Server(
    orders, store=a2trio.stores.memory(), handlers={"placed": a2trio.handler(ship)}
)
legacy_input = orders.event("placed", {"order_id": "o-2"})


class Cart(msgspec.Struct, frozen=True):
    items: tuple[str, ...] = ()


class AddItem(msgspec.Struct, frozen=True):
    item: str


class Checkout(msgspec.Struct, frozen=True):
    card: str


class ItemAdded(msgspec.Struct, frozen=True):
    item: str


added = a2trio.event_type("added", ItemAdded)


def fold(state: Cart, event: a2trio.Event[ItemAdded]) -> Cart:
    return Cart((*state.items, event.payload.item))


async def add_item(state: Cart, input: AddItem) -> a2trio.AppendInput:
    return added(ItemAdded(input.item))


def clear(state: Cart, input: None) -> None:
    return None


cart = a2trio.actor(
    "cart",
    events=[added],
    state=a2trio.Reducer("cart-v1", Cart(), fold),
    calls={
        "add": a2trio.call(AddItem, add_item, emits=[added]),
        "clear": a2trio.call(None, clear),
    },
)
