"""What Python's garbage collector costs a2trio under load, on Postgres.

    .venv/bin/python bench/gc.py [--dsn postgresql://root@127.0.0.1:5432/postgres]

Runs ``bench/vs_queues.py``'s batched throughput case (``--jobs`` events over
``--sessions`` sessions, appended in batches of ``--batch``) in a fresh
database, ``--runs`` times under each collector setting, in this order:
Python's defaults, :func:`a2trio.tune_gc`, and the collector disabled
(the reference). ``gc.callbacks`` counts and times every collection. Prints
one table row per run.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import vs_queues

from a2trio.tuning import tune_gc

_counts = [0, 0, 0]
_seconds = [0.0, 0.0, 0.0]
_started = 0.0


def _timed(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        _counts[info["generation"]] += 1
        _seconds[info["generation"]] += time.perf_counter() - _started


async def measure(dsn: str, args: argparse.Namespace) -> list[str]:
    await vs_queues.a2_throughput(dsn, args.jobs // 4, args.sessions, args.batch)  # warm up
    lines = []
    gc.callbacks.append(_timed)
    try:
        for mode in ("Python's defaults", "tune_gc()", "disabled"):
            if mode == "tune_gc()":
                tune_gc()
            elif mode == "disabled":
                gc.disable()
            for _ in range(args.runs):
                _counts[:] = [0, 0, 0]
                _seconds[:] = [0.0, 0.0, 0.0]
                row = await vs_queues.a2_throughput(dsn, args.jobs, args.sessions, args.batch)
                assert row.per_s is not None
                assert row.cpu_us is not None
                collections = " / ".join(f"{n:,}" for n in _counts)
                spent = " / ".join(f"{s * 1000:,.0f}" for s in _seconds)
                lines.append(
                    f"| {mode} | {row.per_s:,.0f} | {row.cpu_us:.0f} | {collections} | {spent} |"
                )
    finally:
        gc.callbacks.remove(_timed)
        gc.enable()
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=vs_queues.DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    lines = vs_queues.with_database(args.dsn, lambda dsn: trio.run(measure, dsn, args))
    print(f"# bench/gc.py {' '.join(sys.argv[1:])}")
    print(f"# {vs_queues.versions(args.dsn)}")
    print(
        f"| collector | events/s ({args.jobs:,} events, batch {args.batch}) | client CPU µs/event"
        " | collections, gen 0 / 1 / 2 | time in them, ms |"
    )
    print("| --- | ---: | ---: | --- | --- |")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
