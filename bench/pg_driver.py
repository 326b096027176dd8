"""Driving Postgres from Trio: latency, throughput and client CPU per bridge.

Usage::

    .venv/bin/python bench/pg_driver.py [--dsn URL] [--seconds 1.5] [--versions]

Prints one table. Rows:

* ``native pipeline``: a2trio's driver (``a2trio/stores/postgres/conn.py``), libpq
  through psycopg's public ``pq`` module with Trio socket waits; a small
  transaction is one pipelined round trip (``begin; insert; commit``).
* ``native 3 round trips``: the same driver, one round trip per statement
  (what psycopg does without a pipeline), to separate the bridge from the
  pipelining.
* ``threads``: psycopg's sync ``ConnectionPool`` through ``trio.to_thread``.
* ``trio-asyncio``: psycopg's ``AsyncConnectionPool`` on an asyncio loop
  inside Trio, one bridged call per unit of work.
* ``store.append``: ``PostgresStore.append`` of one event (begin, session
  lock, the append statement, commit: one round trip), on the native driver.

Columns: ``select 1`` latency from one task (p50/p99 µs); small transactions
per second from 1 and 8 concurrent tasks over a pool of 4; client CPU per
transaction at 8 tasks (process CPU time / transactions, so the server's CPU
is excluded). Sessions use ``synchronous_commit=off`` so the disk does not
hide the client. The machine is shared: read the ranking, not the digits.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

# trio_asyncio first: psycopg's pool misbehaves if imported before trio_asyncio
# installs its asyncio loop policy (notes/postgres-on-trio.md).
import trio_asyncio

# isort: split
import psycopg
import psycopg_pool
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from a2trio.stores.base import AppendEvent
from a2trio.stores.postgres import postgres
from a2trio.stores.postgres.conn import PgPool, Statement

POOL = 4
Op = Callable[[], Awaitable[None]]


async def _latency(op: Op, n: int = 400) -> tuple[float, float]:
    for _ in range(50):
        await op()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await op()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


async def _throughput(op: Op, tasks: int, seconds: float) -> tuple[float, float]:
    done = 0
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        nonlocal done
        while trio.current_time() < deadline:
            await op()
            done += 1

    cpu = time.process_time()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    elapsed = trio.current_time() - start
    return done / elapsed, (time.process_time() - cpu) / done * 1e6


def _row(name: str, lat: tuple[float, float], one: float, eight: tuple[float, float]) -> str:
    return f"| {name} | {lat[0]:.0f} / {lat[1]:.0f} | {one:.0f} / {eight[0]:.0f} | {eight[1]:.0f} |"


async def _measure(name: str, select: Op, tx: Op, seconds: float) -> str:
    lat = await _latency(select)
    one, _ = await _throughput(tx, 1, seconds)
    eight = await _throughput(tx, 8, seconds)
    return _row(name, lat, one, eight)


async def bench_native(conninfo: str, table: str, seconds: float) -> list[str]:
    pool = PgPool(conninfo, max_size=POOL)
    select1 = Statement("select 1")
    begin, commit = Statement("begin"), Statement("commit")
    insert = Statement(f"insert into {table} (v) values ($1::int)")

    async def select() -> None:
        async with pool.connection() as conn:
            await conn.run([(select1, ())])

    async def pipelined() -> None:
        async with pool.connection() as conn:
            await conn.run([(begin, ()), (insert, (1,)), (commit, ())])

    async def three_trips() -> None:
        async with pool.connection() as conn:
            await conn.run([(begin, ())])
            await conn.run([(insert, (1,))])
            await conn.run([(commit, ())])

    try:
        return [
            await _measure("native pipeline", select, pipelined, seconds),
            await _measure("native 3 round trips", select, three_trips, seconds),
        ]
    finally:
        pool.close()


async def bench_threads(conninfo: str, table: str, seconds: float) -> str:
    pool = psycopg_pool.ConnectionPool(conninfo, min_size=POOL, max_size=POOL, open=False)
    await trio.to_thread.run_sync(pool.open, True)
    limiter = trio.CapacityLimiter(8)

    def select_sync() -> None:
        with pool.connection() as conn:
            conn.execute("select 1").fetchall()

    def tx_sync() -> None:
        with pool.connection() as conn, conn.transaction():
            conn.execute(f"insert into {table} (v) values (%s)", (1,))

    async def select() -> None:
        await trio.to_thread.run_sync(select_sync, limiter=limiter)

    async def tx() -> None:
        await trio.to_thread.run_sync(tx_sync, limiter=limiter)

    try:
        return await _measure("threads", select, tx, seconds)
    finally:
        await trio.to_thread.run_sync(pool.close)


async def bench_trio_asyncio(conninfo: str, table: str, seconds: float) -> str:
    async with trio_asyncio.open_loop():
        pool = psycopg_pool.AsyncConnectionPool(conninfo, min_size=POOL, max_size=POOL, open=False)
        await trio_asyncio.aio_as_trio(pool.open)(wait=True)

        async def select_aio() -> None:
            async with pool.connection() as conn:
                await (await conn.execute("select 1")).fetchall()

        async def tx_aio() -> None:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(f"insert into {table} (v) values (%s)", (1,))

        select = trio_asyncio.aio_as_trio(select_aio)
        tx = trio_asyncio.aio_as_trio(tx_aio)
        try:
            return await _measure("trio-asyncio", select, tx, seconds)
        finally:
            await trio_asyncio.aio_as_trio(pool.close)()


async def bench_store(dsn: str, schema: str, seconds: float) -> str:
    store = postgres(dsn, schema=schema, max_connections=POOL)
    counter = 0

    async def append() -> None:
        nonlocal counter
        counter += 1
        await store.append(f"s{counter % 100}", [AppendEvent("e", {"n": counter}, settled=True)])

    async def read() -> None:
        await store.read("s0", after_index=1 << 40)

    async with store:
        try:
            return await _measure("store.append (1 event)", read, append, seconds)
        finally:
            await store.aclose()


def _admin(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


async def main(dsn: str, seconds: float) -> None:
    conninfo = psycopg.conninfo.make_conninfo(dsn, options="-csynchronous_commit=off")
    schema = f"bench_{secrets.token_hex(4)}"
    table = f"{schema}.t"
    create = f"create schema {schema}; create table {table} (v int)"
    await trio.to_thread.run_sync(_admin, dsn, create)
    try:
        rows = await bench_native(conninfo, table, seconds)
        rows.append(await bench_threads(conninfo, table, seconds))
        rows.append(await bench_trio_asyncio(conninfo, table, seconds))
        store_dsn = psycopg.conninfo.make_conninfo(dsn, options="-csynchronous_commit=off")
        rows.append(await bench_store(store_dsn, schema, seconds))
    finally:
        await trio.to_thread.run_sync(_admin, dsn, f"drop schema {schema} cascade")
    print(
        "| way | `select 1` p50 / p99 µs | small tx/s, 1 / 8 tasks (pool 4) "
        "| client CPU µs per tx (8 tasks) |"
    )
    print("| --- | --- | --- | --- |")
    for row in rows:
        print(row)
    print("(store.append row: latency column is a one-row read, tx is one append)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=1.5, help="per throughput run")
    parser.add_argument("--versions", action="store_true", help="print versions and exit")
    args = parser.parse_args()
    if args.versions:
        print(
            f"python {sys.version.split()[0]}, trio {trio.__version__}, "
            f"psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}), "
            f"psycopg_pool {psycopg_pool.__version__}, trio-asyncio {trio_asyncio.__version__}"
        )
        sys.exit(0)
    trio.run(main, args.dsn, args.seconds)
