"""Presence set -> subscriber latency per tier, side by side in one run.

    python bench/presence.py --store memory,sqlite,postgres,redis

For each store: one server writes presence (``set_presence``) and a two-plane
feed on a second server (a second store instance on the same database, i.e.
another "process" for Postgres) receives the patch; ``--samples`` sequential
sets, p50/p99 in ms. Memory has one instance (in-process push); SQLite is the
degraded tier (re-read on the adaptive cadence); Postgres the push tier
through LISTEN/NOTIFY; Redis the push tier through pub/sub (two store
instances on one key prefix, whose keys are deleted afterwards).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import a2trio
from a2trio.stores.base import Store


class Note(msgspec.Struct, frozen=True):
    text: str


rooms = a2trio.contract("rooms", events={"note": Note}, presence={"typing": bool, "n": int})


@asynccontextmanager
async def open_pair(
    name: str, dsn: str, redis_url: str = "redis://127.0.0.1:6379/0"
) -> AsyncIterator[tuple[Store, Store]]:
    if name == "redis":
        from drain import delete_redis_prefix

        prefix = f"a2bench-{secrets.token_hex(4)}"
        writer = a2trio.stores.redis(redis_url, key_prefix=prefix)
        reader = a2trio.stores.redis(redis_url, key_prefix=prefix)
        try:
            yield writer, reader
        finally:
            await writer.aclose()
            await reader.aclose()
            await delete_redis_prefix(redis_url, prefix)
    elif name == "memory":
        store = a2trio.stores.memory()
        yield store, store
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "presence.db")
            writer, reader = a2trio.stores.sqlite(path), a2trio.stores.sqlite(path)
            try:
                yield writer, reader
            finally:
                await writer.aclose()
                await reader.aclose()
    elif name == "postgres":
        import psycopg
        from psycopg.conninfo import make_conninfo

        database = f"a2trio_bench_{secrets.token_hex(4)}"
        admin = make_conninfo(dsn, dbname="postgres")

        def run(sql: str) -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql)

        await trio.to_thread.run_sync(run, f'create database "{database}"')
        target = make_conninfo(dsn, dbname=database)
        writer, reader = a2trio.stores.postgres(target), a2trio.stores.postgres(target)
        try:
            yield writer, reader
        finally:
            await writer.aclose()
            await reader.aclose()
            await trio.to_thread.run_sync(run, f'drop database "{database}" with (force)')
    else:
        raise SystemExit(f"unknown store {name!r}")


async def measure(name: str, dsn: str, samples: int, redis_url: str) -> tuple[float, float]:
    gaps: list[float] = []
    async with open_pair(name, dsn, redis_url) as (writer_store, reader_store):
        writer = a2trio.Server(rooms, store=writer_store)
        reader = (
            writer if reader_store is writer_store else a2trio.Server(rooms, store=reader_store)
        )
        async with writer:
            async with reader if reader is not writer else _nothing():
                room = f"room-{secrets.token_hex(3)}"
                async with reader.session(room).stream(presence=True) as feed:
                    await feed.receive()  # the snapshot
                    for n in range(samples):
                        before = time.perf_counter()
                        await writer.session(room).set_presence("ann", {"n": n})
                        while True:
                            item = await feed.receive()
                            if isinstance(item, a2trio.PresencePatch) and item.values.get("n") == n:
                                break
                        gaps.append((time.perf_counter() - before) * 1000)
    gaps.sort()
    return statistics.median(gaps), gaps[max(0, int(len(gaps) * 0.99) - 1)]


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="memory,sqlite,postgres")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    names = [n.strip() for n in args.store.split(",") if n.strip()]
    print(f"# bench/presence.py: {args.samples} sequential sets; trio {trio.__version__}")
    print("| store | tier | set -> subscriber p50 (ms) | p99 (ms) |")
    print("| --- | --- | ---: | ---: |")
    tiers = {
        "memory": "push (in-process)",
        "sqlite": "degraded",
        "postgres": "push (NOTIFY)",
        "redis": "push (pub/sub, another store instance)",
    }
    for name in names:
        p50, p99 = trio.run(measure, name, args.dsn, args.samples, args.redis_url)
        print(f"| {name} | {tiers[name]} | {p50:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
