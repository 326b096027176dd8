"""``max_handlers`` bounds running handlers (issue 30), and a drain never claims
an event whose outcome it is still storing (issue 29)."""

from __future__ import annotations

import trio
import trio.testing

import a2trio
from a2trio.server import DEFAULT_MAX_HANDLERS
from a2trio.testing import FaultyStore

from .apps import Ordered, orders


def test_the_default_bound_keeps_a_burst_of_sessions_batched() -> None:
    # 256 split 100 busy sessions into claims and completions of ~2.5 events
    # (0.75x of the cap lifted on Postgres); docs/performance.md has the A/B.
    assert DEFAULT_MAX_HANDLERS == 1024


async def test_a_drain_woken_while_a_failure_is_stored_does_not_run_the_event_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[tuple[str, int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.event.payload.item, ctx.attempt, trio.current_time()))
        if ctx.event.payload.item == "a" and ctx.attempt == 1:
            raise RuntimeError("the courier is down")

    store = FaultyStore(a2trio.stores.memory(clock=a2trio.TrioClock()))
    # The failure commits at once, its answer comes 10 s later: meanwhile the
    # event is claimable again (drains' claims ignore the retry backoff).
    store.delay("fail_attempt", seconds=10, after=True)
    server = a2trio.Server(orders, store=store, handlers={"ordered": ship}, sweep=False)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await trio.sleep(1)
        # Wakes the drain to claim while the failure's answer is in flight.
        await session.append(orders.event("ordered", Ordered("b")))
        await trio.sleep(5)
        assert attempts == [("a", 1, 0.0), ("b", 1, 1.0)]
    # Before: ("a", 2, 1.0), the failed event run again by the woken drain.
