"""Tests of ``a2trio.testing``: the harness, fault injection, recorded spans, the plugin."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores import memory
from a2trio.testing import (
    AppFactory,
    FaultyStore,
    Harness,
    InjectedFault,
    RecordingTelemetry,
    TrioClock,
    open_harness,
)

ROOT = Path(__file__).resolve().parent.parent
NAIVE = datetime(2025, 1, 1)


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


class Cancelled(msgspec.Struct, frozen=True):
    item: str


shop = a2trio.contract(
    "shop", events={"ordered": Ordered, "shipped": Shipped, "cancelled": Cancelled}
)


def ordered(item: str = "book", id: str | None = None) -> a2trio.AppendInput:
    return shop.event("ordered", Ordered(item), id=id)


async def ship_after(seconds: float, ctx: a2trio.HandlerContext[Any]) -> a2trio.Returned:
    await trio.sleep(seconds)
    return shop.event("shipped", Shipped(ctx.event.payload.item))


async def ship_slowly(ctx: a2trio.HandlerContext[Any]) -> a2trio.Returned:
    return await ship_after(45, ctx)


async def ship_now(ctx: a2trio.HandlerContext[Any]) -> a2trio.Returned:
    return await ship_after(0, ctx)


async def always_fail(ctx: a2trio.HandlerContext[Any]) -> a2trio.Returned:
    raise RuntimeError(f"warehouse rejected {ctx.event.payload.item}")


# -- the package boundary ------------------------------------------------------


def test_import_a2trio_never_imports_pytest_or_the_kit() -> None:
    code = (
        "import sys, a2trio, a2trio.stores\n"
        "leaked = sorted(m for m in ('pytest', 'a2trio.testing') if m in sys.modules)\n"
        "print(leaked)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_plugin_fixtures_are_listed_by_pytest_fixtures(tmp_path: Path) -> None:
    # An empty directory: no conftest, so only the entry point can provide them.
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert {"a2_app", "a2_telemetry", "a2_clock"} <= listed
    assert "a2trio/testing/_plugin.py" in out.stdout or "a2trio.testing" in out.stdout


def test_trio_clock_is_the_core_clock() -> None:
    assert TrioClock is a2trio.TrioClock


def test_the_kit_exports_what_all_lists_sorted() -> None:
    import a2trio.testing

    assert a2trio.testing.__all__ == sorted(a2trio.testing.__all__)
    for name in a2trio.testing.__all__:
        assert getattr(a2trio.testing, name) is not None


# -- FaultyStore ---------------------------------------------------------------------


async def test_faulty_store_satisfies_the_store_protocol_and_shares_the_clock() -> None:
    clock = TrioClock()
    store = FaultyStore(memory(clock=clock))
    assert isinstance(store, a2trio.Store)
    assert store.clock is clock
    assert store.presence is store.inner.presence
    assert store.operator is store.inner.operator
    # The store's own wake-ups stay off, so the instants tests assert are the
    # watchdogs' (a sweep would start a lapsed claim's retry earlier).
    assert (store.sweep, store.pending) == (None, None)
    server = a2trio.Server(shop, store=store)
    assert server.clock is clock


async def test_fail_n_times_raises_store_unavailable_then_recovers(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        fault = app.store.fail("append", times=2)
        s = app.session("s")
        for _ in range(2):
            with pytest.raises(a2trio.A2Error) as caught:
                await s.append(ordered(id="o-1"))
            assert caught.value.code == a2trio.ErrorCode.STORE_UNAVAILABLE
            assert caught.value.message == "append failed: injected fault"
            assert isinstance(caught.value.__cause__, InjectedFault)
        # A rejected append changed nothing.
        await app.assert_log(s, [])
        assert fault.exhausted
        assert app.store.faults == []
        await s.append(ordered(id="o-1"))
        await app.assert_log(s, ["ordered"])
        stats = app.store.statistics()
        assert stats.calls["append"] == 3
        assert stats.injected == {"append": 2}
        assert stats.in_flight == 0


async def test_fail_after_commits_then_loses_the_answer(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        s = app.session("s")
        app.store.fail("append", times=1, after=True)
        with pytest.raises(a2trio.A2Error):
            await s.append(ordered(id="o-1"))
        # The write landed; retrying with the same id replays instead of duplicating.
        [replayed] = await s.append(ordered(id="o-1"))
        assert replayed.index == 1
        await app.assert_log(s, ["ordered"])


async def test_fault_window_in_trio_seconds_and_as_context_manager(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        s = app.session("s")
        app.store.fail("read", start=10, end=20)
        await s.history()
        await app.advance(10)
        with pytest.raises(a2trio.A2Error):
            await s.history()
        await app.advance(10)
        await s.history()
        with app.store.fail("read") as fault:
            with pytest.raises(a2trio.A2Error):
                await s.history()
        assert fault.fired == 1
        assert fault not in app.store.faults
        await s.history()


async def test_fault_window_as_datetimes_on_the_store_clock(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        s = app.session("s")
        start = app.now() + timedelta(minutes=1)
        app.store.fail("append", start=start, end=start + timedelta(seconds=1))
        await s.append(ordered())
        await app.advance_to(start)
        with pytest.raises(a2trio.A2Error):
            await s.append(ordered())
        await app.advance(1)
        await s.append(ordered())
        await app.assert_log(s, ["ordered", "ordered"])


async def test_delay_costs_exactly_that_much_trio_time(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        app.store.delay("append", seconds=2.5, times=1)
        app.store.delay("read", seconds=1, after=True)
        s = app.session("s")
        await s.append(ordered())
        assert trio.current_time() == 2.5
        await s.append(ordered())
        assert trio.current_time() == 2.5
        await s.history()
        assert trio.current_time() == 3.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"^name at least one operation: \['append', "),
        ({"operations": ("claim",)}, r"^unknown store operation\(s\) \['claim'\]: choose from "),
        ({"times": 0}, r"^`times` must be a positive integer or None, got 0$"),
        ({"start": 5.0, "end": 5.0}, r"^`end` \(5\.0\) must be after `start` \(5\.0\)$"),
    ],
)
def test_fault_rules_are_validated(kwargs: dict[str, Any], message: str) -> None:
    store = FaultyStore(memory(clock=TrioClock()))
    operations = kwargs.pop("operations", () if not kwargs else ("append",))
    with pytest.raises(ValueError, match=message):
        store.fail(*operations, **kwargs)
    assert store.faults == []


def test_fault_rules_reject_naive_datetimes_and_negative_delays() -> None:
    store = FaultyStore(memory(clock=TrioClock()))
    with pytest.raises(ValueError, match=r"^use an aware datetime, got naive "):
        store.fail("append", start=NAIVE)
    with pytest.raises(ValueError, match=r"^`seconds` must be non-negative, got -1$"):
        store.delay("append", seconds=-1)


# -- RecordingTelemetry ---------------------------------------------------------------


async def test_recording_telemetry_records_spans_attributes_and_errors(
    autojump_clock: Any,
) -> None:
    telemetry = RecordingTelemetry()
    with telemetry.span("a2.append", {"a2.contract": "shop"}) as span:
        await trio.sleep(2)
        span.set_attribute("a2.append.count", 2)
        span.record_error(ValueError("noted"))
    with pytest.raises(KeyError), telemetry.span("a2.state", {}):
        raise KeyError("boom")
    appended = telemetry.one("a2.append", {"a2.contract": "shop"})
    assert appended.attributes == {"a2.contract": "shop", "a2.append.count": 2}
    assert [str(e) for e in appended.errors] == ["noted"]
    assert appended.error is None
    assert (appended.started_at, appended.ended_at) == (0, 2)
    assert isinstance(telemetry.one("a2.state").error, KeyError)
    assert telemetry.find("a2.append", {"a2.contract": "other"}) == []
    with pytest.raises(AssertionError, match=r"found 0; recorded 'a2.append' spans:\n  Recorded"):
        telemetry.one("a2.append", {"a2.append.count": 3})
    telemetry.clear()
    assert telemetry.spans == []


async def test_harness_telemetry_sees_the_engines_spans(autojump_clock: Any) -> None:
    async with open_harness(shop, handlers={"ordered": ship_now}) as app:
        await app.session("s").append(ordered())
        await app.settle()
        event = app.telemetry.one("a2.event", {"a2.event.type": "ordered"})
        assert event.attributes["a2.event.outcome"] == "processed"
        assert event.attributes["a2.event.attempt"] == 1
        drains = app.telemetry.find("a2.drain", {"a2.session_id": "s"})
        assert drains[-1].attributes["a2.drain.outcome"] == "settled"


# -- the harness: time ------------------------------------------------------------------


async def test_advance_runs_heartbeats_and_stops_exactly_at_the_target(
    autojump_clock: Any,
) -> None:
    async with open_harness(shop, handlers={"ordered": ship_slowly}) as app:
        s = app.session("s")
        await s.append(ordered())
        await app.advance(44.5)
        assert trio.current_time() == 44.5
        assert (await app.outcome(s, 1)).status == "pending"
        # Heartbeats at 10, 20, 30, 40 kept the 30 s lease alive: one attempt.
        assert app.store.statistics().calls["renew_claims"] == 4
        await app.advance(0.5)
        await app.assert_outcome(s, 1, "processed", attempts=1)
        await app.assert_log(s, ["ordered", "shipped"])


async def test_settle_waits_out_a_sleeping_handler_under_autojump(autojump_clock: Any) -> None:
    async with open_harness(shop, handlers={"ordered": ship_slowly}) as app:
        await app.session("s").append(ordered())
        await app.settle()
        assert trio.current_time() == 45
        await app.assert_log("s", ["ordered", "shipped"])


async def test_settle_waits_out_a_delayed_scheduled_append(autojump_clock: Any) -> None:
    async with open_harness(shop, handlers={"ordered": ship_now}) as app:
        s = app.session("s")
        await s.schedule("later", "10s", ordered())
        app.store.delay("append", seconds=5)
        await app.advance(10)
        await app.assert_log(s, [])
        await app.settle()
        assert trio.current_time() == 15
        await app.assert_log(s, ["ordered", "shipped"])


async def test_advance_to_a_datetime(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        start = app.now()
        await app.advance_to(start + timedelta(days=3))
        assert trio.current_time() == 3 * 86_400
        assert app.now() == start + timedelta(days=3)
        with pytest.raises(ValueError, match=r"is in the past"):
            await app.advance_to(start)
        with pytest.raises(ValueError, match=r"^advance_to needs an aware datetime"):
            await app.advance_to(NAIVE)
        with pytest.raises(ValueError, match=r"^`seconds` must be non-negative, got -1$"):
            await app.advance(-1)


async def test_jump_mode_drain_moves_the_clock_like_autojump(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with open_harness(shop, handlers={"ordered": ship_slowly}, scheduler=None) as app:
        s = app.session("s")
        await s.append(ordered())
        await app.advance(1)
        await app.restart()
        await app.advance(29)
        result = await app.drain(s)
        assert result.outcome == "settled"
        assert trio.current_time() == 75
        await app.assert_outcome(s, 1, "processed", attempts=2)


async def test_jump_mode_settle_reports_work_that_can_never_finish(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with open_harness(shop, scheduler=None) as app, trio.open_nursery() as nursery:
        app.store.delay("append", seconds=math.inf)
        nursery.start_soon(app.session("s").append, ordered())
        with pytest.raises(RuntimeError, match=r"^settle: work is in progress, but every task"):
            await app.settle()
        nursery.cancel_scope.cancel()


async def test_the_harness_needs_a_mock_clock() -> None:
    async with open_harness(shop) as app:
        with pytest.raises(RuntimeError, match=r"take pytest-trio's `autojump_clock` fixture"):
            await app.advance(1)


async def test_the_harness_needs_a_trio_clock_store() -> None:
    with pytest.raises(TypeError, match=r"needs a store on a2trio.testing.TrioClock"):
        async with open_harness(shop, store=memory()):
            pass  # pragma: no cover


@asynccontextmanager
async def real_store(backend: str, tmp_path: Path) -> AsyncIterator[a2trio.Store]:
    if backend == "sqlite":
        from a2trio.stores.sqlite import sqlite

        yield sqlite(str(tmp_path / "app.db"), clock=TrioClock())
        return
    from tests.backends.postgres import open_store

    async with open_store(TrioClock()) as store:
        yield store


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_jump_mode_on_a_real_backend_lapses_a_lease_when_renewals_fail(
    mock_clock: trio.testing.MockClock, tmp_path: Path, backend: str
) -> None:
    """The lease scenario of the memory store, on a real backend: the clock
    moves by ``MockClock.jump`` between quiet points, never mid-query."""
    async with (
        real_store(backend, tmp_path) as store,
        open_harness(shop, store=store, handlers={"ordered": ship_slowly}) as app,
    ):
        s = app.session("s")
        app.store.fail("renew_claims", start=5, end=35)
        await s.append(ordered())
        await app.advance(30)
        assert trio.current_time() == 30
        surrendered = app.telemetry.one("a2.event", {"a2.event.attempt": 1})
        assert surrendered.attributes["a2.event.outcome"] == "surrendered"
        await app.assert_outcome(s, 1, "pending", attempts=2)
        # As under autojump, settle() moves the clock while attempt 2 sleeps.
        await app.settle()
        assert trio.current_time() == 75
        await app.assert_outcome(s, 1, "processed", attempts=2, failures=0)
        await app.assert_log(s, ["ordered", "shipped"])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_jump_mode_on_a_real_backend_restarts_and_fires_schedules(
    mock_clock: trio.testing.MockClock, tmp_path: Path, backend: str
) -> None:
    async with (
        real_store(backend, tmp_path) as store,
        open_harness(shop, store=store, handlers={"ordered": ship_slowly}) as app,
    ):
        s = app.session("s")
        await s.append(ordered("desk"))
        await app.advance(5)
        await app.restart()
        assert (await app.drain(s)).outcome == "busy"
        await app.advance(30)  # the watchdog at t=35 starts attempt 2
        await app.settle()
        assert trio.current_time() == 80
        await app.assert_outcome(s, 1, "processed", attempts=2)
        # Handles belong to the server that made them: take one from the new server.
        s = app.session("s")
        await s.schedule("later", "3d", ordered("chair"))
        await app.advance(3 * 86_400)
        await app.assert_log(s, ["ordered", "shipped", "ordered"])


# -- the harness: outcomes and assertions -------------------------------------------------


async def test_outcomes_pending_failed_dead_lettered(autojump_clock: Any) -> None:
    timings = a2trio.Timings(max_failures=2)
    async with open_harness(shop, handlers={"ordered": always_fail}, timings=timings) as app:
        s = app.session("s")
        await s.append(ordered("piano"))
        await app.settle()
        failed = await app.assert_outcome(s, 1, "failed", failures=1, attempts=1)
        assert failed.last_error is not None
        assert "RuntimeError: warehouse rejected piano" in failed.last_error
        result = await app.drain(s)
        assert result.outcome == "stalled"
        await app.assert_outcome(s, 1, "dead_lettered", failures=2, attempts=2)
        with pytest.raises(
            AssertionError, match=r"status='dead_lettered' \(expected 'processed'\)"
        ):
            await app.assert_outcome(s, 1, "processed")


async def test_outcomes_processed_and_aborted(autojump_clock: Any) -> None:
    handlers = {"ordered": a2trio.handler(ship_slowly, abort_on=["cancelled"])}
    async with open_harness(shop, handlers=handlers) as app:
        s = app.session("s")
        [first] = await s.append(ordered("book"))
        await app.settle()
        [second] = await s.append(ordered("lamp"))
        await app.advance(1)
        await s.append(shop.event("cancelled", Cancelled("lamp")))
        await app.settle()
        done = await app.assert_outcome(s, first, "processed")
        assert len(done.returned_ids) == 1
        aborted = await app.assert_outcome(s, second.id, "aborted", attempts=1)
        assert aborted.returned_ids == []
        # A type with no handler is stored processed at once.
        await app.assert_outcome(s, 4, "processed", attempts=0)
        await app.assert_log(s, ["ordered", "shipped", "ordered", "cancelled"])


async def test_assertion_messages_show_the_log(autojump_clock: Any) -> None:
    async with open_harness(shop) as app:
        s = app.session("s")
        await s.append(ordered("book", id="o-1"))
        with pytest.raises(AssertionError) as caught:
            await app.assert_log(s, ["ordered", "shipped"])
        assert str(caught.value) == (
            "log of 's' is ['ordered'], expected ['ordered', 'shipped']:\n"
            "  #1 ordered: Ordered(item='book')"
        )
        with pytest.raises(AssertionError, match=r"^session 's' has no event 2; its log: #1 "):
            await app.outcome(s, 2)
        with pytest.raises(AssertionError, match=r"attempts=0 \(expected 3\)"):
            await app.assert_outcome(s, "o-1", "processed", attempts=3)


# -- the harness: restarts -------------------------------------------------------------------


async def test_restart_mid_handler_leaves_the_claim_to_lapse(autojump_clock: Any) -> None:
    runs: list[tuple[int, float]] = []

    async def record_and_ship(ctx: a2trio.HandlerContext[Any]) -> a2trio.Returned:
        runs.append((ctx.attempt, trio.current_time()))
        return await ship_after(20, ctx)

    async with open_harness(shop, handlers={"ordered": record_and_ship}) as app:
        s = app.session("s")
        await s.append(ordered())
        await app.advance(5)
        old = app.server
        new = await app.restart()
        assert new is app.server
        assert new is not old
        assert app.restarts == 1
        await app.assert_outcome(s, 1, "pending", attempts=1)
        # The dead process's claim holds until its ttl: a drain now is busy.
        busy = await app.drain(s)
        assert busy.outcome == "busy"
        await app.advance(app.timings.claim_ttl_s - 5)
        assert (await app.drain(s)).outcome == "settled"
        assert runs == [(1, 0.0), (2, 30.0)]
        await app.assert_outcome(s, 1, "processed", attempts=2)
        cancelled = app.telemetry.one("a2.event", {"a2.event.attempt": 1})
        assert isinstance(cancelled.error, trio.Cancelled)


async def test_a_presence_contract_runs_on_the_wrapped_store(autojump_clock: Any) -> None:
    rooms = a2trio.contract("rooms", events={"shipped": Shipped}, presence={"typing": bool})
    async with open_harness(rooms, presence_ttl_ms=5_000) as app:
        s = app.session("r")
        await s.set_presence("ada", {"typing": True})
        assert (await s.presence())["ada"]["typing"].value is True
        await app.advance(5)
        assert await s.presence() == {}


# -- the pytest fixtures ------------------------------------------------------------------------


async def test_a2_app_factory_opens_harnesses_closed_at_teardown(
    autojump_clock: Any, a2_app: AppFactory
) -> None:
    one = await a2_app(shop, handlers={"ordered": ship_now})
    two = await a2_app(shop, handlers={"ordered": ship_now})
    assert isinstance(one, Harness)
    assert one.store is not two.store
    await one.session("s").append(ordered())
    await one.settle()
    await one.assert_log("s", ["ordered", "shipped"])
    await two.assert_log("s", [])


async def test_a2_app_reports_to_the_telemetry_given(
    autojump_clock: Any, a2_app: AppFactory, a2_telemetry: RecordingTelemetry
) -> None:
    app = await a2_app(shop, telemetry=a2_telemetry, scheduler=None)
    assert app.server.scheduler is None
    await app.session("s").append(ordered())
    assert app.telemetry is a2_telemetry
    assert a2_telemetry.one("a2.append").attributes["a2.append.types"] == "ordered"


def test_a2_telemetry_and_a2_clock_fixtures(
    a2_telemetry: RecordingTelemetry, a2_clock: TrioClock
) -> None:
    assert a2_telemetry.spans == []
    assert a2_clock.epoch_ms == TrioClock().epoch_ms


# -- the guide's examples ------------------------------------------------------------------------

EXAMPLES = ROOT / "examples" / "testing"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"a2trio_guide_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Collected here so the suite runs them; `pytest examples/testing` runs them too.
test_guide_lease_lapse = _example("test_lease_lapse").test_lease_lapses_when_renewals_fail
test_guide_dead_letter = _example("test_dead_letter").test_retries_end_in_a_dead_letter
test_guide_abort = _example("test_abort").test_cancellation_aborts_the_running_handler
test_guide_schedule = _example("test_schedule").test_reminder_arrives_three_days_later
test_guide_restart = _example("test_restart").test_a_crash_mid_handler_is_retried


def test_every_example_is_run_and_shown_verbatim_in_the_guide() -> None:
    run = {
        "test_lease_lapse",
        "test_dead_letter",
        "test_abort",
        "test_schedule",
        "test_restart",
    }
    assert {path.stem for path in EXAMPLES.glob("*.py")} == run
    guide = (ROOT / "docs" / "testing.md").read_text()
    for name in sorted(run):
        source = (EXAMPLES / f"{name}.py").read_text()
        assert f"```python\n{source}```" in guide, f"docs/testing.md is missing {name}.py"


async def test_faults_describe_themselves_and_wait_idle_waits_for_real_calls(
    autojump_clock: Any,
) -> None:
    release = trio.Event()

    class Slow(a2trio.stores.MemoryStore):
        async def read_states(self, session_ids: Any, reducer: str) -> Any:
            await release.wait()
            return await super().read_states(session_ids, reducer)

    store = FaultyStore(Slow(clock=TrioClock()))
    fault = store.delay("read", "read_state", seconds=2, times=3)
    assert repr(fault) == "Fault(delay read,read_state, fired=0, times=3)"
    idle: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.read_states, ["s"], "count")
        await trio.testing.wait_all_tasks_blocked()
        assert store.statistics().in_flight == 1

        async def waiter() -> None:
            await store.wait_idle()
            idle.append(trio.current_time())

        nursery.start_soon(waiter)
        await trio.sleep(5)
        assert idle == []  # still waiting: the real call has not returned
        release.set()
    assert idle == [5.0]
    assert store.statistics().calls == {"read_states": 1}
    await store.aclose()
