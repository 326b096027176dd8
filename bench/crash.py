"""Exactly once while workers are SIGKILLed, with no scheduler (issue 16).

    .venv/bin/python bench/crash.py [--store postgres|sqlite] [--jobs 2000]
        [--workers 3] [--kill-every 1.0] [--kills 30]

Worker processes run the ``job`` handler (it returns one ``done`` event); this
process appends ``--jobs`` jobs over ``--sessions`` sessions through a server
that runs no handlers, paced over the kill window, while a loop SIGKILLs a random worker every
``--kill-every`` seconds (``--kills`` times) and starts a new one in its place.
There is no scheduler and nothing appends after the jobs: stranded claims are
taken up by the workers' sweeps. Leases are short (ttl 2 s, sweep 0.5 s) so a
run takes under a minute.

Then it verifies, from the store's rows: every job processed exactly once,
with exactly one ``done`` event whose cause is the processing attempt; every
session's indexes contiguous from 1; nothing failed or dead-lettered. It prints
the kills, the jobs retried (claimed more than once), and the time from the
last kill, and from the last append, until every job was processed.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import msgspec
import psycopg
import trio

import a2trio

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/postgres"
TIMINGS = a2trio.Timings(claim_ttl_s=2.0, heartbeat_s=0.5, sweep_s=0.5, watchdog_grace_s=0.5)


class Job(msgspec.Struct, frozen=True):
    n: int


class Done(msgspec.Struct, frozen=True):
    job: str


jobs = a2trio.contract("crash", events={"job": Job, "done": Done})


async def handle(ctx: a2trio.HandlerContext[Job]) -> a2trio.Returned:
    # Long enough that kills land mid-handler.
    await trio.sleep(random.uniform(0.001, 0.02))
    return jobs.event("done", Done(ctx.event.id))


def open_store(kind: str, where: str, schema: str) -> a2trio.Store:
    if kind == "postgres":
        return a2trio.stores.postgres(where, schema=schema)
    return a2trio.stores.sqlite(where)


async def worker(kind: str, where: str, schema: str) -> None:
    store = open_store(kind, where, schema)
    async with a2trio.Server(jobs, store=store, handlers={"job": handle}, timings=TIMINGS):
        await trio.sleep_forever()


def spawn(kind: str, where: str, schema: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--worker", "--store", kind, "--where", where]
    return subprocess.Popen([*command, "--schema", schema])


async def run(args: argparse.Namespace) -> dict[str, float]:
    kind = args.store
    schema = f"crash_{secrets.token_hex(4)}"
    folder = tempfile.mkdtemp(prefix="a2trio-crash-")
    where = args.dsn if kind == "postgres" else str(Path(folder) / "crash.db")
    store = open_store(kind, where, schema)
    api = a2trio.Server(jobs, store=store, handlers={"job": handle}, run_handlers=False)
    procs = [spawn(kind, where, schema) for _ in range(args.workers)]
    kills = 0
    last_kill = last_append = time.monotonic()
    try:
        async with api:
            sessions = [f"s{n:03d}" for n in range(args.sessions)]

            async def append_all() -> None:
                nonlocal last_append
                # Paced over the kill window, so kills land while work flows.
                pace = args.kills * args.kill_every / args.jobs
                for n in range(args.jobs):
                    await trio.sleep(pace)
                    event = jobs.event("job", Job(n), id=f"job-{n}")
                    while True:
                        try:
                            await api.session(sessions[n % len(sessions)]).append(event)
                            break
                        except a2trio.A2Error:
                            await trio.sleep(0.05)  # retried with the same id
                last_append = time.monotonic()

            async def kill_loop() -> None:
                nonlocal kills, last_kill
                for _ in range(args.kills):
                    await trio.sleep(args.kill_every)
                    victim = random.randrange(len(procs))
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait()
                    last_kill = time.monotonic()
                    kills += 1
                    procs[victim] = spawn(kind, where, schema)

            start = time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(append_all)
                nursery.start_soon(kill_loop)
            while True:
                rows = [r for s in sessions for r in await store.read(api.key(s))]
                job_rows = [r for r in rows if r.type == "job"]
                if len(job_rows) == args.jobs and all(r.processed_at_ms for r in job_rows):
                    break
                await trio.sleep(0.1)
            drained = time.monotonic()
            verify(rows, sessions, api, args.jobs)
            retried = sum(1 for r in job_rows if r.attempt_count > 1)
            return {
                "jobs": args.jobs,
                "workers": args.workers,
                "kills": kills,
                "jobs retried": retried,
                "seconds total": round(drained - start, 2),
                "seconds from the last kill to drained": round(drained - last_kill, 2),
                "seconds from the last append to drained": round(drained - last_append, 2),
            }
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        await store.aclose()
        if kind == "postgres":
            with psycopg.connect(where, autocommit=True) as conn:
                conn.execute(f'drop schema if exists "{schema}" cascade')


def verify(
    rows: list[a2trio.stores.base.StoredEvent],
    sessions: list[str],
    api: a2trio.Server,
    total: int,
) -> None:
    job_rows = [r for r in rows if r.type == "job"]
    done_rows = [r for r in rows if r.type == "done"]
    assert len({r.id for r in job_rows}) == total, "a job is missing or twice"
    assert all(r.failed_at_ms is None and r.failure_count == 0 for r in job_rows), "a failure"
    dones = Counter(r.payload["job"] for r in done_rows)
    assert len(done_rows) == total, f"{len(done_rows)} done events for {total} jobs"
    assert set(dones.values()) == {1}, "a job has two done events"
    by_key = {(r.session_id, r.index): r for r in job_rows}
    for done in done_rows:
        assert done.cause is not None
        parent = by_key[(done.session_id, done.cause.index)]
        assert parent.id == done.payload["job"]
        assert parent.processed_by_attempt == done.cause.attempt, "done by a stale attempt"
    for session in sessions:
        indexes = sorted(r.index for r in rows if r.session_id == api.key(session))
        assert indexes == list(range(1, len(indexes) + 1)), f"a gap in {session}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=1.0)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--where", help=argparse.SUPPRESS)
    parser.add_argument("--schema", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        trio.run(worker, args.store, args.where, args.schema)
        return
    print(f"# bench/crash.py --store {args.store}; pid {os.getpid()}")
    figures = trio.run(run, args)
    print("| what | value |\n| --- | ---: |")
    for name, value in figures.items():
        print(f"| {name} | {value:,} |")
    print("- verified: every job processed once, one done event each, no gaps, no failures")


if __name__ == "__main__":
    main()
