"""The durable scheduler on real sqlite files and a real Postgres server.

The scheduler's queries run in worker threads (sqlite) or wait on sockets
(Postgres), which autojump would count as idle, so these tests take
pytest-trio's ``mock_clock`` (no autojump) and move time with
``MockClock.jump``. With time frozen between jumps, an event's
``created_at`` says exactly at which jump it was delivered. A real-time
limit guards every test against hangs (the Trio clock does not move by
itself). The event store is the memory store: the scheduler keeps its own
connection and does not care which store the server uses.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio
import trio.testing

import a2trio
from a2trio.clock import ms_to_datetime
from a2trio.scheduler import AppendTask, ScheduledEvent
from a2trio.schedulers import DurableScheduler
from a2trio.stores import MemoryStore, memory

PG_HOST = "postgresql://postgres@127.0.0.1:5432"
WORKER = Path(__file__).parent / "sched_workers" / "worker.py"


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Note(msgspec.Struct, frozen=True):
    text: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "note": Note})
EPOCH_MS = a2trio.TrioClock().epoch_ms
SID = "s1"

MakeScheduler = Callable[[], DurableScheduler]


def at(seconds: float) -> int:
    return EPOCH_MS + round(seconds * 1000)


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A fresh database, dropped after the test."""
    name = f"a2trio_sched_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(f"{PG_HOST}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        if os.environ.get("A2_TEST_POSTGRES_REQUIRED"):
            raise
        pytest.skip(f"Postgres at {PG_HOST} is unreachable: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_HOST}/{name}"
    finally:
        with psycopg.connect(f"{PG_HOST}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def make_scheduler(request: pytest.FixtureRequest, tmp_path: Path) -> MakeScheduler:
    """Builds schedulers on one sqlite file or one Postgres database."""
    if request.param == "sqlite":
        path = tmp_path / "scheduler.db"
        return lambda: DurableScheduler.sqlite(path)
    dsn: str = request.getfixturevalue("pg_dsn")
    return lambda: DurableScheduler.postgres(dsn)


@asynccontextmanager
async def real_time_limit(seconds: float) -> AsyncIterator[None]:
    """Fail if the block takes longer than ``seconds`` of wall-clock time."""
    done = threading.Event()

    async def guard() -> None:
        if not await trio.to_thread.run_sync(done.wait, seconds):
            raise TimeoutError(f"test still running after {seconds} s of real time")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(guard)
        try:
            yield
        finally:
            done.set()


async def until(predicate: Callable[[], Awaitable[bool] | bool]) -> None:
    """Wait, in real time, for worker threads to make ``predicate`` true."""
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await trio.to_thread.run_sync(threading.Event().wait, 0.002)


async def jump_and_look(
    clock: trio.testing.MockClock, scheduler: DurableScheduler, s: float
) -> None:
    """Jump ``s`` seconds once the worker is waiting, then wait for its next pass."""
    await until(lambda: scheduler.statistics().waiting == 1)
    passes = scheduler.statistics().passes
    clock.jump(s)
    await until(lambda: scheduler.statistics().passes > passes)


def fresh_store() -> MemoryStore:
    return memory(clock=a2trio.TrioClock())


def make_server(
    store: MemoryStore,
    scheduler: DurableScheduler,
    handlers: dict[str, Callable[..., Awaitable[Any]]] | None = None,
) -> a2trio.Server:
    # sweep=False: these tests watch the scheduler's watchdogs and retries,
    # which the sweep would pre-empt (it has tests of its own).
    return a2trio.Server(
        shop, store=store, handlers=handlers or {}, scheduler=scheduler, sweep=False
    )


async def next_event(server: a2trio.Server, after: int = 0) -> a2trio.Event[Any]:
    async with server.session(SID).stream(start_after=after) as feed:
        event: a2trio.Event[Any] = await feed.receive()
        return event


async def test_a_delayed_append_fires_at_its_due_time_and_not_before(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    scheduler = make_scheduler()
    async with real_time_limit(30), make_server(fresh_store(), scheduler) as server:
        await server.session(SID).schedule("remind", "30s", shop.event("note", Note("hi")))
        assert await scheduler.queued() == 1
        # Past the poll deadline (2 s sqlite, 10 s Postgres): the worker looks.
        await jump_and_look(mock_clock, scheduler, 29.999)
        assert await server.session(SID).history() == []
        mock_clock.jump(0.001)
        event = await next_event(server)
        assert event.created_at == ms_to_datetime(at(30))
        assert event.payload == Note("hi")
        await until(lambda: scheduler.statistics().delivered == 1)
        assert await scheduler.queued() == 0


async def test_an_at_in_the_past_fires_at_once(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    scheduler = make_scheduler()
    async with real_time_limit(30), make_server(fresh_store(), scheduler) as server:
        mock_clock.jump(10)
        past = ms_to_datetime(at(-60))
        await server.session(SID).schedule("late", past, shop.event("note", Note("late")))
        event = await next_event(server)
        assert event.created_at == ms_to_datetime(at(10))


async def test_a_task_scheduled_before_a_restart_fires_after_it(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    store = fresh_store()
    async with real_time_limit(30):
        async with make_server(store, make_scheduler()) as server:
            await server.session(SID).schedule("remind", "30s", shop.event("note", Note("x")))
        async with make_scheduler() as standalone:
            assert await standalone.queued("shop") == 1
        mock_clock.jump(30)
        async with make_server(store, make_scheduler()) as server:
            event = await next_event(server)
            assert event.created_at == ms_to_datetime(at(30))


async def test_another_processs_task_wakes_the_worker(
    mock_clock: trio.testing.MockClock,
    make_scheduler: MakeScheduler,
    request: pytest.FixtureRequest,
) -> None:
    scheduler = make_scheduler()
    task = AppendTask("t", "shop", SID, at(0), [ScheduledEvent("e", "note", {"text": "x"})])
    async with real_time_limit(30), make_server(fresh_store(), scheduler) as server:
        await until(lambda: scheduler.statistics().waiting == 1)
        # Another scheduler on the same table stands in for another process.
        async with make_scheduler() as other:
            await other.schedule(task)
        if request.node.callspec.params["make_scheduler"] == "postgres":
            # NOTIFY wakes the worker with no time passing.
            wake_s = 0.0
        else:
            # sqlite has no notifications: the next poll (Timings.poll_idle_s) finds it.
            mock_clock.jump(2)
            wake_s = 2.0
        event = await next_event(server)
        assert event.created_at == ms_to_datetime(at(wake_s))


async def test_more_due_tasks_than_slots_are_all_delivered(
    mock_clock: trio.testing.MockClock, shared_target: str
) -> None:
    total = 40
    scheduler = open_shared(shared_target, max_in_flight=4)
    async with real_time_limit(30), scheduler:
        for n in range(total):
            event = ScheduledEvent(f"e{n}", "note", {"text": str(n)})
            await scheduler.schedule(AppendTask(f"t{n}", "shop", SID, at(0), [event]))
        async with make_server(fresh_store(), scheduler):
            # Deliveries that finish while a claim is in its thread must not
            # strand the worker: every task is delivered with no time passing.
            await until(lambda: scheduler.statistics().delivered == total)
            assert await scheduler.queued() == 0


async def test_a_watchdog_rescues_a_drain_lost_with_its_process(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    started: list[tuple[int, float]] = []
    rescued = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        started.append((ctx.attempt, trio.current_time()))
        if ctx.attempt == 1:
            await trio.sleep_forever()
        rescued.set()

    store = fresh_store()
    async with real_time_limit(30):
        async with make_server(store, make_scheduler(), {"ordered": ship}) as server:
            await server.session(SID).append(shop.event("ordered", Ordered("book")))
            await until(lambda: bool(started))
        scheduler = make_scheduler()
        async with make_server(store, scheduler, {"ordered": ship}):
            await jump_and_look(mock_clock, scheduler, 34.999)
            assert started == [(1, 0.0)]
            mock_clock.jump(0.001)
            await rescued.wait()
            assert started == [(1, 0.0), (2, 35.0)]


async def test_a_handler_that_schedules_fails_and_is_retried_schedules_once(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    attempts: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        attempts.append(ctx.attempt)
        await ctx.session.schedule("remind", "30s", shop.event("note", Note("due")))
        if ctx.attempt == 1:
            raise RuntimeError("crash after scheduling")

    scheduler = make_scheduler()
    async with real_time_limit(30), make_server(fresh_store(), scheduler, {"ordered": ship}) as s:
        await s.session(SID).append(shop.event("ordered", Ordered("book")))
        # Attempt 1 scheduled, failed and its drain ended, all at t=0.
        await s.settle()
        assert attempts == [1]
        mock_clock.jump(30)
        # The scheduled append lands and its drain retries: attempt 2 schedules again.
        await until(lambda: attempts == [1, 2])
        await s.settle()
        await until(lambda: scheduler.statistics().in_flight == 0)
        notes = [e for e in await s.session(SID).history() if e.type == "note"]
        assert [n.created_at for n in notes] == [ms_to_datetime(at(30))]


async def test_dispatch_hands_the_drain_to_the_durable_scheduler(
    mock_clock: trio.testing.MockClock, make_scheduler: MakeScheduler
) -> None:
    done = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Any]) -> None:
        done.set()

    async with (
        real_time_limit(30),
        make_server(fresh_store(), make_scheduler(), {"ordered": ship}) as server,
    ):
        await server.session(SID).dispatch(shop.event("ordered", Ordered("book")))
        assert server.statistics().drains == 0
        await done.wait()


async def test_scheduling_needs_an_open_scheduler(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler()
    task = AppendTask("t", "shop", SID, at(0), [ScheduledEvent("e", "note", {"text": "x"})])
    with pytest.raises(RuntimeError, match=r"is not open: enter `async with scheduler:`"):
        await scheduler.schedule(task)
    async with scheduler:
        await scheduler.schedule(task)
        await scheduler.schedule(task)
        assert await scheduler.queued() == 1
        assert await scheduler.queued("other") == 0


async def test_a_cancelled_schedule_commits_whole_or_writes_nothing(
    make_scheduler: MakeScheduler,
) -> None:
    def task(n: int) -> AppendTask:
        return AppendTask(f"t{n}", "shop", SID, at(0), [ScheduledEvent("e", "note", {"text": ""})])

    async with make_scheduler() as scheduler:
        with trio.CancelScope() as early:
            early.cancel()
            await scheduler.schedule(task(1))
        assert early.cancelled_caught
        assert await scheduler.queued() == 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scheduler.schedule, task(2))
            # Blocked means its insert is in flight (a sqlite thread, a
            # Postgres pipeline): cancelled there, it committed or rolled back.
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert await scheduler.queued() in (0, 1)
        # Retrying is safe either way, and no transaction was left open: the
        # connections keep working.
        await scheduler.schedule(task(2))
        assert await scheduler.queued() == 1
        await scheduler.schedule(task(3))
        assert await scheduler.queued() == 2


async def test_a_backend_failure_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.db"
    task = AppendTask("t", "shop", SID, at(0), [ScheduledEvent("e", "note", {"text": ""})])
    async with DurableScheduler.sqlite(path) as scheduler:
        with closing(sqlite3.connect(path)) as other:
            other.execute("DROP TABLE a2_scheduler_tasks")
        with pytest.raises(a2trio.A2Error) as caught:
            await scheduler.schedule(task)
        assert caught.value.code == a2trio.ErrorCode.STORE_UNAVAILABLE
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


async def test_postgres_reconnects_after_losing_its_connections(pg_dsn: str) -> None:
    def task(n: int) -> AppendTask:
        return AppendTask(f"t{n}", "shop", SID, at(0), [ScheduledEvent("e", "note", {"text": ""})])

    async with DurableScheduler.postgres(pg_dsn) as scheduler:
        await scheduler.schedule(task(1))
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        with pytest.raises(a2trio.A2Error) as caught:
            await scheduler.schedule(task(2))
        assert caught.value.code == a2trio.ErrorCode.STORE_UNAVAILABLE
        await scheduler.schedule(task(2))
        assert await scheduler.queued() == 2


@pytest.fixture(params=["sqlite", "postgres"])
def shared_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What worker processes share: a sqlite file or a Postgres database."""
    if request.param == "sqlite":
        return str(tmp_path / "scheduler.db")
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


def open_shared(target: str, *, max_in_flight: int = 64) -> DurableScheduler:
    if target.startswith("postgresql://"):
        return DurableScheduler.postgres(target, max_in_flight=max_in_flight)
    return DurableScheduler.sqlite(target, max_in_flight=max_in_flight)


async def test_two_processes_deliver_each_task_exactly_once(shared_target: str) -> None:
    total = 500
    workers = [
        await trio.lowlevel.open_process(
            [sys.executable, str(WORKER), shared_target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs: list[bytes] = [b"", b""]

    async def read_until(i: int, marker: bytes) -> None:
        stdout = workers[i].stdout
        assert stdout is not None
        while marker not in outputs[i]:
            chunk = await stdout.receive_some()
            if not chunk:
                return
            outputs[i] += chunk

    try:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(read_until, i, b"ready\n")
            clock = a2trio.SystemClock()
            async with open_shared(shared_target) as scheduler:
                for n in range(total):
                    event = ScheduledEvent(f"tick-{n}", "tick", {"n": n})
                    await scheduler.schedule(
                        AppendTask(f"task-{n}", "fleet", f"s{n % 10}", clock.now_ms(), [event])
                    )
            for worker in workers:
                assert worker.stdin is not None
                await worker.stdin.send_all(b"go\n")
            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(read_until, i, b"]\n")
            for worker in workers:
                assert await worker.wait() == 0
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
    delivered = [msgspec.json.decode(out.split(b"\n")[1], type=list[str]) for out in outputs]
    assert sorted(delivered[0] + delivered[1]) == sorted(f"tick-{n}" for n in range(total))
    # Exactly once between them. How they split the work is up to timing: on
    # sqlite's single write lock one worker can take every task.
    assert not set(delivered[0]) & set(delivered[1])


# -- group commits under cancellation and SIGKILL -----------------------------
#
# Writes that arrive together share one transaction (stores/group.py).
# Whatever interrupts a group (a caller's cancellation, the process's death),
# every schedule() that returned is committed, nothing is half-written, and
# every task is delivered with its events appended exactly once. The killed
# processes are tests/sched_workers/crasher.py.

CRASHER = Path(__file__).parent / "sched_workers" / "crasher.py"


class Tick(msgspec.Struct, frozen=True):
    n: int


fleet = a2trio.contract("fleet", events={"tick": Tick})
SESSIONS = 10


def tick_task(n: int, due_at_ms: int) -> AppendTask:
    event = ScheduledEvent(f"tick-{n}", "tick", {"n": n})
    return AppendTask(f"task-{n}", "fleet", f"s{n % SESSIONS}", due_at_ms, [event])


def stored_ids(target: str) -> set[str]:
    """The task ids in the table, read behind the scheduler's back."""
    if target.startswith("postgresql://"):
        with psycopg.connect(target) as conn:
            rows = conn.execute("SELECT id FROM a2_scheduler_tasks").fetchall()
    else:
        with closing(sqlite3.connect(target)) as conn:
            rows = conn.execute("SELECT id FROM a2_scheduler_tasks").fetchall()
    return {row[0] for row in rows}


class Ahead:
    """Epoch ms past every lease a killed process held (30 s)."""

    def now_ms(self) -> int:
        return a2trio.SystemClock().now_ms() + 31_000


async def deliver_all(scheduler: DurableScheduler, store: a2trio.stores.Store) -> Counter[str]:
    """Bind a server until the queue is empty; count each appended event id."""
    async with a2trio.Server(fleet, store=store, scheduler=scheduler) as server:
        with trio.fail_after(60):
            while await scheduler.queued("fleet"):  # noqa: ASYNC110 - polls the table
                await trio.sleep(0.02)
        events = [
            event.id for n in range(SESSIONS) for event in await server.session(f"s{n}").history()
        ]
    return Counter(events)


async def test_schedules_cancelled_mid_group_commit_whole_or_not_at_all(
    make_scheduler: MakeScheduler,
) -> None:
    total = 300
    clock = a2trio.SystemClock()
    scheduler = make_scheduler()
    acknowledged: set[str] = set()
    scopes: dict[int, trio.CancelScope] = {}

    async def schedule(n: int) -> None:
        with scopes[n]:
            await scheduler.schedule(tick_task(n, clock.now_ms()))
            acknowledged.add(f"task-{n}")

    async with scheduler:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for n in range(total):
                    scopes[n] = trio.CancelScope()
                    nursery.start_soon(schedule, n)
                # Once every caller waits, the first write and a gathered
                # group are in flight and the rest queued (polling a write
                # counter instead raced a fast server, which committed all
                # before the poll woke): cancel every third caller.
                await trio.testing.wait_all_tasks_blocked()
                for n in range(0, total, 3):
                    scopes[n].cancel()
        assert scheduler.statistics().largest_group > 1
        cancelled = sum(1 for n in range(0, total, 3) if f"task-{n}" not in acknowledged)
        assert cancelled > 0
        # Every caller that was not cancelled returned.
        assert {f"task-{n}" for n in range(total) if n % 3} <= acknowledged
        queued = await scheduler.queued()
        assert len(acknowledged) <= queued <= total
        delivered = await deliver_all(scheduler, a2trio.stores.memory())
    # Each stored task, acknowledged or not, was delivered once, whole.
    assert set(delivered.values()) == {1}
    assert len(delivered) == queued
    assert {f"task-{e.removeprefix('tick-')}" for e in delivered} >= acknowledged


async def read_lines(process: trio.Process, until_count: int, prefix: str) -> list[str]:
    stdout = process.stdout
    assert stdout is not None
    buffer = b""
    lines: list[str] = []
    while len(lines) < until_count:
        chunk = await stdout.receive_some()
        assert chunk, "the process ended early"
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in complete if line.startswith(prefix.encode())]
    return lines


async def kill(process: trio.Process) -> bytes:
    """SIGKILL the process; return what it printed that was not read yet."""
    process.send_signal(signal.SIGKILL)
    await process.wait()
    assert process.returncode == -signal.SIGKILL
    stdout = process.stdout
    assert stdout is not None
    rest = b""
    while chunk := await stdout.receive_some():
        rest += chunk
    return rest


def _other_backends(target: str) -> int:
    with psycopg.connect(target) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity"
            " where datname = current_database() and pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def until_its_backends_are_gone(target: str) -> None:
    """On Postgres, until the killed process's sessions have ended: a group's
    COMMIT the client sent just before it died still commits on the server,
    after the kill (the test's own database: every other backend is its)."""
    if not target.startswith("postgresql://"):
        return
    with trio.fail_after(60):
        while await trio.to_thread.run_sync(_other_backends, target):  # noqa: ASYNC110 - polls the server
            await trio.sleep(0.05)


async def test_a_process_killed_mid_group_loses_no_acknowledged_schedule(
    shared_target: str,
) -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CRASHER), "schedule", shared_target], stdout=subprocess.PIPE
    )
    try:
        with trio.fail_after(60):
            acknowledged = await read_lines(process, 400, "task-")
    finally:
        rest = await kill(process)
    # Printed before the kill: every one of them returned from schedule().
    acknowledged += [line for line in rest.decode().splitlines() if line.startswith("task-")]
    await until_its_backends_are_gone(shared_target)
    stored = stored_ids(shared_target)
    assert set(acknowledged) <= stored
    async with open_shared(shared_target) as scheduler:
        delivered = await deliver_all(scheduler, a2trio.stores.memory())
    assert set(delivered.values()) == {1}
    assert {f"task-{e.removeprefix('tick-')}" for e in delivered} == stored


async def test_a_process_killed_mid_delivery_leaves_each_event_appended_once(
    shared_target: str, tmp_path: Path
) -> None:
    total = 300
    clock = a2trio.SystemClock()
    store_path = tmp_path / "events.db"
    async with open_shared(shared_target) as scheduler:
        for n in range(total):
            await scheduler.schedule(tick_task(n, clock.now_ms()))
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CRASHER), "deliver", shared_target, str(store_path)],
        stdout=subprocess.PIPE,
    )
    try:
        with trio.fail_after(60):
            await read_lines(process, 50, "delivered ")
    finally:
        await kill(process)
    await until_its_backends_are_gone(shared_target)
    left = stored_ids(shared_target)
    assert 0 < len(left) < total
    # The killed process's leases look lapsed to this clock: its claimed
    # tasks (delivered or not, deleted or not) are delivered again.
    scheduler = (
        DurableScheduler.postgres(shared_target, clock=Ahead())
        if shared_target.startswith("postgresql://")
        else DurableScheduler.sqlite(shared_target, clock=Ahead())
    )
    delivered = await deliver_all(scheduler, a2trio.stores.sqlite(str(store_path)))
    assert delivered == Counter({f"tick-{n}": 1 for n in range(total)})
    assert stored_ids(shared_target) == set()
