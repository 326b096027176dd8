"""Scheduler throughput: how fast tasks are stored, and how fast due ones are delivered.

    python bench/scheduler.py --tasks 2000 [--only postgres,sqlite] [--json PATH]

One process, the real clock, a memory store behind the server. For each
scheduler, on an empty queue:

* **schedule/s (sequential)**: ``--tasks`` tasks scheduled one at a time while
  no server is bound: each ``schedule()`` returns once its row is committed;
* **schedule/s (N callers)**: as many again from ``--callers`` tasks at once
  (a server arming watchdogs from many drains, handlers scheduling), where
  the durable schedulers' group commit shares transactions;
* **delivered/s**: then a server binds, and the time until every task was
  delivered (``statistics().delivered``) gives the delivery rate;
* **floor**: one-row insert transactions per second, one at a time, on the
  bare driver in the same run (psycopg autocommit on Postgres; ``sqlite3``
  with ``synchronous = full``, the scheduler's setting, in WAL mode): what a
  sequential ``schedule()`` that waits for its commit can at best reach.

Postgres runs in a fresh database created and dropped by the script; sqlite
in a temporary folder. Only public API is used, so the script also measures
older code: ``PYTHONPATH=/tmp/sched-before python bench/scheduler.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable

import msgspec
import psycopg
import trio

if not os.environ.get("PYTHONPATH"):
    # This checkout's a2trio; PYTHONPATH=/other/checkout measures that one.
    sys.path.insert(1, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.scheduler import AppendTask, ScheduledEvent
from a2trio.schedulers import DurableScheduler, LocalScheduler


class Tick(msgspec.Struct, frozen=True):
    n: int


fleet = a2trio.contract("fleet", events={"tick": Tick})
Scheduler = LocalScheduler | DurableScheduler


def task(n: int, now_ms: int) -> AppendTask:
    return AppendTask(
        f"t{n}", "fleet", f"s{n % 10}", now_ms, [ScheduledEvent(f"e{n}", "tick", {"n": n})]
    )


async def run(
    name: str, make: Callable[[], Scheduler], tasks: int, callers: int, floor: float | None
) -> dict[str, float]:
    clock = a2trio.SystemClock()
    scheduler = make()
    server = a2trio.Server(fleet, store=a2trio.stores.memory(), scheduler=scheduler)
    async with scheduler:
        await scheduler.queued()  # connected, schema in place
        started = time.perf_counter()
        for n in range(tasks):
            await scheduler.schedule(task(n, clock.now_ms()))
        sequential = tasks / (time.perf_counter() - started)

        async def caller(first: int) -> None:
            for n in range(first, 2 * tasks, callers):
                await scheduler.schedule(task(n, clock.now_ms()))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for c in range(callers):
                nursery.start_soon(caller, tasks + c)
        concurrent = tasks / (time.perf_counter() - started)
        started = time.perf_counter()
        async with server:
            while scheduler.statistics().delivered < 2 * tasks:  # noqa: ASYNC110 - a counter
                await trio.sleep(0.005)
        delivered = 2 * tasks / (time.perf_counter() - started)
    figures = {
        "schedule/s (sequential)": sequential,
        f"schedule/s ({callers} callers)": concurrent,
        "delivered/s": delivered,
    }
    shown = [f"{value:,.0f}" for value in figures.values()]
    if floor is not None:
        figures["floor: one-row commits/s"] = floor
    print(
        f"| {name} | {tasks} | {' | '.join(shown)} | {'' if floor is None else f'{floor:,.0f}'} |"
    )
    return {f"{name}: {key}": value for key, value in figures.items()}


def pg_floor(dsn: str, n: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create table floor (id text primary key, body jsonb not null)")
        started = time.perf_counter()
        for i in range(n):
            conn.execute("insert into floor values (%s, '{}')", (f"r{i}",))
        return n / (time.perf_counter() - started)


def sqlite_floor(path: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("pragma journal_mode = wal")
        conn.execute("pragma synchronous = full")
        conn.execute("create table floor (id text primary key, body text not null)")
        started = time.perf_counter()
        for i in range(n):
            conn.execute("begin immediate")
            conn.execute("insert into floor values (?, '{}')", (f"r{i}",))
            conn.execute("commit")
        return n / (time.perf_counter() - started)
    finally:
        conn.close()


async def main(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    tasks, callers = args.tasks, args.callers
    print(f"# bench/scheduler.py {' '.join(sys.argv[1:])}")
    print(
        f"# a2trio from {os.path.dirname(a2trio.__file__)}; trio {trio.__version__}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"
    )
    print(
        f"| scheduler | tasks | schedule/s (sequential) | schedule/s ({callers} callers) "
        "| delivered/s | floor: one-row commits/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    figures: dict[str, float] = {}
    if "local" in only:
        figures |= await run("LocalScheduler", LocalScheduler, tasks, callers, None)
    if "sqlite" in only:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "scheduler.db")
            floor = sqlite_floor(os.path.join(folder, "floor.db"), tasks)
            make = lambda: DurableScheduler.sqlite(path)  # noqa: E731
            figures |= await run("DurableScheduler.sqlite", make, tasks, callers, floor)
    if "postgres" in only:
        database = f"a2trio_sched_bench_{secrets.token_hex(3)}"
        admin = psycopg.conninfo.make_conninfo(args.dsn, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        try:
            target = psycopg.conninfo.make_conninfo(args.dsn, dbname=database)
            floor = pg_floor(target, tasks)
            make = lambda: DurableScheduler.postgres(target)  # noqa: E731
            figures |= await run("DurableScheduler.postgres", make, tasks, callers, floor)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    if args.json:
        await trio.Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--only", default="local,sqlite,postgres")
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    trio.run(main, parser.parse_args())
