"""The Postgres store beyond conformance: the driver under cancellation, the
lifecycle, LISTEN/NOTIFY feeds and presence push across stores.

Every test runs against a real server (see ``tests/backends/postgres.py``);
``A2_TEST_POSTGRES_REQUIRED=1`` turns an unreachable server into failures.
"""

from __future__ import annotations

import math
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

import a2trio
from a2trio.clock import SYSTEM_CLOCK
from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent, StoredPresencePatch
from a2trio.stores.postgres import PostgresStore, postgres
from a2trio.stores.postgres.conn import PgConnectionError, PgError, PgPool, Statement
from a2trio.timings import Timings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")

# Feeds must follow notifications here, not the safety re-read.
NO_SAFETY = Timings(notify_safety_s=3600.0, poll_idle_s=3600.0)


def _event(event_id: str | None = None) -> AppendEvent:
    return AppendEvent("note", {"text": "hi"}, id=event_id)


@asynccontextmanager
async def _schema() -> AsyncIterator[tuple[str, str]]:
    dsn = await database_dsn()
    schema = f"t_{secrets.token_hex(6)}"
    try:
        yield dsn, schema
    finally:
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


@asynccontextmanager
async def _store(dsn: str, schema: str, **options: Any) -> AsyncIterator[PostgresStore]:
    store = postgres(dsn, schema=schema, **options)
    try:
        async with store:
            yield store
    finally:
        await store.aclose()


BEGIN = Statement("begin")
INSERT = Statement("insert into t (v) values ($1::int)")
SLEEP = Statement("select pg_sleep($1::float8)")
COUNT = Statement("select count(*) from t")
BACKEND = Statement("select pg_backend_pid()")


async def test_cancelled_transaction_never_returns_to_the_pool() -> None:
    async with _schema() as (dsn, schema):
        await run_sql(dsn, f'create schema "{schema}"; create table "{schema}".t (v int)')
        pool = PgPool(f"{dsn} options=-csearch_path={schema}", max_size=1)
        try:
            with trio.move_on_after(0.2) as scope:
                async with pool.connection() as conn:
                    await conn.run([(BEGIN, ()), (INSERT, (1,)), (SLEEP, (30,))])
            assert scope.cancelled_caught
            # The connection was mid-transaction: closed, not pooled.
            assert pool.size == 0
            async with pool.connection() as conn:
                assert conn.idle
                [[(count,)]] = await conn.run([(COUNT, ())])
            assert count == 0
            assert pool.size == 1
        finally:
            pool.close()


async def _run_in_pool(pool: PgPool, batch: list[tuple[Statement, tuple[object, ...]]]) -> None:
    async with pool.connection() as conn:
        await conn.run(batch)  # type: ignore[arg-type]


async def test_server_error_rolls_back_and_keeps_the_connection() -> None:
    async with _schema() as (dsn, schema):
        await run_sql(dsn, f'create schema "{schema}"; create table "{schema}".t (v int)')
        pool = PgPool(f"{dsn} options=-csearch_path={schema}", max_size=1)
        try:
            bad = Statement("select 1 / $1::int")
            async with pool.connection() as conn:
                [[(pid,)]] = await conn.run([(BACKEND, ())])
            with pytest.raises(PgError, match=r"division by zero") as caught:
                await _run_in_pool(pool, [(BEGIN, ()), (INSERT, (1,)), (bad, (0,))])
            assert caught.value.sqlstate == "22012"
            async with pool.connection() as conn:
                assert conn.idle
                [[(again,)], [(count,)]] = await conn.run([(BACKEND, ()), (COUNT, ())])
            assert (again, count) == (pid, 0)
        finally:
            pool.close()


async def test_cancelled_append_writes_nothing_and_leaves_a_clean_pool() -> None:
    async with _schema() as (dsn, schema), _store(dsn, schema, max_connections=1) as store:
        await store.append("warm", [_event()])
        # Another session holds the append lock, so the append waits on the server.
        blocker = PgPool(f"{dsn} options=-csearch_path={schema}")
        try:
            async with blocker.connection() as conn:
                lock = Statement("select pg_advisory_xact_lock(hashtext($1::text))")
                await conn.run([(BEGIN, ()), (lock, ("s",))])
                with trio.move_on_after(0.2) as scope:
                    await store.append("s", [_event("e1")])
                assert scope.cancelled_caught
                await conn.run([(Statement("rollback"), ())])
        finally:
            blocker.close()
        result = await store.append("s", [_event("e2")])
        assert [e.index for e in result.events] == [1]
        assert [e.id for e in await store.read("s")] == ["e2"]


async def test_construction_does_no_io_and_unreachable_is_store_unavailable() -> None:
    # Port 1 on loopback refuses at once.
    store = postgres("postgresql://root@127.0.0.1:1/nowhere", connect_timeout_s=2)
    with trio.fail_after(10), pytest.raises(A2Error) as caught:
        await store.read("s")
    assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
    assert isinstance(caught.value.__cause__, PgConnectionError)
    await store.aclose()


async def test_connection_attempts_time_out() -> None:
    # A server that accepts and never answers: only the timeout ends the attempt.
    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        held: list[trio.SocketStream] = []

        async def accept_and_hold() -> None:
            async with listener:
                while True:
                    held.append(await listener.accept())

        nursery.start_soon(accept_and_hold)
        port = listener.socket.getsockname()[1]
        store = postgres(
            f"postgresql://root@127.0.0.1:{port}/x?sslmode=disable", connect_timeout_s=0.3
        )
        with trio.fail_after(10), pytest.raises(A2Error) as caught:
            await store.append("s", [_event()])
        assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
        assert "timed out" in str(caught.value.__cause__)
        assert held
        await store.aclose()
        nursery.cancel_scope.cancel()
        for stream in held:
            await stream.aclose()


async def test_closed_store_refuses_use() -> None:
    async with _schema() as (dsn, schema):
        store = postgres(dsn, schema=schema)
        await store.aclose()
        await store.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await store.__aenter__()


def test_bad_schema_name() -> None:
    with pytest.raises(ValueError, match=r"^schema 'a-b' must be a lowercase SQL identifier"):
        postgres("postgresql:///x", schema="a-b")


async def test_processes_can_initialize_the_schema_together() -> None:
    async with _schema() as (dsn, schema):
        stores = [postgres(dsn, schema=schema) for _ in range(4)]
        try:
            async with trio.open_nursery() as nursery:
                for n, store in enumerate(stores):
                    nursery.start_soon(store.append, f"s{n}", [_event()])
            assert [len(await s.read(f"s{n}")) for n, s in enumerate(stores)] == [1, 1, 1, 1]
        finally:
            for store in stores:
                await store.aclose()


async def _listener_backends(dsn: str) -> int:
    rows = await run_sql(
        dsn,
        "select count(*) from pg_stat_activity"
        " where datname = current_database() and query like 'listen %'",
    )
    [(count,)] = rows
    assert isinstance(count, int)
    return count


async def test_one_listener_serves_every_feed_and_notifies_across_stores() -> None:
    async with (
        _schema() as (dsn, schema),
        _store(dsn, schema) as writer,
        _store(dsn, schema, timings=NO_SAFETY) as reader,
    ):
        await writer.append("warm", [_event()])
        before = await _listener_backends(dsn)
        async with (
            reader.stream("a") as feed_a,
            reader.stream("a") as feed_a2,
            reader.stream("b") as feed_b,
        ):
            assert reader.feed_statistics().listeners == 3
            with trio.fail_after(10):
                await reader.wait_listening()
                assert await _listener_backends(dsn) == before + 1
                await writer.append("a", [_event("a1")])
                await writer.append("b", [_event("b1")])
                assert (await feed_a.receive()).id == "a1"
                assert (await feed_a2.receive()).id == "a1"
                assert (await feed_b.receive()).id == "b1"
        assert reader.feed_statistics().listeners == 0


async def test_lost_listener_reconnects_and_catches_up() -> None:
    async with (
        _schema() as (dsn, schema),
        _store(dsn, schema) as writer,
        _store(dsn, schema, timings=NO_SAFETY) as reader,
        reader.stream("s") as feed,
    ):
        with trio.fail_after(10):
            await reader.wait_listening()
            await run_sql(
                dsn,
                "select pg_terminate_backend(pid) from pg_stat_activity"
                " where datname = current_database() and query like 'listen %'",
            )
            await writer.append("s", [_event("during")])
            assert (await feed.receive()).id == "during"
            await reader.wait_listening()
            await writer.append("s", [_event("after")])
            assert (await feed.receive()).id == "after"


async def test_without_listen_feeds_poll() -> None:
    async with (
        _schema() as (dsn, schema),
        _store(dsn, schema) as writer,
        _store(dsn, schema, listen=False) as reader,
        reader.stream("s") as feed,
    ):
        await writer.append("s", [_event("x")])
        with trio.fail_after(10):
            assert (await feed.receive()).id == "x"
        assert not reader.listening


async def test_feed_outside_async_with_polls() -> None:
    async with _schema() as (dsn, schema), _store(dsn, schema) as writer:
        reader = postgres(dsn, schema=schema)
        try:
            async with reader.stream("s") as feed:
                await writer.append("s", [_event("x")])
                with trio.fail_after(10):
                    assert (await feed.receive()).id == "x"
        finally:
            await reader.aclose()


async def test_presence_push_across_stores_and_once_locally() -> None:
    async with (
        _schema() as (dsn, schema),
        _store(dsn, schema) as a,
        _store(dsn, schema) as b,
    ):
        seen_a: list[StoredPresencePatch] = []
        seen_b: list[StoredPresencePatch] = []
        got_b = trio.Event()

        def on_b(patch: StoredPresencePatch) -> None:
            seen_b.append(patch)
            got_b.set()

        await a.presence.read("s")
        unsubscribe_a = a.presence.subscribe("s", seen_a.append)
        unsubscribe_b = b.presence.subscribe("s", on_b)
        with trio.fail_after(10):
            await a.wait_listening()
            await b.wait_listening()
            patch = await a.presence.set(
                "s", "alice", {"typing": True}, seen=1, at_ms=5, ttl_ms=60_000
            )
            assert patch == StoredPresencePatch("alice", {"typing": True}, 1, 5)
            await got_b.wait()
        assert seen_b == [StoredPresencePatch("alice", {"typing": True}, 1, 5)]
        # The writer's own NOTIFY comes back to it and is skipped: a later
        # write from b proves a's listener has drained past it.
        got_a = trio.Event()
        unsubscribe_a()

        def on_a(patch: StoredPresencePatch) -> None:
            seen_a.append(patch)
            got_a.set()

        a.presence.subscribe("s", on_a)
        await b.presence.set("s", "alice", {"typing": None}, seen=2, at_ms=6, ttl_ms=60_000)
        with trio.fail_after(10):
            await got_a.wait()
        assert seen_a == [
            StoredPresencePatch("alice", {"typing": True}, 1, 5),
            StoredPresencePatch("alice", {"typing": None}, 2, 6),
        ]
        unsubscribe_b()


async def test_presence_without_listen_is_the_degraded_tier() -> None:
    async with _schema() as (dsn, schema), _store(dsn, schema, listen=False) as store:
        assert store.presence.push is False
        await store.presence.set("s", "alice", {"typing": True}, seen=1, at_ms=5, ttl_ms=60_000)
        [row] = await store.presence.read("s")
        assert (row.participant, row.field, row.value) == ("alice", "typing", True)


async def test_unprepared_statements_work() -> None:
    async with _schema() as (dsn, schema), _store(dsn, schema, prepare=False) as store:
        await store.append("s", [_event("x")])
        await store.append("s", [_event("x")])
        assert [e.index for e in await store.read("s")] == [1]


async def test_dsn_carries_the_schema() -> None:
    async with _schema() as (dsn, schema), _store(dsn, schema) as store:
        await store.append("s", [_event()])
        rows = await run_sql(store.dsn, "select count(*) from a2_events")
        assert rows == [(1,)]
        assert store.clock is SYSTEM_CLOCK
        assert not math.isnan(store.timings.notify_safety_s)


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


shop = a2trio.contract(
    "shop", events={"ordered": Ordered, "shipped": Shipped}, presence={"typing": bool}
)


async def test_servers_in_two_processes_share_events_and_presence() -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        return shop.event("shipped", Shipped(ctx.event.payload.item))

    async with _schema() as (dsn, schema):
        # Two stores on one schema stand for two processes.
        front = a2trio.Server(shop, store=postgres(dsn, schema=schema))
        back = a2trio.Server(shop, store=postgres(dsn, schema=schema), handlers={"ordered": ship})
        try:
            async with front, back:
                async with front.session("o1").stream(presence=True) as feed:
                    snapshot = await feed.receive()
                    assert isinstance(snapshot, a2trio.PresenceSnapshot)
                    await back.session("o1").append(shop.event("ordered", Ordered("book")))
                    await back.settle()
                    await back.session("o1").set_presence("alice", {"typing": True})
                    with trio.fail_after(10):
                        received = [await feed.receive() for _ in range(3)]
                events = [r for r in received if isinstance(r, a2trio.Event)]
                patches = [r for r in received if isinstance(r, a2trio.PresencePatch)]
                assert [(e.type, e.index) for e in events] == [("ordered", 1), ("shipped", 2)]
                assert [(p.participant, p.values) for p in patches] == [("alice", {"typing": True})]
                history = await front.session("o1").history()
                assert [e.payload for e in history] == [Ordered("book"), Shipped("book")]
        finally:
            await front.store.aclose()
            await back.store.aclose()
