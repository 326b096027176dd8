"""Per-handler ``retry=`` and ``timeout=`` (issue 33), on the autojump clock
(the memory store) and once on SQLite (jump mode).

``retry=a2trio.Retry(n, non_retryable=(...))`` sets how many failed attempts
dead-letter an event, and which exceptions dead-letter it on the first;
``timeout=`` cancels a handler past its seconds and fails the attempt with a
``TimeoutError`` naming the timeout. A timeout composes with the other
scopes: an abort landing first is an abort, a superseded or lapsed lease
spends no failure, and a server shutdown stores nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores.base import Claimed
from a2trio.testing import RecordingTelemetry, TrioClock, open_harness

from .apps import Cancelled, Note, Ordered, Shipped, orders
from .backends.sqlite import open_store

TTL = a2trio.Timings().claim_ttl_s
HEARTBEAT = a2trio.Timings().heartbeat_s
GRACE = a2trio.Timings().watchdog_grace_s


def outcomes(telemetry: RecordingTelemetry, index: int) -> list[tuple[Any, Any]]:
    """(attempt, outcome) of each ``a2.event`` span of the event at ``index``."""
    return [
        (span.attributes["a2.event.attempt"], span.attributes.get("a2.event.outcome"))
        for span in telemetry.find("a2.event", {"a2.event.index": index})
    ]


class Runs:
    """Each attempt as ``(what, attempt, start, end, how)``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, float, float, str]] = []

    def sleeper(self, seconds: float, *, until_attempt: int = 1_000) -> Any:
        """A handler that sleeps ``seconds`` up to attempt ``until_attempt``,
        then returns at once."""

        async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
            start = trio.current_time()
            try:
                if ctx.attempt < until_attempt:
                    await trio.sleep(seconds)
            except trio.Cancelled:
                self.log.append(("ship", ctx.attempt, start, trio.current_time(), "cancelled"))
                raise
            self.log.append(("ship", ctx.attempt, start, trio.current_time(), "finished"))
            return orders.event("shipped", Shipped(ctx.event.payload.item))

        return ship

    def raiser(self, what: str, error: type[Exception]) -> Any:
        async def fail(ctx: a2trio.HandlerContext[Any]) -> None:
            now = trio.current_time()
            self.log.append((what, ctx.attempt, now, now, "raised"))
            raise error(f"{what} attempt {ctx.attempt}")

        return fail


# -- retry= --------------------------------------------------------------------


async def test_each_handler_dead_letters_after_its_own_max_attempts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {
        "ordered": a2trio.handler(runs.raiser("ordered", RuntimeError), retry=a2trio.Retry(2)),
        "note": a2trio.handler(runs.raiser("note", RuntimeError), retry=a2trio.Retry(4)),
        # No retry=: the server's Timings.max_failures.
        "cancelled": runs.raiser("cancelled", RuntimeError),
    }
    timings = a2trio.Timings(max_failures=3)
    async with open_harness(orders, handlers=handlers, timings=timings) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await session.append(orders.event("note", Note("b")))
        await session.append(orders.event("cancelled", Cancelled("c")))
        await app.advance(3_600)
        await app.assert_outcome(session, 1, "dead_lettered", attempts=2, failures=2)
        await app.assert_outcome(session, 2, "dead_lettered", attempts=4, failures=4)
        await app.assert_outcome(session, 3, "dead_lettered", attempts=3, failures=3)
        attempts = {what: [a for w, a, *_ in runs.log if w == what] for what, *_ in runs.log}
        assert attempts == {"ordered": [1, 2], "note": [1, 2, 3, 4], "cancelled": [1, 2, 3]}
        found = await app.outcome(session, 2)
        assert "RuntimeError: note attempt 4" in (found.last_error or "")


async def test_a_non_retryable_exception_dead_letters_on_its_first_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    retry = a2trio.Retry(5, non_retryable=(ValueError,))
    handlers = {
        "ordered": a2trio.handler(runs.raiser("ordered", ValueError), retry=retry),
        # Another exception is retried up to max_attempts as usual.
        "note": a2trio.handler(runs.raiser("note", KeyError), retry=retry),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await session.append(orders.event("note", Note("b")))
        await app.advance(3_600)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=1, failures=1)
        assert "ValueError: ordered attempt 1" in (found.last_error or "")
        await app.assert_outcome(session, 2, "dead_lettered", attempts=5, failures=5)
        assert [a for w, a, *_ in runs.log if w == "ordered"] == [1]
        assert outcomes(app.telemetry, 1) == [(1, "dead_lettered")]


def test_a_group_is_non_retryable_when_every_exception_in_it_is() -> None:
    retry = a2trio.Retry(non_retryable=(ValueError, TimeoutError))
    assert not retry.retryable(ValueError("x"))
    assert not retry.retryable(ExceptionGroup("g", [ValueError("x"), TimeoutError("y")]))
    assert retry.retryable(ExceptionGroup("g", [ValueError("x"), KeyError("y")]))
    assert retry.retryable(KeyError("y"))
    assert a2trio.Retry().retryable(ValueError("x"))


async def test_a_non_retryable_failure_says_so_in_the_log(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    runs = Runs()
    retry = a2trio.Retry(non_retryable=(ValueError,))
    handlers = {"ordered": a2trio.handler(runs.raiser("ordered", ValueError), retry=retry)}
    caplog.set_level(logging.INFO, logger="a2trio")
    async with open_harness(orders, handlers=handlers) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.settle()
    [dead] = [r for r in caplog.records if r.name == "a2trio.drain"]
    assert dead.levelno == logging.ERROR
    assert dead.getMessage() == (
        "ordered #1 of session 's1' (attempt 1) failed with a non-retryable ValueError: "
        "dead-lettered, and its lane is blocked behind it"
    )
    [ran] = [r for r in caplog.records if r.name == "a2trio.runs"]
    assert ran.getMessage().endswith(": dead-lettered")


# -- timeout= ------------------------------------------------------------------


async def test_a_timeout_fails_the_attempt_and_the_retry_completes(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.sleeper(100, until_attempt=2), timeout=2)}
    caplog.set_level(logging.INFO, logger="a2trio")
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(3)
        assert runs.log == [("ship", 1, 0.0, 2.0, "cancelled")]
        found = await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        assert found.last_error == (
            "TimeoutError: handler 'Runs.sleeper.<locals>.ship' timed out after 2.0 s\n"
        )
        # The watchdog armed with the claim (ttl + grace) retries it.
        await app.advance(TTL + GRACE)
        assert runs.log[1:] == [("ship", 2, TTL + GRACE, TTL + GRACE, "finished")]
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
        await app.assert_log(session, ["ordered", "shipped"])
        assert outcomes(app.telemetry, 1) == [(1, "failed"), (2, "processed")]
        [timed_out] = app.telemetry.find("a2.event", {"a2.event.timed_out": True})
        assert timed_out.attributes["a2.event.attempt"] == 1
    ran = [r.getMessage() for r in caplog.records if r.name == "a2trio.runs"]
    assert ran == [
        "ran ordered #1 of session 's1' (attempt 1) in 2000.0 ms: timed out, failed",
        "ran ordered #1 of session 's1' (attempt 2) in 0.0 ms: processed",
    ]
    [warning] = [r for r in caplog.records if r.name == "a2trio.drain"]
    assert warning.getMessage() == (
        "ordered #1 of session 's1' (attempt 1) timed out (1 of 10): it is retried"
    )


async def test_timeouts_dead_letter_at_max_attempts_or_at_once_when_non_retryable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()

    async def note_sleeper(ctx: a2trio.HandlerContext[Note]) -> None:
        await trio.sleep(100)

    handlers = {
        "ordered": a2trio.handler(runs.sleeper(100), timeout=1.5, retry=a2trio.Retry(2)),
        "note": a2trio.handler(
            note_sleeper, timeout=1, retry=a2trio.Retry(non_retryable=(TimeoutError,))
        ),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await session.append(orders.event("note", Note("b")))
        await app.advance(3_600)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=2, failures=2)
        assert "timed out after 1.5 s" in (found.last_error or "")
        found = await app.assert_outcome(session, 2, "dead_lettered", attempts=1, failures=1)
        assert "handler 'test_timeouts_dead_letter" in (found.last_error or "")
        assert "note_sleeper' timed out after 1.0 s" in (found.last_error or "")
        assert [how for *_, how in runs.log] == ["cancelled", "cancelled"]


async def test_a_handler_within_its_timeout_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.sleeper(1.9), timeout=2)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.settle()
        assert runs.log == [("ship", 1, 0.0, 1.9, "finished")]
        await app.assert_outcome(session, 1, "processed", attempts=1, failures=0)


async def test_an_abort_before_the_timeout_is_an_abort(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {
        "ordered": a2trio.handler(runs.sleeper(100), timeout=10, abort_on=["cancelled"]),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.advance(100)
        assert runs.log == [("ship", 1, 0.0, 5.0, "cancelled")]
        await app.assert_outcome(session, 1, "aborted", attempts=1, failures=0)
        assert app.telemetry.find("a2.event", {"a2.event.timed_out": True}) == []


async def test_a_timeout_before_the_abort_event_fails_and_the_retry_is_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {
        "ordered": a2trio.handler(runs.sleeper(100), timeout=10, abort_on=["cancelled"]),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(12)
        await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.settle()
        # The append's drain runs the retry; its catch-up sees the abort event.
        assert runs.log == [
            ("ship", 1, 0.0, 10.0, "cancelled"),
            ("ship", 2, 12.0, 12.0, "cancelled"),
        ]
        await app.assert_outcome(session, 1, "aborted", attempts=2, failures=1)


async def test_a_superseded_attempt_spends_no_failure_on_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """As in test_drain_supersession.py: the stored clock steps past the ttl,
    another holder claims the event, and the heartbeat's renewal reports the
    newer attempt at t=10, before the timeout (15 s) would have fired."""
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.sleeper(100), timeout=HEARTBEAT + 5)}
    async with open_harness(orders, handlers=handlers, scheduler=None) as app:
        session = app.session("s1")
        key = app.server.key("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        app.clock.epoch_ms += int(TTL * 1000) + 1_000
        other = await app.store.inner.claim_available(key, holder="other", ttl_ms=60_000)
        assert isinstance(other, Claimed)
        await app.advance(HEARTBEAT + 20)
        assert runs.log == [("ship", 1, 0.0, HEARTBEAT, "cancelled")]
        await app.assert_outcome(session, 1, "pending", attempts=2, failures=0)
        assert outcomes(app.telemetry, 1) == [(1, "superseded")]


async def test_a_lease_lapsing_before_the_timeout_surrenders(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.sleeper(100, until_attempt=2), timeout=TTL + 10)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        with app.store.fail("renew_claims"):
            await session.append(orders.event("ordered", Ordered("a")))
            await app.advance(TTL + 1)
        await app.advance(GRACE)
        assert runs.log[0] == ("ship", 1, 0.0, TTL, "cancelled")
        assert outcomes(app.telemetry, 1) == [(1, "surrendered"), (2, "processed")]
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=0)


async def test_a_shutdown_during_a_timed_handler_stores_no_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.sleeper(100, until_attempt=2), timeout=10)}
    async with open_harness(orders, handlers=handlers) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        await app.restart()
        assert runs.log == [("ship", 1, 0.0, 5.0, "cancelled")]
        await app.assert_outcome("s1", 1, "pending", attempts=1, failures=0)
        # The claim lapses and the new server's drain retries it.
        found = await app.drain("s1")
        assert found.outcome == "busy"
        await app.advance(TTL)
        await app.drain("s1")
        await app.assert_outcome("s1", 1, "processed", attempts=2, failures=0)


# -- on SQLite -----------------------------------------------------------------


async def test_retry_and_timeout_on_sqlite(mock_clock: trio.testing.MockClock) -> None:
    runs = Runs()
    handlers = {
        "ordered": a2trio.handler(runs.sleeper(100), timeout=2, retry=a2trio.Retry(2)),
        "note": a2trio.handler(
            runs.raiser("note", ValueError), retry=a2trio.Retry(non_retryable=(ValueError,))
        ),
    }
    async with open_store(TrioClock()) as store:
        async with open_harness(orders, handlers=handlers, store=store, scheduler=None) as app:
            session = app.session("s1")
            await session.append(orders.event("ordered", Ordered("a")))
            await session.append(orders.event("note", Note("b")))
            await app.settle()
            await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
            await app.assert_outcome(session, 2, "dead_lettered", attempts=1, failures=1)
            await app.drain(session)
            found = await app.assert_outcome(session, 1, "dead_lettered", attempts=2, failures=2)
            assert "timed out after 2.0 s" in (found.last_error or "")
            assert sorted((w, a, how) for w, a, _, _, how in runs.log) == [
                ("note", 1, "raised"),
                ("ship", 1, "cancelled"),
                ("ship", 2, "cancelled"),
            ]


# -- bad options ------------------------------------------------------------------


async def _noop(ctx: a2trio.HandlerContext[Ordered]) -> None:
    return None


_ordered = a2trio.event_type("ordered", Ordered)


def _handler(**options: Any) -> Any:
    return a2trio.handler(_noop, **options)


def _on(**options: Any) -> Any:
    return a2trio.on(_ordered, _noop, **options)


@pytest.mark.parametrize(
    ("build", "options", "error", "message"),
    [
        (a2trio.Retry, {"max_attempts": 0}, ValueError, r"max_attempts=...\) must be at least 1"),
        (a2trio.Retry, {"max_attempts": -3}, ValueError, "max_attempts"),
        (a2trio.Retry, {"max_attempts": 2.5}, TypeError, r"max_attempts=...\) must be an int"),
        (a2trio.Retry, {"max_attempts": True}, TypeError, "max_attempts"),
        (a2trio.Retry, {"non_retryable": ValueError}, TypeError, "non_retryable"),
        (a2trio.Retry, {"non_retryable": [ValueError]}, TypeError, "non_retryable"),
        (a2trio.Retry, {"non_retryable": (ValueError, "x")}, TypeError, "non_retryable"),
        (a2trio.Retry, {"non_retryable": (int,)}, TypeError, "tuple of exception classes"),
        (_handler, {"retry": 3}, TypeError, "retry must be an a2trio.Retry"),
        (_handler, {"timeout": 0}, ValueError, "timeout must be a positive"),
        (_handler, {"timeout": -1.0}, ValueError, "timeout"),
        (_handler, {"timeout": float("inf")}, ValueError, "finite"),
        (_handler, {"timeout": float("nan")}, ValueError, "timeout"),
        (_handler, {"timeout": "2s"}, TypeError, "timeout must be a number"),
        (_handler, {"timeout": True}, TypeError, "timeout"),
        (_on, {"timeout": 0}, ValueError, "timeout"),
        (_on, {"retry": a2trio.Retry}, TypeError, "retry"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(
    build: Any, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build(**options)


def test_options_are_kept_on_the_spec() -> None:
    retry = a2trio.Retry(3, non_retryable=(ValueError,))
    spec = a2trio.handler(_noop, retry=retry, timeout=2)
    assert (spec.retry, spec.timeout) == (retry, 2.0)
    assert isinstance(spec.timeout, float)
    assert retry == a2trio.Retry(3, non_retryable=(ValueError,))
    assert repr(retry) == "Retry(3, non_retryable=(ValueError,))"
    assert repr(a2trio.Retry()) == "Retry(10)"
    typed = a2trio.on(_ordered, _noop, retry=retry, timeout=0.5)
    assert (typed.retry, typed.timeout) == (retry, 0.5)
    plain = a2trio.handler(_noop)
    assert (plain.retry, plain.timeout) == (None, None)
