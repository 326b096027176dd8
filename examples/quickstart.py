"""Append, react, and follow a session live, on the default store.

    python examples/quickstart.py

With no ``A2_ENV`` or ``A2_STORE`` set the server uses the embedded SQLite file
``.a2/dev.db``; run it twice and the second run replays the first one's
``ordered`` event (same client id) instead of duplicating it.

The contract is declared with typed event handles: ``ordered(...)`` takes
only an ``Ordered``, and ``a2trio.on(ordered, ship)`` type-checks only if
``ship`` takes a ``HandlerContext[Ordered]`` (mypy strict checks this file).
"""

from __future__ import annotations

import msgspec
import trio

import a2trio


class Ordered(msgspec.Struct, frozen=True):
    item: str
    qty: int


class Shipped(msgspec.Struct, frozen=True):
    item: str


ordered = a2trio.event_type("ordered", Ordered)
shipped = a2trio.event_type("shipped", Shipped)
orders = a2trio.contract("orders", events=[ordered, shipped])


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.Returned:
    """React to an order: the returned event commits with the completion."""
    print(f"handler: shipping {ctx.event.payload.item} (attempt {ctx.attempt})")
    return shipped(Shipped(ctx.event.payload.item))


count = a2trio.Reducer("count", 0, lambda n, event: n + 1)


async def main() -> None:
    server = a2trio.Server(orders, handlers=[a2trio.on(ordered, ship)])
    print(f"store: {type(server.store).__name__}")
    async with server:
        session = server.session("order-42")
        async with session.stream() as feed:
            await session.append(ordered(Ordered("book", 1), id="order-42/1"))
            async for event in feed:
                print(f"feed: #{event.index} {event.type} {msgspec.to_builtins(event.payload)}")
                if event.type == "shipped":
                    break
        await server.settle()
        state, index = await session.state(count)
        print(f"state: {state} events through index {index}")


if __name__ == "__main__":
    trio.run(main)
