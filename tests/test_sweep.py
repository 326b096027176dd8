"""Nothing stays stranded (issue 16): with no scheduler and no further append,
a server that runs handlers finds work a crashed process left (expired
claims), work appended while no worker ran, and failures due for a retry,
within ``claim_ttl_s + sweep_s`` (plus the failure's backoff).

On memory under the mock clock, the exact instants; on SQLite and Postgres,
real worker processes, one SIGKILLed mid-handler.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores import memory
from tests.backends.postgres import database_dsn, run_sql
from tests.sweep_workers.worker import TIMINGS, Tick, open_store, ticks

from .apps import Ordered, orders

ROOT = Path(__file__).resolve().parent.parent
TTL = a2trio.DEFAULT_TIMINGS.claim_ttl_s
SWEEP = a2trio.DEFAULT_TIMINGS.sweep_s


async def test_a_worker_that_opens_takes_up_work_appended_while_none_ran(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    started: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append((ctx.event.payload.item, trio.current_time()))

    api = a2trio.Server(orders, store=store, handlers={"ordered": ship}, run_handlers=False)
    async with api:
        await api.session("s1").append(orders.event("ordered", Ordered("a")))
        await api.session("s2").append(orders.event("ordered", Ordered("b")))
        await trio.sleep(100)
        assert started == []  # an API tier runs nothing
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}):
        await trio.sleep(1)
    assert sorted(started) == [("a", 100.0), ("b", 100.0)]


async def test_a_crashed_servers_claims_are_taken_up_within_the_lease_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    attempts: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.attempt, trio.current_time()))
        if ctx.attempt == 1:
            await trio.sleep_forever()

    handlers = {"ordered": ship}
    async with a2trio.Server(orders, store=store, handlers=handlers) as survivor:
        async with a2trio.Server(orders, store=store, handlers=handlers) as doomed:
            await doomed.session("s1").append(orders.event("ordered", Ordered("a")))
            await trio.sleep(1)
        # Leaving `doomed`'s block is its crash: the claim stays until the ttl.
        await trio.sleep(TTL + SWEEP)
        await survivor.settle()
    [(first, t1), (second, t2)] = attempts
    assert (first, t1) == (1, 0.0)
    assert second == 2
    assert TTL <= t2 <= TTL + SWEEP


async def test_a_failure_is_retried_after_its_backoff_until_it_dead_letters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failed_at: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        failed_at.append(trio.current_time())
        raise RuntimeError("the courier is down")

    timings = a2trio.Timings(max_failures=4)
    async with a2trio.Server(
        orders, store=memory(clock=a2trio.TrioClock()), handlers={"ordered": ship}, timings=timings
    ) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("a")))
        await trio.sleep(600)
    # Sweeps every 5 s; waits of 1, 2, 4 s after the failures: the sweep after each.
    assert failed_at == [0.0, 5.0, 10.0, 15.0]


async def test_sweep_false_leaves_stranded_work_to_appends_and_watchdogs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    started: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append(trio.current_time())

    api = a2trio.Server(orders, store=store, handlers={"ordered": ship}, run_handlers=False)
    async with api:
        await api.session("s1").append(orders.event("ordered", Ordered("a")))
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}, sweep=False):
        await trio.sleep(100)
    assert started == []


# -- across processes -----------------------------------------------------------------


def _attempts(folder: Path, name: str) -> list[tuple[str, int]]:
    path = folder / f"{name}.attempts"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [(line.split()[0], int(line.split()[1])) for line in lines if line]


def _wait(what: str, ready: Callable[[], bool], deadline_s: float = 120.0) -> None:
    """Wait for another process (real time: no trio.Event crosses processes).
    The deadline is a hang guard: a worker starting under coverage on a
    loaded machine can take tens of seconds."""
    deadline = time.monotonic() + deadline_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_sigkilled_workers_event_is_taken_up_without_a_scheduler(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"sw_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "ticks.db")
    store = open_store(backend, url, schema)

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.sweep_workers.worker", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists())

    api = a2trio.Server(ticks, store=store, handlers={"tick": _never}, run_handlers=False)
    try:
        async with api:
            # Appended while no worker runs: the first worker finds it at start.
            early = [
                (await api.session(f"s{n}").append(ticks.event("tick", Tick())))[0].id
                for n in range(5)
            ]
            await trio.to_thread.run_sync(start, "first")
            await trio.to_thread.run_sync(
                _wait, "the early work", lambda: len(_attempts(tmp_path, "first")) == 5
            )
            [stuck] = await api.session("s9").append(ticks.event("tick", Tick(hang=True)))
            await trio.to_thread.run_sync(
                _wait, "the hang", lambda: (tmp_path / "hanging").exists()
            )
            os.kill(workers[0].pid, signal.SIGKILL)
            workers[0].wait()
            # A restarted worker; no scheduler, no further append.
            await trio.to_thread.run_sync(start, "second")
            await trio.to_thread.run_sync(
                _wait,
                "the stranded event's retry",
                lambda: (stuck.id, 2) in _attempts(tmp_path, "second"),
            )
            assert sorted(id for id, _ in _attempts(tmp_path, "first")) == sorted(
                [*early, stuck.id]
            )
            # The files mark the attempts' starts: their completions commit
            # after, in another process (no trio.Event crosses it).
            sessions = [api.key(f"s{n}") for n in [*range(5), 9]]

            async def all_processed() -> bool:
                rows = [(await store.read(s))[0] for s in sessions]
                return all(row.processed_at_ms is not None for row in rows)

            with trio.fail_after(60):
                while not await all_processed():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            for n in [*range(5), 9]:
                [row] = await store.read(api.key(f"s{n}"))
                expected = 2 if n == 9 else 1
                assert (row.processed_by_attempt, row.attempt_count) == (expected, expected)
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


async def _never(ctx: a2trio.HandlerContext[Tick]) -> None:
    raise AssertionError("the API tier runs no handler")


def test_the_workers_lease_is_short() -> None:
    assert TIMINGS.claim_ttl_s + TIMINGS.sweep_s < 5
