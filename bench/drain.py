"""Drain throughput and latency, per store, side by side in one run.

    python bench/drain.py                          # memory
    python bench/drain.py --store memory,sqlite    # two columns
    python bench/drain.py --store postgres --dsn postgresql://root@127.0.0.1/postgres
    python bench/drain.py --store redis --redis-url redis://127.0.0.1:6379/0

Measures, with a no-op handler on the real clock:

* appended + handled events/s: ``--events`` single-event appends spread over
  one session, then over ``--sessions`` sessions, appended concurrently (one
  writer task per session), timed until every handler has run;
* appends/s alone (no handlers);
* append -> handler-start latency p50/p99 over ``--latency`` sequential events
  in one session (the next append waits for the previous handler), after
  ``WARM_UP`` untimed ones (as every latency row here);
* append -> live-feed delivery p50/p99 (for Postgres with LISTEN/NOTIFY, and
  with polling: a second store instance with ``listen=False`` follows what the
  first appends, as another process would);
* for Postgres, append -> handler start in another "process" (an API server
  with ``run_handlers=False`` appends; a worker on a second store instance is
  woken by its listener);
* for Postgres, the raw floor in the same run: single-row insert transactions/s
  over plain psycopg, and a bare NOTIFY -> LISTEN round trip.

Postgres runs in a fresh database created and dropped by the script; Redis
under a fresh key prefix whose keys the script deletes (``--store redis``:
the other-process rows use a second store instance on the same prefix).
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import msgspec
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.stores.base import Store
from a2trio.tuning import tune_gc


class Tick(msgspec.Struct, frozen=True):
    n: int


#: Events before each latency measurement that are not timed: the first uses
#: of a pool's connections prepare and plan statements (milliseconds each).
WARM_UP = 10


bench = a2trio.contract("bench", events={"tick": Tick, "plain": Tick})


@asynccontextmanager
async def open_backend(
    name: str, dsn: str, redis_url: str = "redis://127.0.0.1:6379/0"
) -> AsyncIterator[tuple[Store, str | None]]:
    """The store, and for Postgres the DSN of its fresh database (for Redis,
    its key prefix)."""
    if name == "redis":
        prefix = f"a2bench-{secrets.token_hex(4)}"
        store = a2trio.stores.redis(redis_url, key_prefix=prefix)
        try:
            yield store, prefix
        finally:
            await store.aclose()
            await delete_redis_prefix(redis_url, prefix)
    elif name == "memory":
        yield a2trio.stores.memory(), None
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            store = a2trio.stores.sqlite(os.path.join(folder, "bench.db"))
            try:
                yield store, None
            finally:
                await store.aclose()
    elif name == "postgres":
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        database = f"a2trio_bench_{secrets.token_hex(4)}"
        admin = make_conninfo(dsn, dbname="postgres")

        def run(sql: str) -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql)

        await trio.to_thread.run_sync(run, f'create database "{database}"')
        params = conninfo_to_dict(dsn)
        params["dbname"] = database
        target = make_conninfo(**params)
        store = a2trio.stores.postgres(target)
        try:
            yield store, target
        finally:
            await store.aclose()
            await trio.to_thread.run_sync(run, f'drop database "{database}" with (force)')
    else:
        raise SystemExit(f"unknown store {name!r}: memory, sqlite, postgres or redis")


async def delete_redis_prefix(url: str, prefix: str) -> None:
    """Delete the keys under ``prefix:`` (only those)."""
    import coredis

    async with coredis.Redis.from_url(url) as client:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for at in range(0, len(keys), 500):
            await client.unlink(keys[at : at + 500])


async def throughput(store: Store, events: int, sessions: int, handled: bool) -> float:
    done = trio.Event()
    count = 0

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        nonlocal count
        count += 1
        if count == events:
            done.set()

    server = a2trio.Server(bench, store=store, handlers={"tick": tick})
    kind = "tick" if handled else "plain"
    prefix = secrets.token_hex(3)
    per_session = events // sessions
    async with server:
        started = time.perf_counter()

        async def writer(sid: str) -> None:
            session = server.session(sid)
            for n in range(per_session):
                await session.append(bench.event(kind, Tick(n)))

        async with trio.open_nursery() as nursery:
            for s in range(sessions):
                nursery.start_soon(writer, f"{prefix}-{s}")
        if handled:
            await done.wait()
        elapsed = time.perf_counter() - started
        await server.settle()
    return per_session * sessions / elapsed


class Starts:
    """A handler that notes when it starts, and the loop that times appends
    to those starts."""

    def __init__(self) -> None:
        self._at = 0.0
        self._ran = trio.Event()

    async def tick(self, ctx: a2trio.HandlerContext[Tick]) -> None:
        self._at = time.perf_counter()
        self._ran.set()

    async def time(self, session: a2trio.Session, samples: int) -> tuple[float, float]:
        """p50 and p99 (ms) of append -> handler start, sequential events."""
        gaps = []
        for n in range(-WARM_UP, samples):
            self._ran = trio.Event()
            before = time.perf_counter()
            await session.append(bench.event("tick", Tick(n)))
            await self._ran.wait()
            if n >= 0:
                gaps.append((self._at - before) * 1000)
        return percentiles(gaps)


def percentiles(gaps: list[float]) -> tuple[float, float]:
    gaps = sorted(gaps)
    return statistics.median(gaps), gaps[int(len(gaps) * 0.99) - 1]


async def latency(store: Store, samples: int) -> tuple[float, float]:
    starts = Starts()
    server = a2trio.Server(bench, store=store, handlers={"tick": starts.tick})
    async with server:
        result = await starts.time(server.session(f"lat-{secrets.token_hex(3)}"), samples)
        await server.settle()
    return result


async def remote_latency(
    api_store: Store, worker_store: Store, samples: int
) -> tuple[float, float]:
    """Append in one "process" (``run_handlers=False``) -> handler start in another
    (a second store instance, woken by its listener)."""
    starts = Starts()
    handlers = {"tick": starts.tick}
    api = a2trio.Server(bench, store=api_store, handlers=handlers, run_handlers=False)
    worker = a2trio.Server(bench, store=worker_store, handlers=handlers)
    async with api, worker:
        wait_listening = getattr(worker_store, "wait_listening", None)
        if wait_listening is not None:
            await wait_listening()
        result = await starts.time(api.session(f"remote-{secrets.token_hex(3)}"), samples)
        await worker.settle()
    return result


async def feed_latency(writer: Store, reader: Store, samples: int) -> tuple[float, float]:
    """Append through ``writer`` -> delivery on a live feed read from ``reader``
    (the same store, or another instance: another process's view)."""
    appender = a2trio.Server(bench, store=writer)
    follower = appender if reader is writer else a2trio.Server(bench, store=reader)
    gaps = []
    sid = f"feed-{secrets.token_hex(3)}"
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(appender)
        if follower is not appender:
            await stack.enter_async_context(follower)
        feed = await stack.enter_async_context(follower.session(sid).stream())
        for n in range(-WARM_UP, samples):
            before = time.perf_counter()
            await appender.session(sid).append(bench.event("plain", Tick(n)))
            await feed.receive()
            if n >= 0:
                gaps.append((time.perf_counter() - before) * 1000)
    return percentiles(gaps)


def postgres_floor(dsn: str, transactions: int, notifies: int) -> tuple[float, float]:
    """The raw floor over plain psycopg: single-row insert transactions per
    second, and the NOTIFY -> LISTEN round trip p50 in ms."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create table if not exists floor_rows (id bigint, body text)")
        started = time.perf_counter()
        for n in range(transactions):
            conn.execute("insert into floor_rows values (%s, %s)", (n, "x"))
        rate = transactions / (time.perf_counter() - started)
    gaps = []
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as sender,
    ):
        listener.execute("listen floor")
        for _ in range(notifies):
            before = time.perf_counter()
            sender.execute("notify floor")
            next(iter(listener.notifies(timeout=5)))
            gaps.append((time.perf_counter() - before) * 1000)
    return rate, statistics.median(gaps)


async def measure(name: str, args: argparse.Namespace) -> dict[str, str]:
    row: dict[str, str] = {}
    async with open_backend(name, args.dsn, args.redis_url) as (store, target):
        row["appends/s (no handler, 1 session)"] = (
            f"{await throughput(store, args.events, 1, handled=False):,.0f}"
        )
        row["appended+handled/s, 1 session"] = (
            f"{await throughput(store, args.events, 1, handled=True):,.0f}"
        )
        row[f"appended+handled/s, {args.sessions} sessions"] = (
            f"{await throughput(store, args.events, args.sessions, handled=True):,.0f}"
        )
        p50, p99 = await latency(store, args.latency)
        row["append -> handler start p50 (ms)"] = f"{p50:.3f}"
        row["append -> handler start p99 (ms)"] = f"{p99:.3f}"
        p50, p99 = await feed_latency(store, store, args.latency)
        row["append -> live feed p50 (ms)"] = f"{p50:.3f}"
        row["append -> live feed p99 (ms)"] = f"{p99:.3f}"
        polled = "n/a", "n/a"
        floor = "n/a", "n/a"
        remote = "n/a", "n/a"
        remote_feed = "n/a", "n/a"
        if name == "redis" and target is not None:
            # A second store instance on the prefix: another process's view.
            for kind in ("handler", "feed"):
                other = a2trio.stores.redis(args.redis_url, key_prefix=target)
                try:
                    if kind == "handler":
                        p50, p99 = await remote_latency(store, other, args.latency)
                        remote = f"{p50:.3f}", f"{p99:.3f}"
                    else:
                        p50, p99 = await feed_latency(store, other, args.latency)
                        remote_feed = f"{p50:.3f}", f"{p99:.3f}"
                finally:
                    await other.aclose()
        elif target is not None:
            worker_store = a2trio.stores.postgres(target)
            try:
                p50, p99 = await remote_latency(store, worker_store, args.latency)
            finally:
                await worker_store.aclose()
            remote = f"{p50:.3f}", f"{p99:.3f}"
            polling = a2trio.stores.postgres(target, listen=False)
            try:
                p50, p99 = await feed_latency(store, polling, args.latency)
            finally:
                await polling.aclose()
            polled = f"{p50:.3f}", f"{p99:.3f}"
            rate, notify = await trio.to_thread.run_sync(
                postgres_floor, target, args.events, args.latency
            )
            floor = f"{rate:,.0f}", f"{notify:.3f}"
        row["append -> handler start, other process p50 (ms)"] = remote[0]
        row["append -> handler start, other process p99 (ms)"] = remote[1]
        row["append -> live feed, other process p50 (ms)"] = remote_feed[0]
        row["append -> live feed, other process p99 (ms)"] = remote_feed[1]
        row["append -> live feed, polling p50 (ms)"] = polled[0]
        row["append -> live feed, polling p99 (ms)"] = polled[1]
        row["floor: bare insert transactions/s"] = floor[0]
        row["floor: bare NOTIFY round trip p50 (ms)"] = floor[1]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", default="memory", help="comma-separated: memory,sqlite,postgres,redis"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--versions", action="store_true", help="print versions and exit")
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=0,
        metavar="N",
        help="apply a2trio.tune_gc(N) first, as `python -m a2trio.serve` does",
    )
    args = parser.parse_args(argv)
    if args.gc_threshold:
        tune_gc(args.gc_threshold)
    versions = (
        f"python {sys.version.split()[0]}, trio {trio.__version__}, msgspec {msgspec.__version__}"
    )
    if args.versions:
        print(versions)
        return
    names = [name.strip() for name in args.store.split(",") if name.strip()]
    results: dict[str, dict[str, str]] = {}
    for name in names:
        results[name] = trio.run(measure, name, args)
    metrics: list[str] = list(next(iter(results.values())))
    width = max(len(m) for m in metrics)
    print(f"# bench/drain.py: {args.events} events; {versions}; gc thresholds {gc.get_threshold()}")
    print("| " + "metric".ljust(width) + " | " + " | ".join(n.rjust(10) for n in names) + " |")
    print("|" + "-" * (width + 2) + "|" + "|".join("-" * 12 for _ in names) + "|")
    for metric in metrics:
        cells = " | ".join(results[n][metric].rjust(10) for n in names)
        print(f"| {metric.ljust(width)} | {cells} |")


if __name__ == "__main__":
    main()
