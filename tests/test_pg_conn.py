"""The Trio-native Postgres connection and pool (``a2trio/stores/postgres/conn.py``)
against the real server: parameters, pipelines that fail midway, scripts,
notifications, timeouts, and connections the server kills.

Every wait is on the server's answer or on a socket, under a Trio-clock guard
against hangs; nothing asserts on elapsed time.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

import pytest
import trio
import trio.testing

from a2trio.stores.postgres.conn import PgConnection, PgConnectionError, PgError, PgPool, Statement
from tests.backends.postgres import database_dsn, run_sql

P = ParamSpec("P")
R = TypeVar("R")

SELECT = Statement("select $1::text")
PID = Statement("select pg_backend_pid()")


def guarded(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Fail a test that hangs (the Trio clock here is the real one)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with trio.fail_after(20):
            return await fn(*args, **kwargs)

    return wrapper


@asynccontextmanager
async def pool(**options: bool | int | float) -> AsyncIterator[PgPool]:
    pg = PgPool(await database_dsn(), **options)  # type: ignore[arg-type]
    try:
        yield pg
    finally:
        pg.close()


async def terminate(pid: int) -> None:
    """Kill one backend from another connection (as a server restart would)."""
    dsn = await database_dsn()
    await run_sql(dsn, f"select pg_terminate_backend({pid})")


async def backend_pid(conn: PgConnection) -> int:
    [[(pid,)]] = await conn.run([(PID, ())])
    assert isinstance(pid, int)
    return pid


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "simple"])
@guarded
async def test_parameters_round_trip_in_both_protocols(prepare: bool) -> None:
    booleans = Statement("select $1::bool, $2::bool, $3::int, $4::text is null")
    arrays = Statement("select ($1::text[])[2], array_length($1::text[], 1), $2::bigint[]")
    async with pool(prepare=prepare) as pg, pg.connection() as conn:
        # Twice: the second run reuses the prepared statements.
        for _ in range(2):
            [[row]] = await conn.run([(booleans, (True, False, 7, None))])
            assert row == (True, False, 7, True)
        [[row]] = await conn.run([(arrays, (["a", 'b"\\c', "d"], [3, 1, 2]))])
        assert row == ('b"\\c', 3, [3, 1, 2])
        [[(empty,)]] = await conn.run([(Statement("select '{}'::bigint[]"), ())])
        assert empty == []
    assert repr(SELECT) == "Statement(b'select $1::text'...)"


@guarded
async def test_a_statement_the_server_rejects_skips_the_rest_and_the_pool_rolls_back() -> None:
    create = Statement("create temporary table if not exists t (n int primary key)")
    insert = Statement("insert into t values ($1::int)")
    count = Statement("select count(*) from t")
    async with pool(max_size=1) as pg:
        async with pg.connection() as conn:
            await conn.run([(create, ())])
            with pytest.raises(PgError) as rejected:
                await conn.run(
                    [
                        (Statement("begin"), ()),
                        (insert, (1,)),
                        (insert, (1,)),  # duplicate key
                        (insert, (2,)),  # skipped
                    ]
                )
            assert rejected.value.sqlstate == "23505"
            assert not conn.idle  # the transaction is failed, not yet rolled back
        # The pool rolled it back and kept the connection.
        assert pg.size == 1
        async with pg.connection() as again:
            assert again is conn
            assert again.idle
            assert await again.run([(count, ())]) == [[(0,)]]


@guarded
async def test_scripts_run_many_statements_and_report_the_first_failure() -> None:
    async with pool() as pg, pg.connection() as conn:
        await conn.script(b"create temporary table s (n int); insert into s values (1), (2);")
        with pytest.raises(PgError) as failed:
            await conn.script(b"insert into s values (3); select 1/0; insert into s values (4);")
        assert failed.value.sqlstate == "22012"
        # One script is one implicit transaction: the insert before the
        # failure is rolled back too. The connection is back in pipeline mode.
        assert await conn.run([(Statement("select count(*) from s"), ())]) == [[(2,)]]


@guarded
async def test_notifications_arrive_on_a_listening_connection() -> None:
    dsn = await database_dsn()
    async with pool() as pg:
        listener = await pg.open_connection()
        try:
            await listener.script(b"LISTEN a2_test_channel")
            assert listener.notifies() == []
            await run_sql(dsn, "select pg_notify('a2_test_channel', 'hello')")
            while not (notes := listener.notifies()):
                await trio.lowlevel.wait_readable(listener.socket)
            assert notes == [("a2_test_channel", "hello")]
        finally:
            listener.close()
        assert not listener.alive()
        with pytest.raises(PgConnectionError):
            listener.notifies()
        with pytest.raises(PgConnectionError):
            await listener.run([(SELECT, ("x",))])


@guarded
async def test_a_connection_the_server_killed_is_replaced_at_checkout() -> None:
    async with pool(max_size=2) as pg:
        async with pg.connection() as first:
            pid = await backend_pid(first)
        assert pg.size == 1
        await terminate(pid)
        # Wait for the server's goodbye (a FATAL notice, then end of stream).
        while first.alive():
            await trio.lowlevel.wait_readable(first.socket)
        # The idle connection is found dead without a query, closed, and replaced.
        async with pg.connection() as second:
            assert second is not first
            assert await backend_pid(second) != pid
        assert pg.size == 1


async def sleeping(pid: int) -> None:
    """Wait until the backend ``pid`` runs ``pg_sleep``."""
    dsn = await database_dsn()
    while True:
        if await run_sql(
            dsn,
            f"select 1 from pg_stat_activity where pid = {pid} and query like 'select pg_sleep%'",
        ):
            return
        await trio.sleep(0.01)


@guarded
async def test_a_connection_killed_mid_statement_fails_and_its_idle_siblings_go_too() -> None:
    async with pool(max_size=2) as pg:
        async with pg.connection() as sibling, pg.connection() as other:
            await backend_pid(sibling)
            await backend_pid(other)
        assert pg.size == 2

        async def kill(pid: int) -> None:
            await sleeping(pid)
            await terminate(pid)

        async with trio.open_nursery() as nursery:
            with pytest.raises(PgConnectionError, match="server closed the connection"):
                async with pg.connection() as victim:
                    nursery.start_soon(kill, await backend_pid(victim))
                    await victim.run([(Statement("select pg_sleep(30)"), ())])
        assert victim.broken
        # After a broken connection the idle ones are presumed dead too (a restart).
        assert pg.size == 0
        assert sibling.broken or other.broken


@guarded
async def test_borrowers_past_max_size_wait_for_a_connection() -> None:
    async with pool(max_size=1) as pg:
        order: list[str] = []
        held = trio.Event()
        release = trio.Event()

        async def holder() -> None:
            async with pg.connection():
                order.append("holder in")
                held.set()
                await release.wait()
            order.append("holder out")

        async def waiter() -> None:
            await held.wait()
            async with pg.connection() as conn:
                order.append("waiter in")
                await backend_pid(conn)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            nursery.start_soon(waiter)
            await held.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert order == ["holder in"]
            release.set()
        assert order == ["holder in", "holder out", "waiter in"]
        assert pg.size == 1


@guarded
async def test_a_cancelled_statement_is_cancelled_on_the_server_and_the_connection_closed() -> None:
    async with pool() as pg:
        dsn = await database_dsn()
        with trio.move_on_after(0.2) as timeout:
            async with pg.connection() as conn:
                await conn.run([(Statement("begin"), ()), (Statement("select pg_sleep(30)"), ())])
        assert timeout.cancelled_caught
        assert conn.broken
        assert pg.size == 0
        # The server is no longer sleeping on our behalf.
        while True:
            if not await run_sql(
                dsn, "select 1 from pg_stat_activity where query = 'select pg_sleep(30)'"
            ):
                break
            await trio.sleep(0.01)


@guarded
async def test_connecting_fails_refused_or_after_the_timeout() -> None:
    with pytest.raises(PgConnectionError):
        await PgConnection.connect("postgresql://postgres@127.0.0.1:1/x", timeout_s=5, prepare=True)
    # A server that accepts and never answers.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    try:
        with pytest.raises(PgConnectionError, match=r"^connection timed out after 0.2 s$"):
            await PgConnection.connect(
                f"postgresql://postgres@127.0.0.1:{port}/x", timeout_s=0.2, prepare=True
            )
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_pool_arguments_and_a_closed_pool() -> None:
    with pytest.raises(ValueError, match=r"^`max_size` must be at least 1, got 0$"):
        PgPool("postgresql://x", max_size=0)
    pg = PgPool("postgresql://x")
    pg.close()
    pg.close()
    with pytest.raises(trio.ClosedResourceError, match="the Postgres pool is closed"):
        async with pg.connection():
            pass


@guarded
async def test_a_payload_larger_than_the_socket_buffer_is_flushed_in_parts() -> None:
    big = "x" * (16 * 1024 * 1024)
    async with pool() as pg, pg.connection() as conn:
        [[(length,)]] = await conn.run([(Statement("select length($1::text)"), (big,))])
        assert length == len(big)


@guarded
async def test_a_connection_returned_to_a_closed_pool_is_closed() -> None:
    async with pool() as pg:
        async with pg.connection() as conn:
            await backend_pid(conn)
            pg.close()
        assert conn.broken
        assert pg.size == 0
