"""Mistakes a type checker must report: each line marked ``# E: <code>`` is
exactly one mypy error of that code (``tests/test_typing.py``), and no other
line has one."""

from __future__ import annotations

import a2trio

from .shop import (
    Checkout,
    OrderPlaced,
    OrderShipped,
    add_item,
    orders,
    placed,
    ship,
    shipped,
    track,
)

# A wrong payload: a dict, another event's struct, a missing field.
placed({"order_id": 1})  # E: arg-type
placed(OrderShipped("o-1", "post"))  # E: arg-type
placed(OrderPlaced())  # E: call-arg

# A handler annotated for one event, registered for another.
a2trio.on(shipped, ship)  # E: arg-type
a2trio.on(placed, track)  # E: arg-type


# A handler reading a field its event does not carry.
async def misread(ctx: a2trio.HandlerContext[OrderPlaced]) -> None:
    print(ctx.event.payload.carrier)  # E: attr-defined


# A handler that returns something it may not.
async def returns_a_number(ctx: a2trio.HandlerContext[OrderPlaced]) -> int:
    return 1


a2trio.on(placed, returns_a_number)  # E: arg-type

# A call declared with one input type whose function takes another.
a2trio.call(Checkout, add_item)  # E: arg-type
a2trio.call(None, add_item)  # E: arg-type

# Handlers given neither as a list of a2trio.on(...) nor as a mapping.
a2trio.Server(orders, handlers=[ship])  # E: list-item
