"""Per-handler backoff, ``Retry(backoff=...)`` (issue 33), on the autojump
clock (the memory store) and on SQLite (jump mode).

A backoff's wait is stored with the failure as the event's not-before: no
claim retries it sooner (a drain running anyway included), and the server's
scheduler wakes a drain at that instant, so the retry runs on time. A
handler without one keeps the seed's rule.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.backoff import Backoff
from a2trio.stores import memory, rules
from a2trio.testing import TrioClock, open_harness

from .apps import Note, Ordered, orders
from .backends.sqlite import open_store


class Starts:
    """The Trio time each attempt of the ``ordered`` handler started at."""

    def __init__(self, *, succeed_at: int = 1_000) -> None:
        self.at: list[tuple[int, float]] = []
        self.succeed_at = succeed_at

    async def ordered(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        self.at.append((ctx.attempt, trio.current_time()))
        if ctx.attempt < self.succeed_at:
            raise RuntimeError(f"attempt {ctx.attempt}")

    def waits(self) -> list[float]:
        """The gaps between consecutive attempts' starts."""
        times = [t for _, t in self.at]
        return [round(b - a, 6) for a, b in itertools.pairwise(times)]


async def test_a_backoff_function_sets_each_retrys_wait_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = Starts(succeed_at=4)
    retry = a2trio.Retry(5, backoff=lambda n: 1.5 * n)
    handlers = {"ordered": a2trio.handler(starts.ordered, retry=retry)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(60)
        await app.assert_outcome(session, 1, "processed", attempts=4, failures=3)
    # 1.5 s after the first failure, 3 s after the second, 4.5 s after the third.
    assert starts.waits() == [1.5, 3.0, 4.5]


async def test_a_backoff_holds_every_claim_back_until_its_retry_at(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An append during the wait runs a drain: it runs the new event but not
    the failed one, which waits for its stored retry-at (the seed's rule
    would have retried it at once)."""
    starts = Starts(succeed_at=2)
    notes: list[float] = []

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        notes.append(trio.current_time())

    retry = a2trio.Retry(3, backoff=Backoff(base_s=20, cap_s=20, jitter=0))
    handlers = {
        "ordered": a2trio.handler(starts.ordered, retry=retry),
        "note": a2trio.handler(note),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        failed = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        assert failed.not_before_ms is not None
        assert failed.not_before_ms == (failed.last_failed_at_ms or 0) + 20_000
        await session.append(orders.event("note", Note("b")))
        await app.advance(5)
        assert len(notes) == 1
        await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        await app.advance(11)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
    assert starts.waits() == [20.0]


async def test_the_seeds_schedule_as_a_backoff_is_held_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = Starts(succeed_at=4)
    retry = a2trio.Retry(5, backoff=rules.EVENT_RETRY)
    handlers = {"ordered": a2trio.handler(starts.ordered, retry=retry)}
    async with open_harness(orders, handlers=handlers) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.advance(60)
    assert starts.waits() == [1.0, 2.0, 4.0]


async def test_without_a_scheduler_the_sweep_finds_the_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = Starts(succeed_at=2)
    retry = a2trio.Retry(3, backoff=lambda n: 7.0)
    timings = a2trio.Timings(sweep_s=5)
    store = memory(clock=TrioClock())
    server = a2trio.Server(
        orders,
        store=store,
        handlers={"ordered": a2trio.handler(starts.ordered, retry=retry)},
        timings=timings,
    )
    async with server:
        await server.session("s1").append(orders.event("ordered", Ordered("a")))
        await trio.sleep(30)
    assert [attempt for attempt, _ in starts.at] == [1, 2]
    [wait] = starts.waits()
    assert 7.0 <= wait <= 7.0 + timings.sweep_s


async def test_a_backoff_that_raises_falls_back_to_the_seeds_rule(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(n: int) -> float:
        raise ZeroDivisionError("no schedule")

    starts = Starts(succeed_at=2)
    handlers = {"ordered": a2trio.handler(starts.ordered, retry=a2trio.Retry(3, backoff=broken))}
    with caplog.at_level(logging.ERROR, logger="a2trio.drain"):
        async with open_harness(orders, handlers=handlers) as app:
            session = app.session("s1")
            await session.append(orders.event("ordered", Ordered("a")))
            await app.advance(60)
            await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
    assert any(
        "Retry(backoff=...) raised for failure 1" in r.getMessage()
        and "the seed's rule retries it" in r.getMessage()
        for r in caplog.records
    )


async def test_a_dead_letter_stores_no_retry_at_and_redrive_runs_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = Starts()
    retry = a2trio.Retry(2, backoff=lambda n: 30.0)
    handlers = {"ordered": a2trio.handler(starts.ordered, retry=retry)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(40)
        dead = await app.assert_outcome(session, 1, "dead_lettered", attempts=2, failures=2)
        assert dead.not_before_ms is None
        starts.succeed_at = 3
        redriven_at = trio.current_time()
        await app.server.inspect.redrive("s1", 1, by="ops", reason="fixed")
        await app.advance(1)
        await app.assert_outcome(session, 1, "processed", attempts=3, failures=0)
    assert starts.waits()[0] == 30.0
    assert starts.at[2] == (3, redriven_at)


async def test_a_backoff_on_sqlite(mock_clock: trio.testing.MockClock) -> None:
    starts = Starts(succeed_at=2)
    handlers = {
        "ordered": a2trio.handler(starts.ordered, retry=a2trio.Retry(3, backoff=lambda n: 9.0))
    }
    async with open_store(TrioClock()) as store:
        async with open_harness(orders, handlers=handlers, store=store) as app:
            session = app.session("s1")
            await session.append(orders.event("ordered", Ordered("a")))
            await app.settle()
            failed = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
            assert failed.not_before_ms == (failed.last_failed_at_ms or 0) + 9_000
            mock_clock.jump(8.9)
            await app.drain(session)
            await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
            mock_clock.jump(0.1)
            await app.drain(session)
            await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)


# -- bad options ------------------------------------------------------------------


@pytest.mark.parametrize("backoff", [5, "1s", object()])
def test_a_backoff_that_is_no_backoff_fails_at_construction(backoff: Any) -> None:
    with pytest.raises(TypeError, match=r"Retry\(backoff=\.\.\.\) must be an a2trio.backoff"):
        a2trio.Retry(3, backoff=backoff)


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "3", None, True])
def test_a_backoff_function_must_give_seconds(seconds: Any) -> None:
    retry = a2trio.Retry(3, backoff=lambda n: seconds)
    with pytest.raises(ValueError, match=r"Retry\(backoff=\.\.\.\) must give a finite"):
        retry.retry_after_ms(1)


def test_retry_repr_and_equality_name_the_backoff() -> None:
    schedule = Backoff(base_s=1, cap_s=4, jitter=0)
    assert a2trio.Retry(3, backoff=schedule) == a2trio.Retry(3, backoff=schedule)
    assert a2trio.Retry(3, backoff=schedule) != a2trio.Retry(3)
    assert repr(a2trio.Retry(3, backoff=schedule)) == f"Retry(3, backoff={schedule!r})"
    assert a2trio.Retry(3, backoff=schedule).retry_after_ms(2) == 2_000
    assert a2trio.Retry(3).retry_after_ms(2) is None
