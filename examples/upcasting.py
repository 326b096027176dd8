"""Schema evolution: events the first release stored, read by the second as
its current payload type (``docs/concepts.md``, "Versions and upcasters").

The first release stored ``ordered`` events as ``OrderedV1`` (one free-text
``item``); the second splits it into a ``sku`` and a ``quantity``. Its
contract declares both versions and the upcaster between them, so its
handler, its history and its state see only ``Ordered``, whichever release
wrote the event::

    python examples/upcasting.py      # a SQLite file in a temporary folder

The output, the same on every run::

    handler: ship 1 x BOOK
    handler: ship 3 x PEN
    handler: ship 2 x INK
    stored versions: [None, None, 2]
    history: BOOK x1, PEN x3, INK x2
    state: 6 items through index 6
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import trio

import a2trio
from a2trio.stores.sqlite import sqlite

__all__ = ["Ordered", "OrderedV1", "main", "release_1", "release_2"]


class OrderedV1(msgspec.Struct, frozen=True):
    """What the first release stored: ``"3 pen"``, or just ``"book"``."""

    item: str


class Ordered(msgspec.Struct, frozen=True):
    """The current payload type."""

    sku: str
    quantity: int


class Shipped(msgspec.Struct, frozen=True):
    sku: str
    quantity: int


def ordered_v1_to_v2(old: OrderedV1) -> Ordered:
    """Version 1 to version 2: a pure function of the old payload."""
    match = re.fullmatch(r"(\d+) (.+)", old.item)
    if match is None:
        return Ordered(sku=old.item.upper(), quantity=1)
    return Ordered(sku=match[2].upper(), quantity=int(match[1]))


release_1 = a2trio.contract("shop", events={"ordered": OrderedV1, "shipped": Shipped})

release_2 = a2trio.contract(
    "shop",
    events={"ordered": Ordered, "shipped": Shipped},
    versions={"ordered": [OrderedV1, Ordered]},
    upcasters={"ordered": [ordered_v1_to_v2]},
)


async def _not_yet(ctx: a2trio.HandlerContext[Any]) -> None:
    raise AssertionError("release 1 only takes orders here")


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
    order = ctx.event.payload  # an Ordered, even for an event release 1 wrote
    print(f"handler: ship {order.quantity} x {order.sku}")
    return release_2.event("shipped", Shipped(order.sku, order.quantity))


def _count(total: int, event: a2trio.Event[Any]) -> int:
    return total + event.payload.quantity if event.type == "ordered" else total


items = a2trio.Reducer("items", 0, _count)


async def main(store: a2trio.Store) -> None:
    """Release 1 takes two orders (and runs no handler); release 2 takes one
    more and ships all three."""
    # One lane: the orders ship in the order they were taken.
    handlers = {"ordered": a2trio.handler(_not_yet, lane="shipping")}
    async with a2trio.Server(release_1, store=store, handlers=handlers, run_handlers=False) as v1:
        await v1.session("o1").append(
            release_1.event("ordered", OrderedV1("book"), id="o1-1"),
            release_1.event("ordered", OrderedV1("3 pen"), id="o1-2"),
        )
    handlers = {"ordered": a2trio.handler(ship, lane="shipping")}
    async with a2trio.Server(release_2, store=store, handlers=handlers) as v2:
        session = v2.session("o1")
        await session.append(release_2.event("ordered", Ordered("INK", 2), id="o1-3"))
        await v2.settle()
        rows = await store.read(v2.key("o1"))
        print("stored versions:", [row.version for row in rows if row.type == "ordered"])
        history = await session.history()
        orders = [e.payload for e in history if e.type == "ordered"]
        print("history:", ", ".join(f"{o.sku} x{o.quantity}" for o in orders))
        total, index = await session.state(items)
        print(f"state: {total} items through index {index}")


async def _run() -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with sqlite(str(Path(folder) / "shop.db")) as store:
            await main(store)


if __name__ == "__main__":
    trio.run(_run)
