"""A durable checkout: charge, wait for the shipment or 24 hours, refund on timeout.

    python examples/checkout.py

Each order is a session. Its ``placed`` event's handler charges the card in
a step (journaled: a rerun after a crash, on any process, does not charge
again), waits up to 24 hours for the order's ``shipped`` event (the wait's
start is journaled, so a rerun's timeout still counts from the first run),
and either confirms the charge or refunds it in a second step.

The example runs on Trio's mock clock (``autojump_threshold=0``), so the day
passes at once; with a real store and the system clock the same code waits
a real day. The payment gateway is a stand-in that, like a real one, takes
an idempotency key: a step cut off mid-call (a crash before its result is
journaled) runs again, and the key makes the retried charge the same charge.
"""

from __future__ import annotations

import msgspec
import trio
import trio.testing

import a2trio
from a2trio.stores.memory import memory

DAY_S = 24 * 3600.0


class Placed(msgspec.Struct, frozen=True):
    order: str
    cents: int


class Shipped(msgspec.Struct, frozen=True):
    order: str


class Charged(msgspec.Struct, frozen=True):
    order: str
    charge: str


class Refunded(msgspec.Struct, frozen=True):
    order: str
    charge: str


placed = a2trio.event_type("placed", Placed)
shipped = a2trio.event_type("shipped", Shipped)
charged = a2trio.event_type("charged", Charged)
refunded = a2trio.event_type("refunded", Refunded)
shop = a2trio.contract("shop", events=[placed, shipped, charged, refunded])


class Gateway:
    """A stand-in payment gateway: charges are idempotent by key."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.refunds: list[str] = []

    async def charge(self, key: str, cents: int) -> str:
        await trio.sleep(0.2)  # the gateway's round trip
        self.charges.setdefault(key, cents)
        return f"ch-{key}"

    async def refund(self, charge: str) -> str:
        await trio.sleep(0.2)
        if charge not in self.refunds:
            self.refunds.append(charge)
        return f"re-{charge}"


gateway = Gateway()


async def checkout(ctx: a2trio.HandlerContext[Placed]) -> a2trio.Returned:
    order = ctx.event.payload
    # The key repeats on every attempt of this trigger: a charge cut off
    # before it was journaled is retried as the same charge.
    charge = await ctx.step("charge", gateway.charge, f"{ctx.event.id}:charge", order.cents)
    print(f"{order.order}: charged {order.cents} cents ({charge}), attempt {ctx.attempt}")
    shipment = await ctx.wait_for(
        shipped, where=lambda event: event.payload.order == order.order, timeout=DAY_S
    )
    if shipment is not None:
        print(f"{order.order}: shipped (event #{shipment.index}): the charge stands")
        return charged(Charged(order.order, charge))
    await ctx.step("refund", gateway.refund, charge)
    print(f"{order.order}: no shipment within 24 h: refunded {charge}")
    return refunded(Refunded(order.order, charge))


async def main() -> None:
    clock = a2trio.TrioClock()
    server = a2trio.Server(
        shop, store=memory(clock=clock), clock=clock, handlers=[a2trio.on(placed, checkout)]
    )
    async with server:
        kept, lost = server.session("order-1"), server.session("order-2")
        await kept.append(placed(Placed("order-1", 1250), id="order-1/placed"))
        await lost.append(placed(Placed("order-2", 990), id="order-2/placed"))
        await trio.sleep(3 * 3600)  # three hours later, order 1 ships
        await kept.append(shipped(Shipped("order-1")))
        await trio.sleep(DAY_S)
        await server.settle()
        for session in (kept, lost):
            print(f"{session.id}: {[event.type for event in await session.history()]}")
    print(f"charges: {sorted(gateway.charges.values())}, refunds: {len(gateway.refunds)}")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
