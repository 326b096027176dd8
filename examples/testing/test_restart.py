"""A restart mid-handler.

The process dies while a handler runs. Nothing is completed or failed: the
claim simply stays in the store until its ttl, as after a real crash. A new
server on the same store retries the event as attempt 2, and the handler's
own append from attempt 1 is replayed rather than duplicated, because
handler appends take ids derived from the trigger.
"""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory

pytestmark = pytest.mark.trio


class Booked(msgspec.Struct, frozen=True):
    room: str


class Held(msgspec.Struct, frozen=True):
    room: str


class Confirmed(msgspec.Struct, frozen=True):
    room: str


hotel = a2trio.contract("hotel", events={"booked": Booked, "held": Held, "confirmed": Confirmed})


async def confirm(ctx: a2trio.HandlerContext[Booked]) -> a2trio.Returned:
    room = ctx.event.payload.room
    await ctx.session.append("hold", hotel.event("held", Held(room)))
    await trio.sleep(20)  # the channel manager is slow
    return hotel.event("confirmed", Confirmed(room))


async def test_a_crash_mid_handler_is_retried(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    app = await a2_app(hotel, handlers={"booked": confirm})
    s = app.session("booking-9")
    await s.append(hotel.event("booked", Booked("101")))
    await app.advance(5)
    await app.assert_log(s, ["booked", "held"])

    await app.restart()  # the process dies mid-handler; a new one starts
    await app.assert_outcome(s, 1, "pending", attempts=1)
    # A drain at startup finds the dead claim still live (until t=30) and arms a
    # watchdog at its expiry plus grace.
    assert (await app.drain(s)).outcome == "busy"

    await app.settle()
    assert trio.current_time() == 5
    await app.advance(30)  # t=35: the watchdog drains; attempt 2 runs for 20 s
    await app.settle()
    assert trio.current_time() == 55
    await app.assert_outcome(s, 1, "processed", attempts=2)
    await app.assert_log(s, ["booked", "held", "confirmed"])
