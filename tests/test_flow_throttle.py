"""``throttle=a2trio.Throttle(limit, period, key=...)`` (issue 33) in the
engine, on the autojump clock: at most ``limit`` attempt starts per period
per key value across sessions; the excess waits and runs as the window
frees (exactly, with a scheduler); a retry is a new start; bad options fail
at construction naming the option; a key that fails dead-letters its event;
it composes with a concurrency limit."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import open_harness

from .apps import Ordered, orders


def customer(event: a2trio.AppendInput) -> str:
    payload: Ordered = event.payload
    return payload.item.split("-")[0]


class Starts:
    """When each attempt started, per customer."""

    def __init__(self, fail_first: bool = False) -> None:
        self.at: dict[str, list[float]] = {}
        self.fail_first = fail_first

    async def ship(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        who = ctx.event.payload.item.split("-")[0]
        self.at.setdefault(who, []).append(trio.current_time())
        if self.fail_first and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        await trio.sleep(0.01)


async def test_at_most_limit_starts_per_period_per_key_across_sessions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = Starts()
    throttle = a2trio.Throttle(2, "1s", key=customer)
    handlers = {"ordered": a2trio.handler(starts.ship, throttle=throttle)}
    async with open_harness(orders, handlers=handlers) as app:
        began = trio.current_time()
        for s in range(5):
            for who in ("acme", "zeta"):
                await app.session(f"s{s}").append(orders.event("ordered", Ordered(f"{who}-{s}")))
        await app.advance(30)
        for who in ("acme", "zeta"):
            times = starts.at[who]
            assert len(times) == 5, "the excess waits and runs, never dropped"
            for i in range(len(times) - 2):
                assert times[i + 2] - times[i] >= 1.0, f"{who}: 3 starts within a second"
            # Two at once, then two a second later (the window frees exactly).
            assert [round(t - began, 2) for t in times] == [0.0, 0.0, 1.0, 1.0, 2.0]
        for s in range(5):
            await app.assert_outcome(app.session(f"s{s}"), 1, "processed", attempts=1)


async def test_a_retry_is_a_new_start(autojump_clock: trio.testing.MockClock) -> None:
    starts = Starts(fail_first=True)
    handlers = {
        "ordered": a2trio.handler(
            starts.ship,
            throttle=a2trio.Throttle(1, 10),
            # Due after a second: the throttle, not the backoff, holds it to 10 s.
            retry=a2trio.Retry(3, backoff=lambda failures: 1.0),
        )
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        began = trio.current_time()
        await session.append(orders.event("ordered", Ordered("acme-1")))
        await app.advance(60)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
        first, second = starts.at["acme"]
        assert first - began == 0.0
        assert second - first == pytest.approx(10.0, abs=0.01), "one start per 10 s"


async def test_a_throttle_composes_with_a_concurrency_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    running = 0
    most = 0
    times: list[float] = []

    async def slow(ctx: a2trio.HandlerContext[Ordered]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        times.append(trio.current_time())
        await trio.sleep(5)
        running -= 1

    spec = a2trio.handler(
        slow, concurrency=a2trio.Concurrency(1), throttle=a2trio.Throttle(10, "1m")
    )
    async with open_harness(orders, handlers={"ordered": spec}) as app:
        for s in range(3):
            await app.session(f"s{s}").append(orders.event("ordered", Ordered(f"acme-{s}")))
        await app.advance(60)
        assert len(times) == 3
        assert most == 1


def test_bad_options_fail_at_construction_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"Throttle\(limit=...\) must be at least 1, got 0"):
        a2trio.Throttle(0, 1)
    with pytest.raises(ValueError, match=r"Throttle\(period=...\) must be positive"):
        a2trio.Throttle(1, -1)
    with pytest.raises(ValueError, match=r"Throttle\(period=...\) must be seconds or a duration"):
        a2trio.Throttle(1, "a minute")
    with pytest.raises(TypeError, match=r"Throttle\(period=...\) must be seconds or a duration"):
        a2trio.Throttle(1, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Throttle\(key=...\) must be a function"):
        a2trio.Throttle(1, 1, key="customer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"throttle must be an a2trio.Throttle"):
        a2trio.handler(Starts().ship, throttle=5)  # type: ignore[arg-type]
    assert a2trio.Throttle(3, "1m").period_ms == 60_000
    assert a2trio.Throttle(3, "500ms").period_ms == 500
    assert a2trio.Throttle(3, 0.25).period_ms == 250
    assert repr(a2trio.Throttle(3, "30s", key=customer)) == "Throttle(3, 30, key=customer)"


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (lambda event: 1 / 0, "the throttle key of 'ordered' raised ZeroDivisionError"),
        (lambda event: None, "the throttle key of 'ordered' must return a string, got None"),
    ],
)
async def test_a_throttle_key_that_fails_dead_letters_its_event(
    autojump_clock: trio.testing.MockClock, key: Any, error: str
) -> None:
    starts = Starts()
    spec = a2trio.handler(starts.ship, throttle=a2trio.Throttle(1, 1, key=key))
    async with open_harness(orders, handlers={"ordered": spec}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("acme-1")))
        await app.advance(10)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=1, failures=1)
        assert error in (found.last_error or "")
        assert starts.at == {}
