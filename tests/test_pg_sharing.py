"""Stores with matching settings share one pool and one listener (issue 23).

Connections are counted on the server (``pg_stat_activity``), filtered by an
``application_name`` of the test's own, so concurrent test runs never disturb
the count: the LISTEN connection is the backend whose last query was a
``listen``/``unlisten``, the pool's are the others.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from psycopg.conninfo import make_conninfo

from a2trio.stores.base import AppendEvent
from a2trio.stores.postgres import postgres
from a2trio.stores.postgres.conn import PgConnection, PgPool
from a2trio.timings import Timings

from .backends.postgres import database_dsn, run_sql
from .backends.throwaway_pg import throwaway_postgres

pytestmark = pytest.mark.filterwarnings("error")

# Feeds must follow notifications here, not the safety re-read.
NO_SAFETY = Timings(notify_safety_s=3600.0, poll_idle_s=3600.0)


@asynccontextmanager
async def _tagged(*schemas: str) -> AsyncIterator[tuple[str, str]]:
    """(a dsn whose backends carry a fresh application_name, that name);
    the schemas are dropped on exit."""
    dsn = await database_dsn()
    app = f"a2s_{secrets.token_hex(4)}"
    try:
        yield make_conninfo(dsn, application_name=app), app
    finally:
        for schema in schemas:
            await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


async def _backends(app: str) -> tuple[int, int, list[int]]:
    """(pool connections, LISTEN connections, the LISTEN backends' pids)."""
    rows = await run_sql(
        await database_dsn(),
        "select pid, query ~ '^(un)?listen ' from pg_stat_activity"
        f" where application_name = '{app}'",
    )
    listeners = [int(pid) for pid, listening in rows if listening]  # type: ignore[call-overload]
    return len(rows) - len(listeners), len(listeners), listeners


async def _until(app: str, pool: int | None, listen: int) -> None:
    """Wait until the server shows these counts (a closed socket's backend
    leaves pg_stat_activity a moment after the client closed it); ``None``:
    any number of pool connections (a feed cancelled mid-read closes its
    connection instead of returning it)."""
    with trio.fail_after(10):
        while True:
            found, listening, _ = await _backends(app)
            if listening == listen and pool in (None, found):
                return
            await trio.sleep(0.02)


def _schema() -> str:
    return f"sh_{secrets.token_hex(5)}"


async def test_two_stores_on_one_dsn_share_one_pool_and_one_listener() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, app):
        # One connection each: shared, the two never hold more than one.
        a = postgres(dsn, schema=schema, timings=NO_SAFETY, max_connections=1)
        b = postgres(dsn, schema=schema, timings=NO_SAFETY, max_connections=1)
        async with a, b:
            # One after the other: the second borrows the first's idle connection.
            await a.read("s")
            await b.read("s")
            assert (await _backends(app))[:2] == (1, 0)
            async with a.stream("s") as feed_a, b.stream("s") as feed_b:
                with trio.fail_after(10):
                    await a.wait_listening()
                    await b.wait_listening()
                assert (await _backends(app))[:2] == (1, 1)
                await a.append("s", [AppendEvent("note", {}, id="e1")])
                with trio.fail_after(10):
                    # b heard a's notification on the shared connection.
                    assert (await feed_b.receive()).id == "e1"
                    assert (await feed_a.receive()).id == "e1"
                assert b.listener_statistics().notifications == 1
            # A presence subscriber counts too; unsubscribing twice counts once.
            unsubscribe = b.presence.subscribe("room", lambda patch: None)
            unsubscribe()
            unsubscribe()
            # The listener closes when its last subscriber leaves...
            await _until(app, None, 0)
            assert not a.listening
            assert not b.listening
            # ... and reopens on demand.
            async with b.stream("s", start_after=1) as feed:
                with trio.fail_after(10):
                    await b.wait_listening()
                await _until(app, None, 1)
                # Held by the feed, not by wait_listening's own subscription.
                await trio.sleep(0.2)
                assert (await _backends(app))[1] == 1
                await a.append("s", [AppendEvent("note", {}, id="e2")])
                with trio.fail_after(10):
                    assert (await feed.receive()).id == "e2"
        # The last store out closed the pool and the listener.
        await _until(app, 0, 0)
        await a.aclose()
        await b.aclose()


async def test_the_listener_outlives_the_store_that_opened_it() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, app):
        first = postgres(dsn, schema=schema, timings=NO_SAFETY)
        second = postgres(dsn, schema=schema, timings=NO_SAFETY)
        writer = postgres(await database_dsn(), schema=schema, listen=False)
        async with second, second.stream("s") as feed:
            async with first, first.stream("s"):
                with trio.fail_after(10):
                    await first.wait_listening()
                    await second.wait_listening()
                [opened_by_first] = (await _backends(app))[2]
            # `first` left entirely (its nursery is gone): the connection it
            # opened still serves `second`, neither closed nor reconnected.
            assert (await _backends(app))[1:] == (1, [opened_by_first])
            assert second.listening
            await writer.append("s", [AppendEvent("note", {}, id="e1")])
            with trio.fail_after(10):
                assert (await feed.receive()).id == "e1"
            assert second.listener_statistics().notifications == 1
        await _until(app, 0, 0)
        for store in (first, second, writer):
            await store.aclose()


async def test_stores_in_other_schemas_share_the_listener_not_the_pool() -> None:
    one, two = _schema(), _schema()
    async with _tagged(one, two) as (dsn, app):
        a = postgres(dsn, schema=one, timings=NO_SAFETY, max_connections=1)
        b = postgres(dsn, schema=two, timings=NO_SAFETY, max_connections=1)
        writer = postgres(await database_dsn(), schema=one, listen=False)
        async with a, b, a.stream("s") as feed:
            async with b.stream("s"):
                with trio.fail_after(10):
                    await a.wait_listening()
                    await b.wait_listening()
                # The pools differ (each sets its schema's search_path), the
                # LISTEN connection hears both schemas' channels.
                assert (await _backends(app))[:2] == (2, 1)
                await writer.append("s", [AppendEvent("note", {}, id="e1")])
                with trio.fail_after(10):
                    assert (await feed.receive()).id == "e1"
            # b left: its channels are unlistened, a's still heard.
            with trio.fail_after(10):
                while True:
                    [(query,)] = await run_sql(
                        await database_dsn(),
                        "select query from pg_stat_activity"
                        f" where application_name = '{app}' and query ~ '^(un)?listen '",
                    )
                    if str(query).startswith("unlisten"):
                        break
                    await trio.sleep(0.02)
            assert str(query) == f'unlisten "{two}.a2_events"; unlisten "{two}.a2_presence";'
            await writer.append("s", [AppendEvent("note", {}, id="e2")])
            with trio.fail_after(10):
                assert (await feed.receive()).id == "e2"
            assert a.listener_statistics().notifications == 2
            assert b.listener_statistics().notifications == 0
        for store in (a, b, writer):
            await store.aclose()


async def test_an_injected_pool_is_shared_by_identity_and_never_closed() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, app):
        await run_sql(dsn, f'create schema "{schema}"')
        pool = PgPool(make_conninfo(dsn, options=f"-csearch_path={schema}"))
        other = PgPool(make_conninfo(dsn, options=f"-csearch_path={schema}"))
        a, b, c = postgres(pool), postgres(pool), postgres(other)
        try:
            await a.append("s", [AppendEvent("note", {}, id="e1")])
            assert [e.id for e in await b.read("s")] == ["e1"]
            assert (await _backends(app))[:2] == (1, 0)
            # An equal but distinct pool is not the same pool.
            await c.read("s")
            assert (await _backends(app))[:2] == (2, 0)
            for store in (a, b, c):
                await store.aclose()
            # Both are the caller's: still open, their connections kept.
            assert (pool.size, other.size) == (1, 1)
            async with pool.connection():
                pass
        finally:
            pool.close()
            other.close()
        await _until(app, 0, 0)


async def test_the_schema_is_created_once_per_revision_per_pool() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, _):
        first = postgres(dsn, schema=schema)
        second = postgres(dsn, schema=schema)
        third = postgres(dsn, schema=schema)
        polling = postgres(dsn, schema=schema, listen=False)
        holder = await PgConnection.connect(await database_dsn(), timeout_s=5, prepare=False)
        try:
            async with first, second, third, polling:
                # At once: one runs the DDL, the other waits for its answer.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first.read, "s")
                    nursery.start_soon(second.read, "s")
                # Schema creation waits on this lock: `third` never takes it,
                # its revision already ran on the shared pool...
                await holder.script(
                    b"begin; select pg_advisory_xact_lock(hashtext('a2:postgres:schema'))"
                )
                with trio.fail_after(10):
                    await third.read("s")
                # ... while another revision (no triggers) runs its own DDL.
                with trio.move_on_after(0.3) as waited:
                    await polling.read("s")
                assert waited.cancelled_caught
                await holder.script(b"commit")
                with trio.fail_after(10):
                    await polling.read("s")
        finally:
            holder.close()
            for store in (first, second, third, polling):
                await store.aclose()


async def test_each_trio_run_has_its_own_pools() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, app):
        await postgres(dsn, schema=schema, listen=False).read("s")

        def other_run() -> int:
            async def use() -> int:
                store = postgres(dsn, schema=schema, listen=False)
                await store.read("s")
                try:
                    return (await _backends(app))[0]
                finally:
                    await store.aclose()

            return trio.run(use)

        # This run's store holds its pool (never closed): the other run opens
        # its own, and closes it.
        assert await trio.to_thread.run_sync(other_run) == 2
        await _until(app, 1, 0)


async def test_a_subscription_made_while_the_database_is_down_listens_once_it_is_back() -> None:
    async with throwaway_postgres() as server:
        store = postgres(server.dsn, connect_timeout_s=1.0)
        await server.stop()
        try:
            async with store:
                unsubscribe = store.presence.subscribe("room", lambda patch: None)
                # Creating the schema (for its channel names) fails, and is retried.
                await trio.sleep(0.3)
                assert not store.listening
                await server.start()
                with trio.fail_after(20):
                    await store.wait_listening()
                unsubscribe()
        finally:
            await store.aclose()


async def test_the_shared_pool_bounds_both_stores_together() -> None:
    schema = _schema()
    async with _tagged(schema) as (dsn, app):
        # Outside `async with`, each append is its own transaction and holds
        # its connection while it waits for the session's lock.
        a = postgres(dsn, schema=schema, listen=False, max_connections=2)
        b = postgres(dsn, schema=schema, listen=False, max_connections=2)
        await a.read("s")
        holder = await PgConnection.connect(await database_dsn(), timeout_s=5, prepare=False)
        try:
            await holder.script(b"begin; select pg_advisory_xact_lock(hashtext('s'))")
            async with trio.open_nursery() as nursery:
                for store, n in [(a, 0), (a, 1), (a, 2), (b, 3), (b, 4), (b, 5)]:
                    nursery.start_soon(store.append, "s", [AppendEvent("note", {}, id=f"e{n}")])
                await _until(app, 2, 0)
                # Given time to open more, neither store does: 2 in all, not 2 each.
                await trio.sleep(0.3)
                assert (await _backends(app))[:2] == (2, 0)
                await holder.script(b"commit")
            assert len(await b.read("s")) == 6
        finally:
            holder.close()
            await a.aclose()
            await b.aclose()
