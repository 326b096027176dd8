"""``concurrency=a2trio.Concurrency(limit, key=...)`` (issue 33) in the
engine, on the autojump clock: the limit holds across sessions (and servers
sharing a store), per key value; events over it wait in order and all run;
bad options fail at construction naming the option; a key that raises or
returns a non-string dead-letters its event with the error; lanes, the
sweep and an API tier compose with it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import a2trio
from a2trio.stores.memory import memory
from a2trio.testing import TrioClock, open_harness

from .apps import Note, Ordered, orders


class Meter:
    """Counts the attempts running at once, overall and per key value."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.order: list[tuple[str, str]] = []
        self.ended: list[float] = []

    async def ship(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        item = ctx.event.payload.item
        customer = item.split("-")[0]
        self.running[customer] = self.running.get(customer, 0) + 1
        self.most[customer] = max(self.most.get(customer, 0), self.running[customer])
        self.order.append((ctx.event.session_id, item))
        try:
            await trio.sleep(self.seconds)
        finally:
            self.running[customer] -= 1
            self.ended.append(trio.current_time())


async def noop(ctx: a2trio.HandlerContext[Note]) -> None:
    await trio.lowlevel.checkpoint()


def customer(event: a2trio.AppendInput) -> str:
    payload: Ordered = event.payload
    return payload.item.split("-")[0]


async def test_the_limit_holds_per_key_across_sessions_and_every_event_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    meter = Meter()
    limit = a2trio.Concurrency(2, key=customer)
    handlers = {"ordered": a2trio.handler(meter.ship, concurrency=limit)}
    async with open_harness(orders, handlers=handlers) as app:
        for s in range(6):
            session = app.session(f"s{s}")
            for who in ("acme", "zeta"):
                await session.append(orders.event("ordered", Ordered(f"{who}-{s}")))
        await app.advance(60)
        assert meter.most == {"acme": 2, "zeta": 2}, "two at once per customer, never more"
        assert len(meter.order) == 12
        for s in range(6):
            await app.assert_outcome(app.session(f"s{s}"), 1, "processed", attempts=1)
            await app.assert_outcome(app.session(f"s{s}"), 2, "processed", attempts=1)
        # Six per customer two at a time, a second each: three seconds, not
        # six (a freed slot wakes the waiting sessions at once).
        assert max(meter.ended) - min(meter.ended) == pytest.approx(2.0, abs=0.1)


async def test_events_over_the_limit_wait_in_order_in_their_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    meter = Meter()
    handlers = {"ordered": a2trio.handler(meter.ship, concurrency=a2trio.Concurrency(1))}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        for i in range(4):
            await session.append(orders.event("ordered", Ordered(f"acme-{i}")))
        await app.advance(30)
        assert [item for _, item in meter.order] == [f"acme-{i}" for i in range(4)]
        assert meter.most == {"acme": 1}
        for index in range(1, 5):
            await app.assert_outcome(session, index, "processed", attempts=1, failures=0)


async def test_the_limit_composes_with_lanes(autojump_clock: trio.testing.MockClock) -> None:
    meter = Meter()
    handlers = {
        "ordered": a2trio.handler(
            meter.ship, lane="one", concurrency=a2trio.Concurrency(3, key=customer)
        )
    }
    async with open_harness(orders, handlers=handlers) as app:
        for s in range(3):
            for i in range(2):
                await app.session(f"s{s}").append(orders.event("ordered", Ordered(f"acme-{s}{i}")))
        await app.advance(30)
        assert meter.most == {"acme": 3}, "one per lane, three lanes: the limit is reached"
        firsts = [item for _, item in meter.order[:3]]
        assert sorted(firsts) == ["acme-00", "acme-10", "acme-20"], "each lane's head first"


def test_bad_options_fail_at_construction_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"Concurrency\(limit=...\) must be at least 1, got 0"):
        a2trio.Concurrency(0)
    with pytest.raises(TypeError, match=r"Concurrency\(limit=...\) must be an int"):
        a2trio.Concurrency(True)
    with pytest.raises(TypeError, match=r"Concurrency\(key=...\) must be a function"):
        a2trio.Concurrency(2, key="customer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"concurrency must be an a2trio.Concurrency"):
        a2trio.handler(Meter().ship, concurrency=2)  # type: ignore[arg-type]
    placed = a2trio.event_type("ordered", Ordered)
    with pytest.raises(TypeError, match=r"concurrency must be an a2trio.Concurrency"):
        a2trio.on(placed, Meter().ship, concurrency="x")  # type: ignore[arg-type]
    assert repr(a2trio.Concurrency(2, key=customer)) == "Concurrency(2, key=customer)"


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (lambda event: 1 / 0, "the concurrency key of 'ordered' raised ZeroDivisionError"),
        (lambda event: 42, "the concurrency key of 'ordered' must return a string, got 42"),
    ],
)
async def test_a_key_that_raises_or_returns_no_string_dead_letters_its_event(
    autojump_clock: trio.testing.MockClock, key: Any, error: str
) -> None:
    meter = Meter()
    handlers = {
        "ordered": a2trio.handler(meter.ship, concurrency=a2trio.Concurrency(1, key=key)),
        "note": a2trio.handler(noop),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("acme-1")))
        await session.append(orders.event("note", Note("still runs")))
        await app.advance(30)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=1, failures=1)
        assert error in (found.last_error or "")
        assert meter.order == [], "the handler never ran"
        await app.assert_outcome(session, 2, "processed")


async def test_servers_sharing_a_store_share_the_limit_and_an_api_tier_appends_keyed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two workers and an API tier (``run_handlers=False``) on one store: the
    API tier resolves the keys, the workers run at most the limit between them."""
    meter = Meter()
    store = memory(clock=TrioClock())
    spec = a2trio.handler(meter.ship, concurrency=a2trio.Concurrency(2, key=customer))
    timings = a2trio.Timings(sweep_s=0.5)
    api = a2trio.Server(orders, store=store, handlers={"ordered": spec}, run_handlers=False)
    workers = [
        a2trio.Server(orders, store=store, handlers={"ordered": spec}, timings=timings)
        for _ in range(2)
    ]
    async with api, workers[0], workers[1]:
        for s in range(8):
            await api.session(f"s{s}").append(orders.event("ordered", Ordered(f"acme-{s}")))
        # The sweep (every 0.5 s) takes up a slot freed in the other worker.
        await trio.sleep(60)
        assert len(meter.order) == 8
        assert meter.most == {"acme": 2}
        rows = [(await store.read(orders.name + "\x1f" + f"s{s}"))[0] for s in range(8)]
        assert all(r.processed_at_ms is not None for r in rows)
        assert {r.concurrency_key for r in rows} == {"orders\x1fordered\x1facme"}
