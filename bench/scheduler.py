"""Scheduler throughput: how fast tasks are stored, and how fast due ones are delivered.

    python bench/scheduler.py --tasks 1000

One process, the real clock, a memory store behind the server. Tasks are
scheduled one at a time while no server is bound (the schedule rate), then a
server binds and the time until the queue is empty gives the delivery rate.
Postgres runs in a fresh database created and dropped by the script.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable

import msgspec
import psycopg
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.scheduler import AppendTask, ScheduledEvent
from a2trio.schedulers import DurableScheduler, LocalScheduler


class Tick(msgspec.Struct, frozen=True):
    n: int


fleet = a2trio.contract("fleet", events={"tick": Tick})


async def run(name: str, make: Callable[[], LocalScheduler | DurableScheduler], tasks: int) -> None:
    clock = a2trio.SystemClock()
    scheduler = make()
    server = a2trio.Server(fleet, store=a2trio.stores.memory(), scheduler=scheduler)
    async with scheduler:
        started = time.perf_counter()
        for n in range(tasks):
            event = ScheduledEvent(f"e{n}", "tick", {"n": n})
            await scheduler.schedule(
                AppendTask(f"t{n}", "fleet", f"s{n % 10}", clock.now_ms(), [event])
            )
        scheduled = time.perf_counter()
        async with server:
            while await scheduler.queued():  # noqa: ASYNC110 - polls the store, no event to wait on
                await trio.sleep(0.01)
        delivered = time.perf_counter()
    print(
        f"| {name} | {tasks} | {tasks / (scheduled - started):,.0f} "
        f"| {tasks / (delivered - scheduled):,.0f} |"
    )


async def main(tasks: int, dsn: str) -> None:
    print(f"# bench/scheduler.py: {tasks} tasks; trio {trio.__version__}")
    print("| scheduler | tasks | schedule/s (sequential) | delivered/s |")
    print("| --- | ---: | ---: | ---: |")
    await run("LocalScheduler", LocalScheduler, tasks)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "scheduler.db")
        await run("DurableScheduler.sqlite", lambda: DurableScheduler.sqlite(path), tasks)
    database = f"a2trio_sched_bench_{secrets.token_hex(3)}"
    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        target = psycopg.conninfo.make_conninfo(dsn, dbname=database)
        await run("DurableScheduler.postgres", lambda: DurableScheduler.postgres(target), tasks)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    trio.run(main, args.tasks, args.dsn)
