"""Schedules, dispatch and watchdogs on the memory store with the LocalScheduler.

Every test runs on ``autojump_clock`` with the store and server on
``TrioClock``, so due times are exact instants of Trio time (issue 7).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
import trio

import a2trio
from a2trio.clock import ms_to_datetime
from a2trio.scheduler import AppendTask, DrainTask, ScheduledEvent, SchedulerTask, task_id
from a2trio.schedulers import LocalScheduler
from a2trio.stores import MemoryStore, memory


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Note(msgspec.Struct, frozen=True):
    text: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "note": Note})
EPOCH_MS = a2trio.TrioClock().epoch_ms
SID = "s1"


def at(seconds: float) -> int:
    """Epoch ms of Trio time ``seconds``."""
    return EPOCH_MS + round(seconds * 1000)


def fresh_store() -> MemoryStore:
    return memory(clock=a2trio.TrioClock())


def make_server(
    store: MemoryStore,
    scheduler: a2trio.Scheduler | None,
    handlers: dict[str, a2trio.HandlerSpec | Callable[..., Awaitable[Any]]] | None = None,
) -> a2trio.Server:
    # sweep=False: these tests watch the scheduler's watchdogs and retries,
    # which the sweep would pre-empt (it has tests of its own).
    return a2trio.Server(
        shop, store=store, handlers=handlers or {}, scheduler=scheduler, sweep=False
    )


async def notes(server: a2trio.Server) -> list[a2trio.Event[Any]]:
    return [e for e in await server.session(SID).history() if e.type == "note"]


async def next_event(server: a2trio.Server, after: int = 0) -> a2trio.Event[Any]:
    """The first event after index ``after``, waiting for it to land."""
    async with server.session(SID).stream(start_after=after) as feed:
        event: a2trio.Event[Any] = await feed.receive()
        return event


class Recording:
    """A scheduler that records every task and forwards to a LocalScheduler."""

    def __init__(self) -> None:
        self.inner = LocalScheduler()
        self.tasks: list[SchedulerTask] = []

    async def schedule(self, task: SchedulerTask) -> None:
        self.tasks.append(task)
        await self.inner.schedule(task)

    def bind(self, server: a2trio.SchedulerTarget) -> Any:
        return self.inner.bind(server)

    def drains_due_s(self) -> list[float]:
        return [(t.due_at_ms - EPOCH_MS) / 1000 for t in self.tasks if isinstance(t, DrainTask)]


class Broken:
    """A scheduler whose ``schedule`` fails (``hang=False``) or never returns."""

    def __init__(self, *, hang: bool) -> None:
        self.hang = hang
        self.calls = 0

    async def schedule(self, task: SchedulerTask) -> None:
        self.calls += 1
        if self.hang:
            await trio.sleep_forever()
        raise RuntimeError("scheduler down")

    @asynccontextmanager
    async def bind(self, server: a2trio.SchedulerTarget) -> AsyncIterator[None]:
        yield


# -- session.schedule ---------------------------------------------------------


async def test_delay_fires_at_its_due_time_and_not_before(autojump_clock: trio.abc.Clock) -> None:
    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler) as server:
        await server.session(SID).schedule("remind", "30s", shop.event("note", Note("hi")))
        await trio.sleep(29.999)
        assert await notes(server) == []
        event = await next_event(server)
        assert trio.current_time() == 30.0
        assert event.created_at == ms_to_datetime(at(30))
        assert event.payload == Note("hi")
        assert await scheduler.queued() == 0


@pytest.mark.parametrize(
    ("timing", "due_s"),
    [("250ms", 0.25), ("1.5m", 90.0), ("2h", 7200.0), ("1d", 86400.0)],
)
async def test_delay_units(autojump_clock: trio.abc.Clock, timing: str, due_s: float) -> None:
    async with make_server(fresh_store(), LocalScheduler()) as server:
        await server.session(SID).schedule("remind", timing, shop.event("note", Note("x")))
        await next_event(server)
        assert trio.current_time() == due_s


async def test_at_in_the_past_fires_at_once(autojump_clock: trio.abc.Clock) -> None:
    async with make_server(fresh_store(), LocalScheduler()) as server:
        await trio.sleep(10)
        past = ms_to_datetime(at(-60))
        await server.session(SID).schedule("late", past, shop.event("note", Note("late")))
        event = await next_event(server)
        assert trio.current_time() == 10.0
        assert event.payload == Note("late")


async def test_at_in_the_future_fires_then(autojump_clock: trio.abc.Clock) -> None:
    async with make_server(fresh_store(), LocalScheduler()) as server:
        when = ms_to_datetime(at(0)) + timedelta(minutes=5)
        await server.session(SID).schedule("later", when, shop.event("note", Note("x")))
        await next_event(server)
        assert trio.current_time() == 300.0


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ("30", "schedule delay must be positive and use ms, s, m, h or d"),
        ("0s", "schedule delay must be positive"),
        ("-1s", "schedule delay must be positive"),
        ("01s", "schedule delay must be positive"),
        ("1.s", "schedule delay must be positive"),
        ("1w", "schedule delay must be positive"),
        ("", "schedule delay must be positive"),
        (30, "schedule timing must be a delay like '30s' or an aware datetime"),
        (datetime(2030, 1, 1), "schedule at must be an aware datetime"),
    ],
)
async def test_bad_timing_schedules_nothing(timing: Any, message: str) -> None:
    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler) as server:
        with pytest.raises(TypeError, match=f"^{message}"):
            await server.session(SID).schedule("x", timing, shop.event("note", Note("x")))
        assert await scheduler.queued() == 0


async def test_bad_schedule_arguments_schedule_nothing() -> None:
    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler) as server:
        s = server.session(SID)
        note = shop.event("note", Note("x"))
        with pytest.raises(TypeError, match=r"^schedule name must be a non-empty string, got ''$"):
            await s.schedule("", "1s", note)
        with pytest.raises(TypeError, match=r"^schedule requires at least one event$"):
            await s.schedule("x", "1s")
        with pytest.raises(a2trio.A2Error) as duplicate:
            await s.schedule(
                "x",
                "1s",
                shop.event("note", Note("a"), id="n1"),
                shop.event("note", Note("b"), id="n1"),
            )
        assert duplicate.value.code == a2trio.ErrorCode.PARTIAL_DUPLICATE_BATCH
        assert (
            duplicate.value.message == "scheduled batch contains the same event id more than once"
        )
        with pytest.raises(a2trio.A2Error) as invalid:
            await s.schedule("x", "1s", shop.event("note", {"text": 3}))
        assert invalid.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
        with pytest.raises(a2trio.A2Error) as unknown:
            await s.schedule("x", "1s", shop.event("shipped", {}))
        assert unknown.value.code == a2trio.ErrorCode.UNKNOWN_EVENT_TYPE
        assert await scheduler.queued() == 0


async def test_schedule_without_a_scheduler_is_a_type_error() -> None:
    async with make_server(fresh_store(), None) as server:
        with pytest.raises(
            TypeError, match=r"^schedule requires a scheduler: pass Server\(scheduler=\.\.\.\)$"
        ):
            await server.session(SID).schedule("x", "1s", shop.event("note", Note("x")))


async def test_the_same_name_schedules_once(autojump_clock: trio.abc.Clock) -> None:
    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler) as server:
        s = server.session(SID)
        await s.schedule("remind", "30s", shop.event("note", Note("first")))
        await trio.sleep(5)
        await s.schedule("remind", "30s", shop.event("note", Note("second")))
        assert await scheduler.queued() == 1
        await trio.sleep(60)
        assert [e.payload for e in await notes(server)] == [Note("first")]


async def test_handler_schedule_counts_from_the_triggers_created_at(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        await trio.sleep(5)
        await ctx.session.schedule("remind", "30s", shop.event("note", Note("due")))

    async with make_server(fresh_store(), LocalScheduler(), {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        event = await next_event(server, after=1)
        assert trio.current_time() == 30.0
        assert event.payload == Note("due")


async def test_a_failed_handler_retried_schedules_once(autojump_clock: trio.abc.Clock) -> None:
    attempts: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        attempts.append((ctx.attempt, trio.current_time()))
        await ctx.session.schedule("remind", "30s", shop.event("note", Note("due")))
        if ctx.attempt == 1:
            raise RuntimeError("crash after scheduling")

    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        await trio.sleep(100)
        # The scheduled append at 30 s wakes the session's drain, which retries.
        assert attempts == [(1, 0.0), (2, 30.0)]
        [note] = await notes(server)
        assert note.created_at == ms_to_datetime(at(30))
        assert await scheduler.queued() == 0


async def test_a_handler_lost_with_its_server_schedules_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    attempts: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        attempts.append((ctx.attempt, trio.current_time()))
        await ctx.session.schedule("remind", "30s", shop.event("note", Note("due")))
        if ctx.attempt == 1:
            await trio.sleep_forever()

    store = fresh_store()
    scheduler = LocalScheduler()
    async with make_server(store, scheduler, {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        await trio.sleep(1)
    async with make_server(store, scheduler, {"ordered": ship}) as server:
        await trio.sleep(99)
        # The scheduled append at 30 s (the lost claim's expiry) drains the session.
        assert attempts == [(1, 0.0), (2, 30.0)]
        [note] = await notes(server)
        assert note.created_at == ms_to_datetime(at(30))


# -- watchdogs -----------------------------------------------------------------


async def test_watchdog_rescues_a_drain_lost_with_its_server(
    autojump_clock: trio.abc.Clock,
) -> None:
    started: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        started.append((ctx.attempt, trio.current_time()))
        if ctx.attempt == 1:
            await trio.sleep_forever()

    store = fresh_store()
    scheduler = LocalScheduler()
    async with make_server(store, scheduler, {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        await trio.sleep(1)
    assert await scheduler.queued() == 1
    async with make_server(store, scheduler, {"ordered": ship}) as server:
        await trio.sleep(60)
        assert started == [(1, 0.0), (2, 35.0)]
        result = await server.drain(SID)
        assert result.settled
        assert result.processed == 0
        # Left: the watchdog the rescuing drain armed for its own claim (35 s + 35 s).
        assert await scheduler.queued() == 1


async def test_an_api_tier_hands_a_delivered_watchdog_on_to_a_worker(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Issue 29: a server with run_handlers=False ran the handlers of every
    # watchdog drain its scheduler delivered to it.
    started: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append((ctx.event.payload.item, trio.current_time()))

    store = fresh_store()
    scheduler = LocalScheduler()
    api = a2trio.Server(
        shop,
        store=store,
        handlers={"ordered": ship},
        scheduler=scheduler,
        run_handlers=False,
        sweep=False,
    )
    async with api:
        await api.session(SID).append(shop.event("ordered", Ordered("book")))
        assert await scheduler.queued() == 1  # the append's watchdog
        await trio.sleep(60)
        assert started == []  # the watchdog was delivered at 35 s
        assert await scheduler.queued() == 0
        await api.deliver(DrainTask("shop", SID, at(60)))
        assert started == []
        # Handed on: nothing claimed, the event waits for a worker's claim.
        assert await store.sweep.claimable_sessions("shop", limit=10) == [api.key(SID)]
    async with a2trio.Server(shop, store=store, handlers={"ordered": ship}) as worker:
        await worker.settle()
        await trio.sleep(1)
    assert started == [("book", 60.0)]


async def test_inline_append_arms_the_slotted_watchdog(autojump_clock: trio.abc.Clock) -> None:
    release = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        await release.wait()

    scheduler = Recording()
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await trio.sleep(0.3)
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        # now + ttl 30 s + grace 5 s = 35.3 s, rounded up to the second.
        assert scheduler.drains_due_s() == [36.0]
        assert scheduler.tasks[0] == DrainTask("shop", SID, at(36))
        release.set()
        await server.settle()
        assert await scheduler.inner.queued() == 1


async def test_appends_in_one_slot_arm_once(autojump_clock: trio.abc.Clock) -> None:
    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        await trio.sleep_forever()

    scheduler = Recording()
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await trio.sleep(0.3)
        await server.session(SID).append(shop.event("ordered", Ordered("a")))
        await trio.sleep(0.2)
        await server.session(SID).append(shop.event("ordered", Ordered("b")))
        await trio.sleep(1)
        assert scheduler.drains_due_s() == [36.0]


async def test_heartbeats_move_the_watchdog_with_the_lease(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        await trio.sleep(25)

    scheduler = Recording()
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        await trio.sleep(25)
        await server.settle()
        # Beats at 10 s and 20 s renew to +30 s and re-arm on the 10 s grid.
        assert sorted(set(scheduler.drains_due_s())) == [35.0, 45.0, 55.0]


async def test_a_busy_drain_arms_at_the_busy_retry_time(autojump_clock: trio.abc.Clock) -> None:
    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        await trio.sleep(5)

    store = fresh_store()
    lane = a2trio.handler(ship, lane="fulfilment")
    scheduler = Recording()
    async with (
        make_server(store, None, {"ordered": lane}) as holder,
        make_server(store, scheduler, {"ordered": lane}) as other,
    ):
        await holder.session(SID).append(shop.event("ordered", Ordered("a")))
        await trio.sleep(2)
        result = await other.drain(SID)
        assert result.outcome == "busy"
        assert result.retry_at_ms == at(30)
        assert scheduler.drains_due_s() == [35.0]


async def test_a_failing_arm_never_fails_the_append_or_stops_the_drain(
    autojump_clock: trio.abc.Clock,
) -> None:
    ran: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        ran.append(trio.current_time())

    scheduler = Broken(hang=False)
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        [event] = await server.session(SID).append(shop.event("ordered", Ordered("book")))
        assert event.index == 1
        await server.settle()
        assert ran == [0.0]
        assert scheduler.calls >= 1


async def test_a_slow_arm_holds_the_append_for_the_arm_timeout_only(
    autojump_clock: trio.abc.Clock,
) -> None:
    ran: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        ran.append(trio.current_time())

    scheduler = Broken(hang=True)
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await server.session(SID).append(shop.event("ordered", Ordered("book")))
        assert trio.current_time() == 5.0
        assert ran == [0.0]


@pytest.mark.parametrize("hang", [False, True])
async def test_a_scheduler_delivered_append_requires_its_arm(
    autojump_clock: trio.abc.Clock, hang: bool
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        pass

    scheduler = Broken(hang=hang)
    task = AppendTask("t1", "shop", SID, at(0), [ScheduledEvent("e1", "ordered", {"item": "x"})])
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        with pytest.raises(trio.TooSlowError if hang else RuntimeError):
            await server.deliver(task)
        assert trio.current_time() == (5.0 if hang else 0.0)
        # Committed before the arm: the scheduler's retry replays it.
        [event] = await server.session(SID).history()
        assert event.id == "e1"


# -- dispatch ------------------------------------------------------------------


async def test_dispatch_commits_and_the_scheduler_drains(autojump_clock: trio.abc.Clock) -> None:
    ran: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        ran.append(trio.current_time())

    scheduler = Recording()
    async with make_server(fresh_store(), scheduler, {"ordered": ship}) as server:
        await trio.sleep(0.7)
        [event] = await server.session(SID).dispatch(shop.event("ordered", Ordered("book")))
        assert event.index == 1
        # No inline drain: the drain task (due at the current slot, 0 s) runs it.
        assert server.statistics().drains == 0
        assert scheduler.tasks == [DrainTask("shop", SID, at(0))]
        assert ran == []
        await trio.sleep(1)
        assert ran == [0.7]
        assert (await server.drain(SID)).settled


async def test_dispatch_without_a_scheduler_is_a_type_error_and_writes_nothing() -> None:
    async with make_server(fresh_store(), None) as server:
        with pytest.raises(
            TypeError, match=r"^dispatch requires a scheduler: pass Server\(scheduler=\.\.\.\)$"
        ):
            await server.session(SID).dispatch(shop.event("ordered", Ordered("book")))
        assert await server.session(SID).history() == []


# -- the LocalScheduler itself ------------------------------------------------------


def test_tasks_encode_as_the_seeds_scheduler_tasks() -> None:
    # scheduler-task.ts: {version, kind, contract, sessionId, dueAt[, id, events]}.
    drain = DrainTask("shop", SID, 1000)
    append = AppendTask("a", "shop", SID, 2000, [ScheduledEvent("e", "note", {"text": "x"})])
    assert msgspec.json.decode(msgspec.json.encode(drain)) == {
        "kind": "drain",
        "contract": "shop",
        "sessionId": SID,
        "dueAt": 1000,
        "version": 1,
    }
    assert msgspec.json.decode(msgspec.json.encode(append)) == {
        "kind": "append",
        "id": "a",
        "contract": "shop",
        "sessionId": SID,
        "dueAt": 2000,
        "events": [{"id": "e", "type": "note", "payload": {"text": "x"}}],
        "version": 1,
    }
    decoder = a2trio.scheduler.task_decoder()
    assert [decoder.decode(msgspec.json.encode(t)) for t in (drain, append)] == [drain, append]


async def test_tasks_are_idempotent_by_task_id() -> None:
    scheduler = LocalScheduler()
    drain = DrainTask("shop", SID, at(40))
    append = AppendTask(
        "sched-1", "shop", SID, at(10), [ScheduledEvent("e", "note", {"text": "a"})]
    )
    for task in (drain, drain, append, msgspec.structs.replace(append, due_at_ms=at(20))):
        await scheduler.schedule(task)
    assert await scheduler.queued() == 2
    assert await scheduler.queued("shop") == 2
    assert await scheduler.queued("other") == 0
    assert task_id(drain) == f"drain:shop\x1f{SID}\x1f{at(40)}"


async def test_tasks_wait_for_a_server_of_their_contract(autojump_clock: trio.abc.Clock) -> None:
    scheduler = LocalScheduler()
    store = fresh_store()
    await scheduler.schedule(
        AppendTask("early", "shop", SID, at(5), [ScheduledEvent("e1", "note", {"text": "x"})])
    )
    await trio.sleep(20)
    async with make_server(store, scheduler) as server:
        event = await next_event(server)
        assert trio.current_time() == 20.0
        assert event.id == "e1"


async def test_a_nearer_task_wakes_the_worker_early(autojump_clock: trio.abc.Clock) -> None:
    async with make_server(fresh_store(), LocalScheduler()) as server:
        s = server.session(SID)
        await s.schedule("far", "60s", shop.event("note", Note("far")))
        await trio.sleep(1)
        await s.schedule("near", "10s", shop.event("note", Note("near")))
        event = await next_event(server)
        assert (trio.current_time(), event.payload) == (11.0, Note("near"))
        event = await next_event(server, after=1)
        assert (trio.current_time(), event.payload) == (60.0, Note("far"))


@pytest.mark.parametrize("max_in_flight", [1, 2, 3])
async def test_more_due_tasks_than_slots_are_all_delivered(
    autojump_clock: trio.abc.Clock, max_in_flight: int
) -> None:
    scheduler = LocalScheduler(max_in_flight=max_in_flight)
    async with make_server(fresh_store(), scheduler) as server:
        for n in range(7):
            event = ScheduledEvent(f"e{n}", "note", {"text": str(n)})
            await scheduler.schedule(AppendTask(f"t{n}", "shop", SID, at(0), [event]))
        await trio.sleep(1)
        assert scheduler.statistics().delivered == 7
        # Deliveries run concurrently, so they land in any order.
        ids = sorted(e.id for e in await server.session(SID).history())
        assert ids == [f"e{n}" for n in range(7)]


async def test_a_failing_delivery_is_retried_with_backoff(autojump_clock: trio.abc.Clock) -> None:
    scheduler = LocalScheduler()
    bad = AppendTask("bad", "shop", SID, at(0), [ScheduledEvent("e1", "note", {"text": 1})])
    failures: list[tuple[float, int]] = []
    async with make_server(fresh_store(), scheduler) as server:
        await scheduler.schedule(bad)
        for instant in (0.5, 1.5, 3.5, 7.5, 15.5):
            await trio.sleep_until(instant)
            failures.append((instant, scheduler.statistics().failed))
        assert failures == [(0.5, 1), (1.5, 2), (3.5, 3), (7.5, 4), (15.5, 5)]
        assert await scheduler.queued() == 1
        assert await server.session(SID).history() == []


async def test_one_server_per_contract_per_scheduler() -> None:
    scheduler = LocalScheduler()
    async with make_server(fresh_store(), scheduler):
        assert scheduler.statistics().bound == ("shop",)
        with pytest.raises(RuntimeError, match="already bound"):
            async with make_server(fresh_store(), scheduler):
                pass  # pragma: no cover
    assert scheduler.statistics().bound == ()


async def test_closing_the_server_releases_an_in_flight_delivery(
    autojump_clock: trio.abc.Clock,
) -> None:
    started: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        started.append((ctx.attempt, trio.current_time()))
        await trio.sleep_forever()

    store = fresh_store()
    scheduler = LocalScheduler()
    async with make_server(store, scheduler, {"ordered": ship}) as server:
        await server.session(SID).dispatch(shop.event("ordered", Ordered("book")))
        await trio.sleep(1)
        assert scheduler.statistics().in_flight == 1
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.delivered, stats.failed) == (0, 0, 0)
    # Released, not lost: the next server's worker delivers it at once.
    async with make_server(store, scheduler, {"ordered": ship}):
        await trio.sleep(0.5)
        assert scheduler.statistics().delivered == 1
        # That drain found attempt 1's claim still live (busy until 30 s).
        assert started == [(1, 0.0)]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lease_s": 0}, ValueError, "^lease_s must be positive, got 0$"),
        ({"max_in_flight": 0}, ValueError, "^max_in_flight must be at least 1, got 0$"),
        ({"max_in_flight": 1.5}, TypeError, r"^max_in_flight must be an int, got 1\.5$"),
    ],
)
def test_bad_options_are_refused(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        LocalScheduler(**kwargs)


def test_retry_delays_double_to_a_ceiling() -> None:
    from a2trio.schedulers._engine import retry_delay_s

    assert [retry_delay_s(n) for n in (1, 2, 3, 7, 8, 50)] == [1, 2, 4, 60, 60, 60]
    assert math.isclose(retry_delay_s(6), 32)
