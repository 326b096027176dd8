"""A lease that lapses when renewals fail.

A handler slower than the claim ttl (30 s) stays alive because the drain's
heartbeat renews its claim every 10 s. When the store refuses renewals, the
drain can no longer prove it holds the claim: at t=30 the lease scope cancels
the handler. That attempt is *surrendered* (no failure is counted) and the
event is claimed again as attempt 2.
"""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory

pytestmark = pytest.mark.trio


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Packed(msgspec.Struct, frozen=True):
    item: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "packed": Packed})


async def pack(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.Returned:
    await trio.sleep(45)  # longer than the 30 s ttl: only renewals keep the claim
    return shop.event("packed", Packed(ctx.event.payload.item))


async def test_lease_lapses_when_renewals_fail(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    app = await a2_app(shop, handlers={"ordered": pack})
    s = app.session("order-1")
    # Renewals fail from t=5 s until t=35 s: the beats at 10, 20 and 30 s are lost.
    app.store.fail("renew_claims", start=5, end=35)
    await s.append(shop.event("ordered", Ordered("lamp")))

    await app.advance(30)
    first = app.telemetry.one("a2.event", {"a2.event.attempt": 1})
    assert first.attributes["a2.event.outcome"] == "surrendered"

    await app.advance(45)  # attempt 2 started at t=30; its renewals succeed
    assert trio.current_time() == 75
    await app.assert_outcome(s, 1, "processed", attempts=2, failures=0)
    await app.assert_log(s, ["ordered", "packed"])
