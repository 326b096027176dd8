"""The abort hub's failure paths (``a2trio/abort.py``), under the autojump clock.

The hub's contract: a failure of its feed, of its catch-up read or of a
predicate is never swallowed. It aborts every handler the hub watches for and
becomes the error of their attempts, which record a failure and are retried;
a handler without ``abort_on`` is not affected.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

import a2trio
from a2trio.testing import RecordingTelemetry, open_harness

from .apps import Cancelled, Note, Ordered, Shipped, orders
from .breaking_feeds import BreakingFeeds

TTL = a2trio.Timings().claim_ttl_s
GRACE = a2trio.Timings().watchdog_grace_s


class Runs:
    """What each handler attempt did, as ``(item, attempt, start, end, how)``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, float, float, str]] = []

    def handler(self, seconds: float) -> Any:
        async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
            item, start = ctx.event.payload.item, trio.current_time()
            try:
                await trio.sleep(seconds)
            except trio.Cancelled:
                self.log.append((item, ctx.attempt, start, trio.current_time(), "cancelled"))
                raise
            self.log.append((item, ctx.attempt, start, trio.current_time(), "finished"))
            return orders.event("shipped", Shipped(item))

        return ship


def event_spans(telemetry: RecordingTelemetry, item_index: int) -> list[tuple[Any, Any]]:
    """(attempt, outcome) of every ``a2.event`` span of the event at an index."""
    return [
        (span.attributes["a2.event.attempt"], span.attributes.get("a2.event.outcome"))
        for span in telemetry.find("a2.event", {"a2.event.index": item_index})
    ]


async def test_a_raising_predicate_aborts_and_fails_the_attempt_and_the_retry_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    asked: list[tuple[int, float]] = []

    def picky(event: a2trio.Event[Any], trigger: a2trio.Event[Any], ctx: dict[str, int]) -> bool:
        asked.append((ctx["attempt"], trio.current_time()))
        if ctx["attempt"] == 1:
            raise ValueError("the predicate has a bug")
        return False  # the retry's predicate no longer matches

    handlers = {"ordered": a2trio.handler(runs.handler(100), abort_on={"cancelled": picky})}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(10)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.advance(0)
        # Aborted live, the instant the predicate raised; the error is the attempt's.
        assert runs.log == [("a", 1, 0.0, 10.0, "cancelled")]
        found = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        assert "ValueError: the predicate has a bug" in (found.last_error or "")
        # The watchdog armed with the claim (ttl + grace) retries it; the
        # retry's catch-up asks the predicate about the same abort event.
        await app.settle()
        await app.advance(TTL + GRACE - 10 + 100)
        assert runs.log[1:] == [("a", 2, TTL + GRACE, TTL + GRACE + 100, "finished")]
        # (A predicate may be asked more than once about an event it declines:
        # by the catch-up read and by the live feed.)
        assert asked[0] == (1, 10.0)
        assert set(asked[1:]) == {(2, TTL + GRACE)}
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
        await app.assert_log(session, ["ordered", "cancelled", "shipped"])
        assert event_spans(app.telemetry, 1) == [(1, "failed"), (2, "processed")]


async def test_a_predicate_raising_in_the_catch_up_cancels_the_handler_at_its_first_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()

    def broken(event: a2trio.Event[Any], trigger: a2trio.Event[Any], ctx: dict[str, int]) -> bool:
        raise KeyError(f"attempt {ctx['attempt']}")

    handlers = {"ordered": a2trio.handler(runs.handler(5), abort_on={"cancelled": broken})}
    # No scheduler: the retries below are explicit drains.
    async with open_harness(orders, handlers=handlers, scheduler=None) as app:
        key = app.server.key("s1")
        # The abort event is in the log before the handler first runs.
        await app.store.inner.append(
            key,
            [
                a2trio.stores.base.AppendEvent("ordered", {"item": "a", "qty": 1}),
                a2trio.stores.base.AppendEvent("cancelled", {"item": "a"}, settled=True),
            ],
        )
        first = await app.drain("s1")
        assert (first.settled, first.outcome, first.processed) == (False, "stalled", 0)
        assert runs.log == [("a", 1, 0.0, 0.0, "cancelled")]
        found = await app.assert_outcome("s1", 1, "failed", attempts=1, failures=1)
        assert "KeyError: 'attempt 1'" in (found.last_error or "")
        # Every retry meets the same predicate: the event dead-letters at max_failures.
        for _ in range(app.timings.max_failures - 1):
            await app.drain("s1")
        await app.assert_outcome("s1", 1, "dead_lettered", failures=app.timings.max_failures)
        assert [attempt for _, attempt, *_ in runs.log] == list(
            range(1, app.timings.max_failures + 1)
        )
        assert trio.current_time() == 0


async def test_a_failing_hub_feed_fails_every_watched_attempt_and_spares_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    notes: list[float] = []

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        await trio.sleep(20)
        notes.append(trio.current_time())

    store = BreakingFeeds(
        breaks_on="note", error=a2trio.A2Error("STORE_UNAVAILABLE", "the feed's connection dropped")
    )
    handlers: dict[str, Any] = {
        "ordered": a2trio.handler(runs.handler(100), abort_on=["cancelled"]),
        "note": note,
    }
    async with open_harness(orders, handlers=handlers, store=store) as app:
        session = app.session("s1")
        await session.append(
            orders.event("ordered", Ordered("a")), orders.event("ordered", Ordered("b"))
        )
        await app.advance(7)
        # Not an abort event, but the hub's feed breaks on reaching it.
        await session.append(orders.event("note", Note("unrelated")))
        await app.advance(0)
        assert store.broke_at == [7.0]
        assert sorted(runs.log) == [
            ("a", 1, 0.0, 7.0, "cancelled"),
            ("b", 1, 0.0, 7.0, "cancelled"),
        ]
        for index in (1, 2):
            found = await app.assert_outcome(session, index, "failed", attempts=1, failures=1)
            assert "the feed's connection dropped" in (found.last_error or "")
        # The handler without abort_on ran on, untouched.
        await app.advance(20)
        assert notes == [27.0]
        await app.assert_outcome(session, 3, "processed", attempts=1, failures=0)
        # The watchdog retries both with a fresh feed (the store broke only once).
        await app.advance(TTL + GRACE + 100 - 27)
        assert sorted(runs.log[2:]) == [
            ("a", 2, TTL + GRACE, TTL + GRACE + 100, "finished"),
            ("b", 2, TTL + GRACE, TTL + GRACE + 100, "finished"),
        ]
        await app.assert_log(session, ["ordered", "ordered", "note", "shipped", "shipped"])


async def test_a_hub_feed_that_ends_fails_the_watched_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    store = BreakingFeeds(breaks_on="note", error=None)
    handlers = {"ordered": a2trio.handler(runs.handler(100), abort_on=["cancelled"])}
    async with open_harness(orders, handlers=handlers, store=store) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(3)
        await session.append(orders.event("note", Note("the feed ends here")))
        await app.advance(0)
        assert runs.log == [("a", 1, 0.0, 3.0, "cancelled")]
        found = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        assert "the abort hub's feed ended while handlers were active" in (found.last_error or "")
        span = app.telemetry.one("a2.event", {"a2.event.index": 1, "a2.event.attempt": 1})
        assert span.attributes["a2.event.outcome"] == "failed"
        assert [type(e) for e in span.errors] == [RuntimeError]


async def test_a_failing_catch_up_read_fails_the_attempt_before_the_handler_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.handler(1), abort_on=["cancelled"])}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        with app.store.fail("read", times=1) as fault:
            await session.append(orders.event("ordered", Ordered("a")))
            await app.advance(0)
        assert fault.fired == 1
        assert runs.log == []
        found = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        assert "STORE_UNAVAILABLE" in (found.last_error or "")
        await app.advance(TTL + GRACE + 1)
        assert runs.log == [("a", 2, TTL + GRACE, TTL + GRACE + 1, "finished")]
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)


async def test_the_hub_stops_with_its_last_subscription_and_restarts_for_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One drain, two abort_on handlers one after the other (a lane): the hub's
    feed closes when the first ends and a new one follows for the second, so
    an abort event for the second still aborts it."""
    runs = Runs()
    handlers = {
        "ordered": a2trio.handler(runs.handler(10), lane="one", abort_on=["cancelled"]),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(
            orders.event("ordered", Ordered("a")), orders.event("ordered", Ordered("b"))
        )
        await app.advance(15)
        await session.append(orders.event("cancelled", Cancelled("b")))
        await app.settle()
        assert runs.log == [("a", 1, 0.0, 10.0, "finished"), ("b", 1, 10.0, 15.0, "cancelled")]
        await app.assert_outcome(session, 1, "processed")
        await app.assert_outcome(session, 2, "aborted", attempts=1, failures=0)
        await app.assert_log(session, ["ordered", "ordered", "shipped", "cancelled"])
