"""The listener's own DSN, transaction-mode poolers and the schema lock (issue 23).

``postgres(dsn, listen_dsn=...)`` puts the one LISTEN connection on
``listen_dsn`` (a direct connection beside a pooled ``dsn``) and every query on
``dsn``; ``pooler="transaction"`` turns prepared statements off by default.
Schema creation takes the seed's advisory lock key,
``hashtext('a2:postgres:schema')``, so TypeScript and Python processes sharing
a database serialize their DDL.

Every test runs against a real server (see ``tests/backends/postgres.py``). The
two DSNs point at the same server; ``application_name`` tells their backends
apart in ``pg_stat_activity``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from psycopg.conninfo import make_conninfo

import a2trio
from a2trio.stores.base import AppendEvent, StoredPresencePatch
from a2trio.stores.postgres import PostgresStore, postgres
from a2trio.stores.postgres.conn import PgConnection, PgError, PgPool, Statement
from a2trio.timings import Timings

from .apps import Ordered, Shipped, orders
from .backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")

# Feeds must follow notifications here, not the safety re-read.
NO_SAFETY = Timings(notify_safety_s=3600.0, poll_idle_s=3600.0)
PREPARED = Statement("select count(*) from pg_prepared_statements")


@asynccontextmanager
async def _dsns() -> AsyncIterator[tuple[str, str, str, str, str]]:
    """(query dsn, listen dsn, their application names, a fresh schema name);
    the schema is dropped on exit."""
    dsn = await database_dsn()
    tag = secrets.token_hex(4)
    schema = f"l_{tag}"
    query_app, listen_app = f"a2q_{tag}", f"a2l_{tag}"
    try:
        yield (
            make_conninfo(dsn, application_name=query_app),
            make_conninfo(dsn, application_name=listen_app),
            query_app,
            listen_app,
            schema,
        )
    finally:
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


async def _backends(application_name: str) -> list[tuple[object, ...]]:
    """(query, wait_event_type, wait_event) of every backend with that name."""
    return await run_sql(
        await database_dsn(),
        "select query, wait_event_type, wait_event from pg_stat_activity"
        f" where application_name = '{application_name}'",
    )


async def test_the_listener_connects_to_listen_dsn_and_queries_never_listen() -> None:
    async with _dsns() as (dsn, listen_dsn, query_app, listen_app, schema):
        reader = postgres(dsn, listen_dsn=listen_dsn, schema=schema, timings=NO_SAFETY)
        writer = postgres(await database_dsn(), schema=schema, listen=False)
        async with reader, writer, reader.stream("s") as feed:
            await reader.wait_listening()
            await writer.append("s", [AppendEvent("note", {}, id="e1")])
            with trio.fail_after(10):
                # No safety re-read for an hour: only a notification delivers it.
                assert (await feed.receive()).id == "e1"
            assert reader.listener_statistics().notifications == 1
            [(listener_query, _, _)] = await _backends(listen_app)
            queries = await _backends(query_app)
        await reader.aclose()
        await writer.aclose()
    assert str(listener_query).startswith("listen ")
    assert queries, "the store's queries ran on `dsn`"
    assert not [q for q, _, _ in queries if "listen" in str(q).lower()]


async def test_a_worker_with_listen_dsn_drains_what_another_process_appended() -> None:
    async with _dsns() as (dsn, listen_dsn, _, _, schema):
        handled = trio.Event()

        async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
            handled.set()
            return orders.event("shipped", Shipped(ctx.event.payload.item))

        api_store = postgres(dsn, schema=schema, listen=False)
        worker_store = postgres(dsn, listen_dsn=listen_dsn, schema=schema)
        api = a2trio.Server(orders, store=api_store, handlers={"ordered": ship}, run_handlers=False)
        worker = a2trio.Server(orders, store=worker_store, handlers={"ordered": ship})
        async with api, worker:
            await worker_store.wait_listening()
            await api.session("o1").append(orders.event("ordered", Ordered("book")))
            with trio.fail_after(10):
                await handled.wait()
                await worker.settle()
            history = await api.session("o1").history()
        await api_store.aclose()
        await worker_store.aclose()
    assert [e.type for e in history] == ["ordered", "shipped"]


async def test_presence_is_pushed_through_the_listen_dsn() -> None:
    async with _dsns() as (dsn, listen_dsn, _, _, schema):
        reader = postgres(dsn, listen_dsn=listen_dsn, schema=schema)
        writer = postgres(dsn, schema=schema, listen=False)
        patches: list[StoredPresencePatch] = []
        heard = trio.Event()

        def on_patch(patch: StoredPresencePatch) -> None:
            patches.append(patch)
            heard.set()

        async with reader, writer:
            unsubscribe = reader.presence.subscribe("room", on_patch)
            await reader.wait_listening()
            await writer.presence.set(
                "room", "ann", {"typing": True}, seen=1, at_ms=5, ttl_ms=60_000
            )
            with trio.fail_after(10):
                await heard.wait()
            unsubscribe()
        await reader.aclose()
        await writer.aclose()
    assert patches == [StoredPresencePatch("ann", {"typing": True}, 1, 5)]


async def _prepared_count(store: PostgresStore) -> int:
    await store.append("s", [AppendEvent("note", {})])
    [(count,)] = await store._db.query(PREPARED, ())
    return int(count)


async def test_a_transaction_mode_pooler_turns_prepared_statements_off() -> None:
    async with _dsns() as (dsn, listen_dsn, _, _, schema):
        pooled = postgres(dsn, listen_dsn=listen_dsn, pooler="transaction", schema=schema)
        default = postgres(dsn, schema=schema)
        explicit = postgres(
            dsn, listen_dsn=listen_dsn, pooler="transaction", prepare=True, schema=schema
        )
        try:
            assert await _prepared_count(pooled) == 0
            assert await _prepared_count(default) > 0
            assert await _prepared_count(explicit) > 0
        finally:
            for store in (pooled, default, explicit):
                await store.aclose()


def test_pooler_and_listen_dsn_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="LISTEN does not work through a transaction-mode"):
        postgres("postgresql://x@db/app", pooler="transaction")
    with pytest.raises(ValueError, match="`pooler` must be None or 'transaction'"):
        postgres("postgresql://x@db/app", pooler="session")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`listen_dsn` is only used with `listen=True`"):
        postgres("postgresql://x@db/app", listen=False, listen_dsn="postgresql://x@direct/app")
    # Polling behind the pooler needs no direct connection.
    postgres("postgresql://x@db/app", pooler="transaction", listen=False)


async def test_schema_creation_waits_for_the_seeds_schema_lock() -> None:
    # A TypeScript process creating the schema holds this exact lock
    # (store-postgres.ts `initializeSchema`) until its DDL commits.
    async with _dsns() as (dsn, _, query_app, _, schema):
        holder = await PgConnection.connect(await database_dsn(), timeout_s=5, prepare=False)
        store = postgres(dsn, schema=schema, listen=False)
        created = trio.Event()

        async def first_operation() -> None:
            await store.read("s")
            created.set()

        try:
            await holder.script(
                b"begin; select pg_advisory_xact_lock(hashtext('a2:postgres:schema'))"
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first_operation)
                with trio.fail_after(10):
                    while True:
                        waiting = [
                            query
                            for query, kind, event in await _backends(query_app)
                            if (kind, event) == ("Lock", "advisory")
                        ]
                        if waiting:
                            break
                        await trio.sleep(0.01)
                [query] = waiting
                assert "pg_advisory_xact_lock(hashtext('a2:postgres:schema'))" in str(query)
                assert not created.is_set()
                assert (
                    await run_sql(
                        await database_dsn(),
                        f"select 1 from pg_namespace where nspname = '{schema}'",
                    )
                    == []
                )
                await holder.script(b"commit")
                with trio.fail_after(10):
                    await created.wait()
            assert await run_sql(
                await database_dsn(), f"select 1 from pg_namespace where nspname = '{schema}'"
            ) == [(1,)]
        finally:
            holder.close()
            await store.aclose()


SETTINGS = Statement("select current_setting('search_path'), current_setting('plan_cache_mode')")


async def test_a_transaction_mode_pooler_gets_the_schema_in_every_transaction() -> None:
    async with _dsns() as (dsn, listen_dsn, _, _, schema):
        store = postgres(dsn, listen_dsn=listen_dsn, pooler="transaction", schema=schema)
        try:
            await store.append("s", [AppendEvent("note", {})])
            assert len(await store.read("s")) == 1
            assert await store._db.query(SETTINGS, ()) == [(f'"{schema}"', "force_generic_plan")]
            # After a `begin`, as in every store transaction:
            [settings] = await store._db.transaction([(SETTINGS, ())], lock="s")
        finally:
            await store.aclose()
        # No startup options (a pooler refuses them): the session is untouched.
        assert "options" not in store.dsn
        assert await run_sql(store.dsn, "show plan_cache_mode") == [("auto",)]
        assert await run_sql(dsn, f'select count(*) from "{schema}".a2_events') == [(1,)]
    assert settings == [(f'"{schema}"', "force_generic_plan")]


async def test_the_preamble_is_not_run_in_a_failed_transaction() -> None:
    # The rollback after a server error runs in the failed transaction, where
    # any other statement would fail too.
    dsn = await database_dsn()
    pool = PgPool(dsn, max_size=1, preamble=(SETTINGS, ()))
    try:
        with pytest.raises(PgError):
            async with pool.connection() as conn:
                await conn.run([(Statement("begin"), ()), (Statement("select 1/0"), ())])
        assert pool.size == 1  # rolled back and pooled
        async with pool.connection() as conn:
            assert await conn.run([(Statement("select 1"), ())]) == [[(1,)]]
    finally:
        pool.close()
