"""Where append -> handler start in another process goes, on Postgres, against its floor.

    .venv/bin/python bench/remote_latency.py [--samples 300] [--dsn ...]

**a2trio**: this process appends single events to one session (a server with
``run_handlers=False``); a worker process (this script with ``--worker``)
runs the handler, woken by its LISTEN connection. Both read
``time.perf_counter()`` (one monotonic clock on one machine), and the worker
marks each call of its store's ``claim_available`` and the handler's start,
so each sample splits into: the append's call (its durable commit), from the
append's start to the worker's claim (the NOTIFY's delivery and the drain's
wake-up), the claim's call (a second durable commit: the claim is a
lease written to the row), and from the claim to the handler's start.

**floor**: the same two durable commits with nothing around them, in
psycopg on two connections: an insert and a ``NOTIFY`` committed in one
transaction, then, once the listening connection has the notification, an
``UPDATE`` of the row (the claim) committed.

Medians over ``--samples`` sequential events, a pause of ``--pause`` ms
between them (as an interactive append would come). Issue 30's goal is
append -> handler start within 3x a durable NOTIFY round trip; two durable
commits in sequence are the floor of any design that records the claim.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from functools import partial

import psycopg
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.stores.postgres import PostgresStore

sys.path.insert(0, os.path.dirname(__file__))

from vs_queues import Tick, _Lines, bench

DEFAULT_DSN = os.environ.get("A2_PG_DSN", "postgresql://root@127.0.0.1:5432/postgres")


async def worker(dsn: str) -> None:
    """Run the handler; print each sample's marks as one JSON line."""
    marks: list[tuple[str, float]] = []
    store = a2trio.stores.postgres(dsn)
    claim = store.claim_available

    async def marked_claim(*args: object, **kwargs: object) -> object:
        marks.append(("claim", time.perf_counter()))
        answer = await claim(*args, **kwargs)  # type: ignore[arg-type]
        marks.append(("claimed", time.perf_counter()))
        return answer

    store.claim_available = marked_claim  # type: ignore[method-assign, assignment]

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        # The first claim of the sample: later ones are the drain's re-checks.
        first: dict[str, float] = {}
        for name, at in marks:
            first.setdefault(name, at)
        print(json.dumps({**first, "start": time.perf_counter()}), flush=True)
        marks.clear()

    async with store, a2trio.Server(bench, store=store, handlers={"tick": tick}):
        await store.wait_listening()
        print("ready", flush=True)
        await trio.sleep_forever()


async def a2trio_samples(dsn: str, samples: int, pause: float) -> list[dict[str, float]]:
    store: PostgresStore = a2trio.stores.postgres(dsn)
    rows: list[dict[str, float]] = []
    command = [sys.executable, __file__, "--worker", "--dsn", dsn]
    try:
        # The API tier knows the handler (so its appends are unsettled) but runs none.
        api = a2trio.Server(bench, store=store, handlers={"tick": _idle}, run_handlers=False)
        async with api, trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
            )
            assert process.stdout is not None
            lines = _Lines(process.stdout)
            if (first := await lines.next()) != "ready":
                raise RuntimeError(f"the worker process did not start: {first!r}")
            session = api.session(f"latency-{secrets.token_hex(3)}")
            for n in range(-5, samples):
                before = time.perf_counter()
                await session.append(bench.event("tick", Tick(n)))
                after = time.perf_counter()
                marks = json.loads(await lines.next())
                # Without a claim of its own the event was taken by a claim
                # begun before the last handler's start (no pause): dropped.
                if n >= 0 and "claim" in marks:
                    rows.append({"before": before, "appended": after, **marks})
                await trio.sleep(pause)
            process.terminate()
    finally:
        await store.aclose()
    return rows


async def _idle(ctx: a2trio.HandlerContext[Tick]) -> None:
    """The API tier's registration of the handler, which it never runs."""


def floor_samples(dsn: str, samples: int, pause: float) -> list[dict[str, float]]:
    schema = f"latency_{secrets.token_hex(4)}"
    rows: list[dict[str, float]] = []
    with (
        psycopg.connect(dsn, autocommit=True) as writer,
        psycopg.connect(dsn, autocommit=True) as claimer,
    ):
        writer.execute(f"create schema {schema}")
        try:
            writer.execute(
                f"create table {schema}.jobs (id bigint primary key, claimed boolean not null)"
            )
            claimer.execute(f"listen {schema}")
            for n in range(-5, samples):
                before = time.perf_counter()
                with writer.transaction():
                    writer.execute(f"insert into {schema}.jobs values (%s, false)", (n,))
                    writer.execute(f"notify {schema}, '{n}'")
                appended = time.perf_counter()
                for _ in claimer.notifies(stop_after=1):
                    pass
                heard = time.perf_counter()
                with claimer.transaction():
                    claimer.execute(f"update {schema}.jobs set claimed = true where id = %s", (n,))
                if n >= 0:
                    rows.append(
                        {
                            "before": before,
                            "appended": appended,
                            "claim": heard,
                            "claimed": time.perf_counter(),
                        }
                    )
                time.sleep(pause)
        finally:
            writer.execute(f"drop schema {schema} cascade")
    return rows


def median_ms(rows: list[dict[str, float]], start: str, end: str) -> float:
    return statistics.median(row[end] - row[start] for row in rows) * 1000


async def main(args: argparse.Namespace) -> None:
    pause = args.pause / 1000
    ours = await a2trio_samples(args.dsn, args.samples, pause)
    floor = await trio.to_thread.run_sync(floor_samples, args.dsn, args.samples, pause)
    for row in floor:
        row["start"] = row["claimed"]
    spans = [
        ("the append's call (a durable commit)", "before", "appended"),
        ("append's start -> the claim's start (NOTIFY, wake-up)", "before", "claim"),
        ("the claim's call (a durable commit)", "claim", "claimed"),
        ("the claim's answer -> the handler's start", "claimed", "start"),
        ("append -> handler start", "before", "start"),
    ]
    print(
        f"# bench/remote_latency.py: {len(ours)} of {args.samples} samples with a claim"
        f" of their own, {args.pause} ms apart, medians"
    )
    print("| span | a2trio ms | floor ms | a2trio / floor |")
    print("| ---- | --------: | -------: | -------------: |")
    figures: dict[str, float] = {}
    for name, start, end in spans:
        a, f = median_ms(ours, start, end), median_ms(floor, start, end)
        ratio = f"{a / f:.2f}x" if f > 0.001 else ""
        print(f"| {name} | {a:.3f} | {f:.3f} | {ratio} |")
        figures[f"a2trio, {name}: ms"] = a
        figures[f"floor, {name}: ms"] = f
    if args.json:
        await trio.Path(args.json).write_text(json.dumps(figures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--pause", type=float, default=2.0, help="ms between samples")
    parser.add_argument("--json", help="also write the figures here (bench/regress.py)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        trio.run(worker, arguments.dsn)
    else:
        trio.run(main, arguments)
