"""The transactional outbox: an order row and its ``ordered`` event commit
together, or neither does.

    python examples/outbox.py [PATH]

On the SQLite file ``PATH`` (default ``.a2/outbox.db``). The same code runs on
Postgres with ``$1`` placeholders instead of ``?`` (``docs/stores-postgres.md``,
"The app's own transaction"). The first order commits; the second raises in
its block (out of stock) and leaves neither a row nor an event; the handler
runs once, for the committed order, after its commit. Run it twice and the
first order's transaction replays its event (the same derived id) while its
row is left as it was (``insert ... on conflict do nothing``).
"""

from __future__ import annotations

import sys

import msgspec
import trio

import a2trio
from a2trio.stores.sqlite import sqlite


class Ordered(msgspec.Struct, frozen=True):
    order_id: str
    qty: int


ordered = a2trio.event_type("ordered", Ordered)
shop = a2trio.contract("shop", events=[ordered])


async def confirm(ctx: a2trio.HandlerContext[Ordered]) -> None:
    print(f"handler: confirming {ctx.event.payload.order_id}")


async def place(server: a2trio.Server, order_id: str, qty: int) -> None:
    """One order: its row and its event in one transaction."""
    async with server.transaction() as tx:
        await tx.execute(
            "insert into orders (id, qty) values (?, ?) on conflict do nothing", (order_id, qty)
        )
        [(stock,)] = await tx.fetch("select 5 - coalesce(sum(qty), 0) from orders")
        if stock < 0:
            raise ValueError(f"{order_id}: out of stock")
        await server.session(order_id).append(
            ordered(Ordered(order_id, qty), id=f"{order_id}:ordered"), transaction=tx
        )


async def main(path: str) -> None:
    server = a2trio.Server(shop, store=sqlite(path), handlers=[a2trio.on(ordered, confirm)])
    async with server:
        async with server.transaction() as tx:
            await tx.execute("create table if not exists orders (id text primary key, qty int)")
        await place(server, "o-1", 3)
        try:
            await place(server, "o-2", 4)
        except ValueError as exc:
            print(f"rolled back: {exc}")
        await server.settle()
        async with server.transaction() as tx:
            rows = await tx.fetch("select id, qty from orders order by id")
        print(f"orders: {rows}")
        for order_id in ("o-1", "o-2"):
            events = await server.session(order_id).history()
            print(f"{order_id}: {[event.type for event in events]}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else ".a2/outbox.db")
