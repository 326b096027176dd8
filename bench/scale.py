"""Scale-out: 1, 2 and 4 worker processes draining one Postgres, in one run.

    .venv/bin/python bench/scale.py [--workers 1,2,4] [--sessions 100,1000] [--jobs 20000]

For each session count and worker count, in a fresh database: N worker
processes (this script with ``--worker``), each an ``a2trio.Server`` with a
no-op handler on its own Postgres store, woken through LISTEN; this process
is the API process: a server with ``run_handlers=False`` that appends
``--jobs`` events over the sessions, ``--batch`` per append, one writer per
session. Timed from the first append until every event is processed (a count
of processed rows, polled every 20 ms). Reports events/s, the CPU time per
event of all the workers together and of the appending process, and how the
events split between the workers.

The workers, the appender and Postgres share the machine's cores: on a
2-core machine more workers cannot add throughput, and the figure to read is
how the CPU per event grows with the number of processes competing for the
same sessions (claims that find another worker's lease, LISTEN wake-ups in
every process).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

import msgspec
import psycopg
import trio
from psycopg.conninfo import make_conninfo

if not os.environ.get("PYTHONPATH"):
    # This checkout's a2trio; PYTHONPATH=/other/checkout measures that one.
    sys.path.insert(1, os.path.join(os.path.dirname(__file__), ".."))

import a2trio


class Tick(msgspec.Struct, frozen=True):
    n: int


bench = a2trio.contract("bench", events={"tick": Tick, "plain": Tick})
DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/postgres"
POLL_S = 0.02


class Report(msgspec.Struct):
    handled: int
    cpu_s: float


# -- the worker process ------------------------------------------------------


async def worker(dsn: str) -> None:
    handled = 0

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        nonlocal handled
        handled += 1

    store = a2trio.stores.postgres(dsn)
    async with store, a2trio.Server(bench, store=store, handlers={"tick": tick}):
        await store.wait_listening()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
    report = Report(handled, time.process_time())
    print(msgspec.json.encode(report).decode(), flush=True)


# -- the API process ---------------------------------------------------------


async def noop(ctx: a2trio.HandlerContext[Tick]) -> None:
    """Never runs here: the API process runs no handlers."""


class Lines:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise RuntimeError("a worker process exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


def processed(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "select count(*) from a2_events where event_type = 'tick' and processed_at is not null"
        ).fetchone()
    return int(row[0]) if row else 0


async def run_once(
    dsn: str, workers: int, sessions: int, jobs: int, batch: int
) -> dict[str, float]:
    store = a2trio.stores.postgres(dsn)
    # The same handlers as the workers (an event type without one is written
    # already processed), but none run here.
    api = a2trio.Server(bench, store=store, handlers={"tick": noop}, run_handlers=False)
    per_session = jobs // sessions
    total = per_session * sessions
    async with store, api:
        # Creates the schema before the workers start.
        await api.session("warm").append(bench.event("plain", Tick(0)))
        async with trio.open_nursery() as nursery:
            procs: list[trio.Process] = []
            for _ in range(workers):
                proc: trio.Process = await nursery.start(
                    partial(
                        trio.run_process,
                        [sys.executable, __file__, "--worker", "--dsn", dsn],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        check=False,
                    )
                )
                procs.append(proc)
            lines = []
            for proc in procs:
                assert proc.stdout is not None
                lines.append(Lines(proc.stdout))
                if await lines[-1].next() != "ready":
                    raise RuntimeError("a worker did not start")
            cpu, started = time.process_time(), time.perf_counter()

            async def writer(sid: str) -> None:
                session = api.session(sid)
                for first in range(0, per_session, batch):
                    n = min(batch, per_session - first)
                    await session.append(*[bench.event("tick", Tick(first + i)) for i in range(n)])

            async with trio.open_nursery() as writers:
                for s in range(sessions):
                    writers.start_soon(writer, f"s{s}")
            appended_cpu = time.process_time() - cpu
            while await trio.to_thread.run_sync(processed, dsn) < total:  # noqa: ASYNC110
                await trio.sleep(POLL_S)
            elapsed = time.perf_counter() - started
            reports = []
            for proc, line in zip(procs, lines, strict=True):
                assert proc.stdin is not None
                await proc.stdin.send_all(b"stop\n")
                reports.append(msgspec.json.decode(await line.next(), type=Report))
    handled = [r.handled for r in reports]
    return {
        "events/s": total / elapsed,
        "workers CPU µs/event": sum(r.cpu_s for r in reports) / total * 1e6,
        "appender CPU µs/event": appended_cpu / total * 1e6,
        "largest share": max(handled) / total,
    }


def run_in(dsn: str, *, workers: int, sessions: int, args: argparse.Namespace) -> dict[str, float]:
    return trio.run(run_once, dsn, workers, sessions, args.jobs, args.batch)


def with_database(dsn: str, body: Callable[[str], dict[str, float]]) -> dict[str, float]:
    database = f"a2trio_scale_{secrets.token_hex(4)}"
    admin = make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'create database "{database}"')
    url = urlsplit(dsn)._replace(path=f"/{database}").geturl()
    try:
        return body(url)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'drop database "{database}" with (force)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--sessions", default="100,1000")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        trio.run(worker, args.dsn)
        return
    load = os.getloadavg()[0]
    print(f"# bench/scale.py {' '.join(sys.argv[1:])}")
    print(
        f"# {os.cpu_count()} cores, load average {load:.1f} at the start; trio {trio.__version__}"
    )
    print(
        "| workers | sessions | events | events/s | workers CPU µs/event "
        "| appender CPU µs/event | largest share |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    figures: dict[str, float] = {}
    for sessions in (int(s) for s in args.sessions.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            row = with_database(
                args.dsn, partial(run_in, workers=workers, sessions=sessions, args=args)
            )
            print(
                f"| {workers} | {sessions} | {args.jobs:,} | {row['events/s']:,.0f} "
                f"| {row['workers CPU µs/event']:.0f} | {row['appender CPU µs/event']:.0f} "
                f"| {row['largest share']:.0%} |",
                flush=True,
            )
            for key, value in row.items():
                figures[f"{workers} workers, {sessions} sessions: {key}"] = value
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
