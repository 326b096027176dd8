"""Durable handlers survive a SIGKILL across processes (issue 34), on SQLite
and Postgres: two worker processes share one store.

* The worker that runs a handler's first attempt is SIGKILLed between its
  two steps; the other takes the event once the lease lapses and resumes it.
  The first step's side effect happened once (its result answered from the
  journal), the second ran once, and the handler completed, its returned
  event committed once.
* A handler's durable sleep suspends its attempt (no claim, no failure); the
  worker that ran it is SIGKILLed while it sleeps; at the wake time the other
  worker resumes it, and the step before the sleep is not run again.
* A durable ``wait_for`` without a timeout suspends its attempt with no
  wake time and its type as the row's wake mark; the worker that ran it is
  SIGKILLed; an event of that type appended by a third process (the API
  tier) makes it claimable in the store, and the other worker answers it.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import trio

import a2trio
from a2trio.stores import rules
from tests.backends.postgres import database_dsn, run_sql
from tests.durable_workers.worker import NAP_S, Answered, Done, Order, Woke, open_store, orders

ROOT = Path(__file__).resolve().parent.parent
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


def _effects(folder: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(folder / "effects.db") as db:
        return [(step, id_, pid) for step, id_, pid in db.execute("select * from effects")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_worker_killed_between_two_steps_is_resumed_by_another_process(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"du_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "orders.db")
    store = open_store(backend, url, schema)

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.durable_workers.worker", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists(), workers)

    handlers = {"order": _never, "nap": _never}
    api = a2trio.Server(orders, store=store, handlers=handlers, run_handlers=False)
    try:
        async with api:
            for name in ("w0", "w1"):
                await trio.to_thread.run_sync(start, name)
            session = api.session("order-1")
            [order] = await session.append(orders.event("order", Order("book")))
            await trio.to_thread.run_sync(
                _wait, "the first step", lambda: (tmp_path / "between").exists(), workers
            )
            victim_pid = int((tmp_path / "between").read_text())
            [victim] = [p for p in workers if p.pid == victim_pid]
            [survivor] = [p for p in workers if p.pid != victim_pid]
            os.kill(victim_pid, signal.SIGKILL)
            victim.wait()

            async def completed() -> bool:
                [row, *_] = await store.read(api.key("order-1"))
                return row.processed_at_ms is not None

            await trio.to_thread.run_sync(
                _wait, "the completion", lambda: trio.from_thread.run(completed), workers
            )
            rows = await store.read(api.key("order-1"))
            assert [row.type for row in rows] == ["order", "done"]
            assert (rows[0].attempt_count, rows[0].failure_count) == (2, 0)
            assert rows[0].processed_by_attempt == 2
            done = msgspec.convert(rows[1].payload, Done)
            assert done == Done(f"ch-{order.id}", f"parcel-for-ch-{order.id}", survivor.pid)
            effects = _effects(tmp_path)
            assert sorted(effects) == sorted(
                [("charge", order.id, victim_pid), ("ship", order.id, survivor.pid)]
            ), "each step's effect happened once: the charge before the kill, the ship after"
            journal = store.journal
            assert journal is not None
            entries = await journal.read_journal(api.key("order-1"), 1)
            assert [(e.name, e.attempt) for e in entries] == [("charge", 1), ("ship", 2)]
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_sleeping_attempt_holds_no_claim_and_another_process_resumes_it(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"du_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "orders.db")
    store = open_store(backend, url, schema)

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.durable_workers.worker", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists(), workers)

    handlers = {"order": _never, "nap": _never}
    api = a2trio.Server(orders, store=store, handlers=handlers, run_handlers=False)
    key = api.key("nap-1")
    try:
        async with api:
            for name in ("w0", "w1"):
                await trio.to_thread.run_sync(start, name)
            [napping] = await api.session("nap-1").append(orders.event("nap", Order("tea")))

            async def suspended() -> bool:
                [row] = await store.read(key)
                return row.attempt_count == 1 and row.not_before_ms is not None

            await trio.to_thread.run_sync(
                _wait, "the suspension", lambda: trio.from_thread.run(suspended), workers
            )
            sleeper_pid = int((tmp_path / "napping").read_text())
            [row] = await store.read(key)
            # Suspended: no claim held, no failure counted, not claimable yet.
            assert (row.claim_holder, row.failure_count) == (None, 0)
            assert row.not_before_ms is not None
            assert row.not_before_ms - row.created_at_ms >= NAP_S * 1000
            [sleeper] = [p for p in workers if p.pid == sleeper_pid]
            [survivor] = [p for p in workers if p.pid != sleeper_pid]
            os.kill(sleeper_pid, signal.SIGKILL)
            sleeper.wait()

            async def completed() -> bool:
                [row, *_] = await store.read(key)
                return row.processed_at_ms is not None

            await trio.to_thread.run_sync(
                _wait, "the wake", lambda: trio.from_thread.run(completed), workers
            )
            rows = await store.read(key)
            assert [row.type for row in rows] == ["nap", "woke"]
            assert (rows[0].attempt_count, rows[0].failure_count) == (2, 0)
            assert msgspec.convert(rows[1].payload, Woke) == Woke(survivor.pid)
            # Not before the wake instant (the store's clock: wall time here).
            assert rows[1].created_at_ms >= row.not_before_ms
            assert _effects(tmp_path) == [("before", napping.id, sleeper_pid)]
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_suspended_wait_is_woken_across_processes_by_its_event(
    backend: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    schema = f"du_{secrets.token_hex(6)}"
    url = await database_dsn() if backend == "postgres" else str(tmp_path / "orders.db")
    store = open_store(backend, url, schema)

    def start(name: str) -> None:
        command = [sys.executable, "-m", "tests.durable_workers.worker", backend, url, schema]
        proc = subprocess.Popen(
            [*command, str(tmp_path), name], env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        workers.append(proc)
        _wait(f"{name} to start", lambda: (tmp_path / f"{name}.ready").exists(), workers)

    handlers = {"order": _never, "nap": _never, "wait": _never}
    api = a2trio.Server(orders, store=store, handlers=handlers, run_handlers=False)
    key = api.key("wait-1")
    try:
        async with api:
            for name in ("w0", "w1"):
                await trio.to_thread.run_sync(start, name)
            await api.session("wait-1").append(orders.event("wait", Order("tea")))

            async def suspended() -> bool:
                [row] = await store.read(key)
                return row.attempt_count == 1 and row.not_before_ms == rules.NEVER_MS

            await trio.to_thread.run_sync(
                _wait, "the suspension", lambda: trio.from_thread.run(suspended), workers
            )
            waiter_pid = int((tmp_path / "waiting").read_text())
            [row] = await store.read(key)
            assert (row.claim_holder, row.failure_count) == (None, 0)
            [waiter] = [p for p in workers if p.pid == waiter_pid]
            [survivor] = [p for p in workers if p.pid != waiter_pid]
            os.kill(waiter_pid, signal.SIGKILL)
            waiter.wait()
            await api.session("wait-1").append(orders.event("arrived", Order("tea")))

            async def completed() -> bool:
                [row, *_] = await store.read(key)
                return row.processed_at_ms is not None

            await trio.to_thread.run_sync(
                _wait, "the wake", lambda: trio.from_thread.run(completed), workers
            )
            rows = await store.read(key)
            assert [row.type for row in rows] == ["wait", "arrived", "answered"]
            assert (rows[0].attempt_count, rows[0].failure_count) == (2, 0)
            assert msgspec.convert(rows[2].payload, Answered) == Answered(2, survivor.pid)
    finally:
        await store.aclose()
        if backend == "postgres":
            await run_sql(url, f'drop schema if exists "{schema}" cascade')


async def _never(ctx: a2trio.HandlerContext[Order]) -> None:
    raise AssertionError("the API tier runs no handler")
