"""What ``Server(max_handlers=...)`` costs a burst, on Postgres, in one run.

    .venv/bin/python bench/cap.py [--caps 256,1024,20000] [--rounds 2] [--dsn ...]

A burst of ``--jobs`` events over ``--sessions`` sessions, appended in batches
of ``--batch`` per session (the batched row of ``bench/vs_queues.py``), handled
by no-op handlers, once per cap and round, each in a fresh process (so peak RSS
is the burst's own) and a fresh database. Prints, per cap, the median over the
rounds of: events/s from the first append until every completion has
committed, the store's group commits and the drains' claim calls per 1,000 events,
and the process's peak RSS. Issue 30 chose the default cap from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time

import msgspec
import psycopg
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.testing import FaultyStore


class Tick(msgspec.Struct, frozen=True):
    n: int


bench = a2trio.contract("bench", events={"tick": Tick})


async def burst(dsn: str, jobs: int, sessions: int, batch: int, cap: int) -> dict[str, float]:
    store = a2trio.stores.postgres(dsn)
    # No faults: it counts the calls (the drains' claims).
    counted = FaultyStore(store)
    handled = 0

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        nonlocal handled
        handled += 1

    per_session = jobs // sessions
    server = a2trio.Server(bench, store=counted, handlers={"tick": tick}, max_handlers=cap)
    async with server:
        before = store.group_statistics().groups
        started = time.perf_counter()

        async def writer(session_id: str) -> None:
            session = server.session(session_id)
            for first in range(0, per_session, batch):
                count = min(batch, per_session - first)
                await session.append(*(bench.event("tick", Tick(first + i)) for i in range(count)))

        async with trio.open_nursery() as nursery:
            for n in range(sessions):
                nursery.start_soon(writer, f"s{n}")
        await server.settle()
        elapsed = time.perf_counter() - started
        groups = store.group_statistics().groups - before
    await store.aclose()
    total = per_session * sessions
    assert handled == total, (handled, total)
    return {
        "events/s": total / elapsed,
        "commits/1k": groups / total * 1000,
        "claims/1k": counted.statistics().calls.get("claim_available", 0) / total * 1000,
        "peak RSS MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def one(args: argparse.Namespace, cap: int) -> dict[str, float]:
    """A burst in a fresh database, in this process."""
    database = f"a2trio_cap_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f'create database "{database}"')
    try:
        dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=database)
        return trio.run(burst, dsn, args.jobs, args.sessions, args.batch, cap)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'drop database "{database}" with (force)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--caps", default="256,1024,20000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args, args.one)))
        return
    caps = [int(c) for c in args.caps.split(",")]
    runs: dict[int, list[dict[str, float]]] = {cap: [] for cap in caps}
    for _ in range(args.rounds):
        for cap in caps:
            command = [sys.executable, __file__, *sys.argv[1:], "--one", str(cap)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[cap].append(json.loads(out.splitlines()[-1]))
    print(f"# bench/cap.py {' '.join(sys.argv[1:])}; load {os.getloadavg()[0]:.2f}")
    names = list(runs[caps[0]][0])
    print("| max_handlers | " + " | ".join(names) + " |")
    print("| ---: |" + " ---: |" * len(names))
    for cap in caps:
        medians = [statistics.median(r[name] for r in runs[cap]) for name in names]
        print(f"| {cap:,} | " + " | ".join(f"{m:,.1f}" for m in medians) + " |")


if __name__ == "__main__":
    main()
