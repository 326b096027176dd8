"""Flow control across processes (issue 33): three worker processes on
one SQLite file or Postgres schema run a handler under
``Concurrency(2, key=customer)``, and one of them is SIGKILLed in the middle
of a handler. The limit is never exceeded (the attempts' start and end times,
one machine clock for every process, never overlap more than two per
customer), no slot leaks (every event runs: the killed worker's slots free
when its leases lapse) and no event runs twice but those the killed worker
had started (the seed's at-least-once).

The pacing options hold across three processes too: a ``Throttle`` starts at
most its limit per period, a ``Debounce`` runs only the last event of a burst
once its quiet period passed (the rest stored skipped), and a ``Retry``
backoff delays the retry wherever it runs.
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
from typing import Any

import pytest
import trio

import a2trio
from tests.backends.postgres import database_dsn, run_sql
from tests.flow_workers.paced import (
    QUIET_S,
    RETRY_AFTER_S,
    TICK_PERIOD_S,
    Burst,
    Flaky,
    Tick,
    paced,
    specs,
)
from tests.flow_workers.worker import LIMIT, LIMITED, Job, jobs, open_store

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 3
SESSIONS = 8
PER_SESSION = 4
#: Hang guard for each wait, generous for a loaded machine: not about speed.
DEADLINE_S = 180.0


def _wait(what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        for proc in procs:
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                raise AssertionError(f"{proc.args!r} exited {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _log(folder: Path, name: str) -> list[tuple[str, str, int, str, float]]:
    path = folder / f"{name}.log"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(what, id_, int(attempt), who, float(at)) for what, id_, attempt, who, at in lines]


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at a tie)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_limit_holds_across_processes_and_a_killed_workers_slots_free(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"fl_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "jobs.db")
    store = open_store(backend, url, schema)
    names = [f"w{n}" for n in range(WORKERS)]

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.flow_workers.worker", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists(), workers)

    spec = a2trio.handler(_never, concurrency=LIMITED)
    api = a2trio.Server(jobs, store=store, handlers={"job": spec}, run_handlers=False)
    try:
        async with api:
            for name in names:
                await trio.to_thread.run_sync(start, name)
            [hung] = await api.session("hang").append(jobs.event("job", Job("acme", hang=True)))
            ids = [hung.id]
            for n in range(SESSIONS):
                session = api.session(f"s{n}")
                for k in range(PER_SESSION):
                    who = "acme" if (n + k) % 2 == 0 else "zeta"
                    [event] = await session.append(jobs.event("job", Job(who)))
                    ids.append(event.id)
            await trio.to_thread.run_sync(
                _wait, "the hang", lambda: (tmp_path / "hanging").exists(), workers
            )
            victim_pid = int((tmp_path / "hanging").read_text())
            [victim] = [p for p in workers if p.pid == victim_pid]
            os.kill(victim_pid, signal.SIGKILL)
            victim.wait()
            killed_at = time.monotonic()
            victim_name = names[workers.index(victim)]

            def every_event_ended() -> bool:
                ended = {e[1] for name in names for e in _log(tmp_path, name) if e[0] == "end"}
                return set(ids) <= ended

            await trio.to_thread.run_sync(_wait, "every event to run", every_event_ended, workers)
            await trio.to_thread.run_sync(
                _wait,
                "the completions",
                lambda: trio.from_thread.run(_settled, store, api, ids),
                workers,
            )
            starts: dict[tuple[str, int], tuple[str, float, str]] = {}
            ends: dict[tuple[str, int], float] = {}
            for name in names:
                for what, id_, attempt, who, at in _log(tmp_path, name):
                    if what == "start":
                        starts[(id_, attempt)] = (who, at, name)
                    else:
                        ends[(id_, attempt)] = at
            by_customer: dict[str, list[tuple[float, float]]] = {}
            for key, (who, at, name) in starts.items():
                if key not in ends:
                    # Only the killed worker leaves an attempt unended: it
                    # ran until the kill.
                    assert name == victim_name, (key, name)
                by_customer.setdefault(who, []).append((at, ends.get(key, killed_at)))
            for who, intervals in by_customer.items():
                assert _most_at_once(intervals) <= LIMIT, f"{who}: over the limit"
            assert _most_at_once(by_customer["acme"]) == LIMIT, "the limit was reached"
            rerun = {id_ for id_, attempt in starts if attempt > 1}
            assert hung.id in rerun
            for id_ in rerun:
                first = starts[(id_, 1)]
                assert first[2] == victim_name, f"{id_} ran twice, not after the kill"
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


async def _settled(store: a2trio.Store, api: a2trio.Server, ids: list[str]) -> bool:
    """Whether every job is stored processed (read through the store)."""
    found = 0
    for name in ["hang", *(f"s{n}" for n in range(SESSIONS))]:
        for row in await store.read(api.key(name)):
            found += row.id in ids and row.processed_at_ms is not None
    return found == len(ids)


async def _never(ctx: a2trio.HandlerContext[Job]) -> None:
    raise AssertionError("the API tier runs no handler")


#: Clock slack for the pacing checks: the logged times are taken in the
#: handler, a little after the claim the store paced.
SLACK_S = 0.25


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_throttle_debounce_and_backoff_hold_across_processes(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"fp_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "paced.db")
    store = open_store(backend, url, schema)
    names = [f"w{n}" for n in range(WORKERS)]

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.flow_workers.paced", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists(), workers)

    def runs() -> list[tuple[str, str, int, float]]:
        found = []
        for name in names:
            path = tmp_path / f"{name}.log"
            for line in path.read_text().splitlines() if path.exists() else []:
                what, id_, attempt, at = line.split()
                found.append((what, id_, int(attempt), float(at)))
        return sorted(found, key=lambda run: run[3])

    api = a2trio.Server(
        paced, store=store, handlers=specs(_no_run, _no_run, _no_run), run_handlers=False
    )
    try:
        async with api:
            for name in names:
                await trio.to_thread.run_sync(start, name)
            ticks = [
                (await api.session("ticks").append(paced.event("tick", Tick(n))))[0].id
                for n in range(8)
            ]
            flaky = [
                (await api.session(f"f{n}").append(paced.event("flaky", Flaky(n))))[0].id
                for n in range(3)
            ]
            last: dict[str, float] = {}
            skipped: set[str] = set()
            for s in range(3):
                session = api.session(f"b{s}")
                for n in range(5):
                    before = time.monotonic()
                    [event] = await session.append(paced.event("burst", Burst("d", n)))
                    if n < 4:
                        skipped.add(event.id)
                    else:
                        last[event.id] = before
                before = time.monotonic()
                [other] = await session.append(paced.event("burst", Burst("e", 0)))
                last[other.id] = before
            skipped -= set(last)

            def done() -> bool:
                seen = runs()
                return (
                    sum(run[0] == "tick" for run in seen) >= len(ticks)
                    and sum(run[0] == "retried" for run in seen) >= len(flaky)
                    and sum(run[0] == "burst" for run in seen) >= len(last)
                )

            await trio.to_thread.run_sync(_wait, "every handler to run", done, workers)
            seen = runs()
            tick_starts = [at for what, _, _, at in seen if what == "tick"]
            assert sorted(id_ for what, id_, _, _ in seen if what == "tick") == sorted(ticks)
            for earlier, later in zip(tick_starts, tick_starts[2:], strict=False):
                assert later - earlier >= TICK_PERIOD_S - SLACK_S, "over the throttle"
            bursts = {id_: at for what, id_, _, at in seen if what == "burst"}
            assert sorted(bursts) == sorted(last), "only the last of a burst runs, once"
            for id_, at in bursts.items():
                assert at - last[id_] >= QUIET_S - SLACK_S, "ran before its quiet period"
            fails = {id_: at for what, id_, attempt, at in seen if what == "fail"}
            retried = {id_: (attempt, at) for what, id_, attempt, at in seen if what == "retried"}
            assert sorted(fails) == sorted(retried) == sorted(flaky)
            for id_, (attempt, at) in retried.items():
                assert attempt == 2
                assert at - fails[id_] >= RETRY_AFTER_S - SLACK_S, "retried before its backoff"
            debounced = {
                row.id
                for s in range(3)
                for row in await store.read(api.key(f"b{s}"))
                if row.debounced_by is not None
            }
            assert debounced == skipped
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


async def _no_run(ctx: a2trio.HandlerContext[Any]) -> None:
    raise AssertionError("the API tier runs no handler")
