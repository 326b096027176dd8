"""An operator's redrive and retry-now from another process wake the worker at
once (issue 18), on the stores with cross-process wake-up (Postgres NOTIFY,
Redis pub/sub).

Two store instances on one schema (or key prefix) stand for two processes:
the worker runs the handlers with no sweep (so only the wake-up can start
them), the operator opens only its store, as ``python -m a2trio.inspect`` does.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import a2trio
from a2trio.stores.postgres import PostgresStore
from a2trio.stores.redis import RedisStore

from .apps import Ordered, orders
from .backends import redis as redis_backend
from .backends.postgres import database_dsn, run_sql

Listening = PostgresStore | RedisStore


@asynccontextmanager
async def _two_stores(backend: str) -> AsyncIterator[tuple[Listening, Listening]]:
    if backend == "postgres":
        dsn = await database_dsn()
        schema = f"s_{secrets.token_hex(6)}"
        try:
            yield (
                a2trio.stores.postgres(dsn, schema=schema),
                a2trio.stores.postgres(dsn, schema=schema),
            )
        finally:
            await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
        return
    await redis_backend.reachable()
    prefix = redis_backend.new_prefix()
    url = redis_backend.REDIS_URL
    try:
        yield (
            a2trio.stores.redis(url, key_prefix=prefix),
            a2trio.stores.redis(url, key_prefix=prefix),
        )
    finally:
        await redis_backend.delete_prefix(prefix)


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_an_operator_process_wakes_the_worker(backend: str) -> None:
    ran: list[tuple[str, int]] = []
    changed = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        nonlocal changed
        ran.append((ctx.event.session_id, ctx.attempt))
        changed.set()
        changed = trio.Event()
        if ctx.attempt == 1:
            raise RuntimeError("the gateway timed out")

    async def ran_for(session_id: str, attempt: int) -> None:
        # A hang guard (the sweep is off: only the wake-up can start it).
        with trio.fail_after(60):
            while (session_id, attempt) not in ran:
                await changed.wait()

    async with _two_stores(backend) as (worker_store, operator_store):
        worker = a2trio.Server(
            orders,
            store=worker_store,
            handlers={"ordered": ship},
            timings=a2trio.Timings(max_failures=1),
            sweep=False,
        )
        patient = a2trio.Server(
            orders,
            store=worker_store,
            handlers={"ordered": ship},
            timings=a2trio.Timings(max_failures=10),
            sweep=False,
        )
        operator = a2trio.Server(orders, store=operator_store, handlers={"ordered": ship})
        async with worker:
            await worker_store.wait_listening()
            await worker.session("dead").append(orders.event("ordered", Ordered("a")))
            await worker.settle()
            assert ran == [("dead", 1)]
            async with operator_store:
                await operator.inspect.redrive("dead", 1, by="ops", reason="gateway back")
            await ran_for("dead", 2)
            await worker.settle()
        async with patient:
            await worker_store.wait_listening()
            await patient.session("failed").append(orders.event("ordered", Ordered("b")))
            await patient.settle()
            [failed] = (await patient.inspect.read_session_page("failed")).events
            assert (failed.status.state, failed.status.failures) == ("failed", 1)
            async with operator_store:
                [action] = await operator.inspect.retry_now("failed", by="ops")
            assert (action.action, action.index) == ("retry_now", 1)
            await ran_for("failed", 2)
            await patient.settle()
            [done] = (await patient.inspect.read_session_page("failed")).events
            assert done.status.state == "processed"
