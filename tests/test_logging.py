"""Operators can act on the log (issue 18): handler failures, dead letters,
lapsed leases and store outages are logged under ``a2trio.*`` with the event's
coordinates as fields, once each, and an outage does not flood the log."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import trio
import trio.testing

import a2trio
from a2trio.serve import JsonFormatter, configure_logging
from a2trio.stores.memory import MemoryStore

from .apps import Ordered, orders


def records(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == name]


async def test_failures_and_the_dead_letter_are_logged_with_their_coordinates(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio")

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        raise RuntimeError("the courier is down")

    timings = a2trio.Timings(max_failures=2)
    store = a2trio.stores.memory(clock=a2trio.TrioClock())
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}, timings=timings) as s:
        await s.session("s1").append(orders.event("ordered", Ordered("book")))
        await trio.sleep(60)
    failed, dead = records(caplog, "a2trio.drain")
    assert (failed.levelno, dead.levelno) == (logging.WARNING, logging.ERROR)
    assert failed.getMessage() == (
        "ordered #1 of session 's1' (attempt 1) failed (1 of 2): it is retried"
    )
    assert dead.getMessage() == (
        "ordered #1 of session 's1' (attempt 2) failed 2 times: dead-lettered, "
        "and its lane is blocked behind it"
    )
    for record, attempt in ((failed, 1), (dead, 2)):
        assert record.exc_info is not None
        assert str(record.exc_info[1]) == "the courier is down"
        assert record.__dict__["a2_contract"] == "orders"
        assert record.__dict__["a2_session"] == "s1"
        assert record.__dict__["a2_event_type"] == "ordered"
        assert record.__dict__["a2_index"] == 1
        assert record.__dict__["a2_attempt"] == attempt
        assert isinstance(record.__dict__["a2_holder"], str)


async def test_each_attempt_is_one_info_line_on_a2trio_runs(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio.runs")

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(0.25)
        if ctx.attempt == 1:
            raise RuntimeError("the courier is down")

    timings = a2trio.Timings(max_failures=1)
    store = a2trio.stores.memory(clock=a2trio.TrioClock())
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}, timings=timings) as s:
        await s.session("s1").append(orders.event("ordered", Ordered("book")))
        await s.settle()
        await s.inspect.redrive("s1", 1, by="test")
        await s.drain("s1")
    first, second = records(caplog, "a2trio.runs")
    assert first.levelno == second.levelno == logging.INFO
    assert first.getMessage() == (
        "ran ordered #1 of session 's1' (attempt 1) in 250.0 ms: dead-lettered"
    )
    assert (
        second.getMessage() == "ran ordered #1 of session 's1' (attempt 2) in 250.0 ms: processed"
    )
    assert (first.__dict__["a2_outcome"], second.__dict__["a2_outcome"]) == (
        "dead_lettered",
        "processed",
    )
    assert second.__dict__["a2_duration_ms"] == 250.0
    assert second.__dict__["a2_index"] == 1
    # One failure is "1 time".
    [dead] = records(caplog, "a2trio.drain")
    assert "failed 1 time: dead-lettered" in dead.getMessage()


async def test_a_lapsed_lease_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="a2trio")

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.attempt == 1:
            await trio.sleep_forever()

    from a2trio.testing import open_harness

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        app.store.fail("renew_claims")
        await app.session("s1").append(orders.event("ordered", Ordered("book")))
        await trio.sleep(a2trio.DEFAULT_TIMINGS.claim_ttl_s + 1)
    [lapsed] = [r for r in records(caplog, "a2trio.drain") if "surrendered" in r.getMessage()]
    assert lapsed.getMessage() == (
        "ordered #1 of session 's1' (attempt 1) surrendered: its lease lapsed "
        "(renewals failed); it is retried once the claim expires"
    )


class FlakySweeps(MemoryStore):
    """A memory store whose sweep query fails while ``down``."""

    def __init__(self) -> None:
        super().__init__(clock=a2trio.TrioClock())
        self.down = False
        # The store stands in for its own sweep, asking the real one when up.
        self.memory_sweep = self.sweep
        self.sweep = self

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        if self.down:
            await trio.lowlevel.checkpoint()
            raise a2trio.A2Error("STORE_UNAVAILABLE", "sweep failed: the store is unavailable")
        return await self.memory_sweep.claimable_sessions(prefix, limit=limit)


async def test_an_outage_is_logged_once_a_minute_and_its_end_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio")
    store = FlakySweeps()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        return None

    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}):
        await trio.sleep(1)
        store.down = True
        await trio.sleep(150)  # 30 failed sweeps
        store.down = False
        await trio.sleep(10)
    logged = [(r.levelname, r.getMessage()) for r in records(caplog, "a2trio.store")]
    assert logged == [
        (
            "ERROR",
            "the store is unavailable (sweep: STORE_UNAVAILABLE: sweep failed: "
            "the store is unavailable); work waits and is retried",
        ),
        (
            "ERROR",
            "the store is still unavailable after 60 s (sweep: STORE_UNAVAILABLE: "
            "sweep failed: the store is unavailable)",
        ),
        (
            "ERROR",
            "the store is still unavailable after 120 s (sweep: STORE_UNAVAILABLE: "
            "sweep failed: the store is unavailable)",
        ),
        ("INFO", "the store is available again after 150.0 s"),
    ]


def test_serve_logs_json_lines_with_the_event_fields() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("a2trio.drain").makeRecord(
            "a2trio.drain",
            logging.WARNING,
            __file__,
            1,
            "%s failed",
            ("ordered #1",),
            sys.exc_info(),
            extra={"a2_session": "s1", "a2_index": 1},
        )
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in ("level", "logger", "message", "a2_session", "a2_index")} == {
        "level": "WARNING",
        "logger": "a2trio.drain",
        "message": "ordered #1 failed",
        "a2_session": "s1",
        "a2_index": 1,
    }
    assert line["traceback"].endswith("RuntimeError: boom")


def test_configure_logging_installs_one_handler_and_quiets_hypercorns_echo() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("hypercorn").propagate)
    try:
        configure_logging("warning", "json")
        [handler] = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert root.level == logging.WARNING
        assert logging.getLogger("hypercorn").propagate is False
        configure_logging("debug", "text")
        [handler] = root.handlers
        assert not isinstance(handler.formatter, JsonFormatter)
    finally:
        root.handlers[:], level, logging.getLogger("hypercorn").propagate = saved
        root.setLevel(level)


def test_serves_text_lines_stamp_times_as_pythons_formatter_does() -> None:
    # The date and time are formatted once a second (a line per request):
    # every record still reads as the stock formatter would write it.
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("hypercorn").propagate)
    try:
        configure_logging("info", "text")
        [handler] = root.handlers
        assert handler.formatter is not None
        stock = logging.Formatter(handler.formatter._fmt)
        for created in (1_764_700_000.0, 1_764_700_000.999, 1_764_700_001.5, 1_764_700_000.25):
            record = logging.makeLogRecord({"msg": "POST /board/s1 200 1.0 ms", "created": created})
            record.msecs = (created - int(created)) * 1000
            assert handler.formatter.format(record) == stock.format(record)
    finally:
        root.handlers[:], level, logging.getLogger("hypercorn").propagate = saved
        root.setLevel(level)
