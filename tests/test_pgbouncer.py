"""The conformance suite through PgBouncer in transaction mode (issue 23).

The test starts its own ``pgbouncer`` (``tests/backends/pgbouncer.py``) on a
free loopback port in front of the test server, with
``pool_mode = transaction``, and runs every conformance check on stores built
as a deployment behind such a pooler would build them::

    postgres(pooled, listen_dsn=direct, pooler="transaction")

Queries go through the pooler (no prepared statements, no startup
``options``: the schema's ``search_path`` is set per transaction), and only
the listener connects directly. PgBouncer's ``SHOW CLIENTS`` proves the
queries went through it. Without ``pgbouncer`` installed the tests skip, and
fail under ``A2_TEST_POSTGRES_REQUIRED=1`` (CI).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import a2trio
from a2trio.clock import Clock
from a2trio.errors import A2Error, ErrorCode
from a2trio.schedulers import DurableScheduler
from a2trio.stores import memory
from a2trio.stores.base import AppendEvent, Store
from a2trio.stores.conformance import CHECKS, REQUIRES, StoreFactory, capabilities
from a2trio.stores.postgres import PostgresStore, postgres

from .apps import Note
from .backends.pgbouncer import admin_rows, pgbouncer
from .backends.postgres import SERVER_DSN, database_dsn, run_sql

Check = Callable[[StoreFactory], Awaitable[None]]

_USER = str(conninfo_to_dict(SERVER_DSN).get("user") or "root")


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[str, int]]:
    """(host, port) of a PgBouncer in transaction mode in front of the test server."""
    server = conninfo_to_dict(SERVER_DSN)
    with pgbouncer(
        str(server.get("host") or "127.0.0.1"), int(server.get("port") or 5432), _USER
    ) as address:
        yield address


async def _pooled_dsn(bouncer: tuple[str, int]) -> str:
    host, port = bouncer
    return make_conninfo(await database_dsn(), host=host, port=port)


def _factory(bouncer: tuple[str, int]) -> StoreFactory:
    @asynccontextmanager
    async def open_store(clock: Clock, **options: Any) -> AsyncIterator[Store]:
        direct = await database_dsn()
        schema = f"b_{secrets.token_hex(6)}"
        store: PostgresStore = postgres(
            await _pooled_dsn(bouncer),
            listen_dsn=direct,
            pooler="transaction",
            clock=clock,
            schema=schema,
            **options,
        )
        try:
            async with store:
                yield store
        finally:
            await store.aclose()
            await run_sql(direct, f'drop schema if exists "{schema}" cascade')

    return open_store


_capabilities: list[frozenset[str]] = []


@pytest.fixture
def open_store(bouncer: tuple[str, int], check: Check) -> StoreFactory:
    factory = _factory(bouncer)
    if not _capabilities:
        _capabilities.append(trio.run(capabilities, factory))
    missing = REQUIRES.get(check.__name__, frozenset()) - _capabilities[0]
    if missing:
        pytest.skip(f"the store has no {' / '.join(sorted(missing))} capability")
    return factory


@pytest.mark.parametrize(
    "check", [pytest.param(c, id=c.__name__.removeprefix("check_")) for c in CHECKS]
)
async def test_conformance_through_pgbouncer(check: Check, open_store: StoreFactory) -> None:
    await check(open_store)


async def test_queries_go_through_the_pooler_and_the_listener_does_not(
    bouncer: tuple[str, int],
) -> None:
    host, port = bouncer
    direct = await database_dsn()
    schema = f"b_{secrets.token_hex(6)}"
    listener_app = f"a2l_{secrets.token_hex(4)}"
    store = postgres(
        await _pooled_dsn(bouncer),
        listen_dsn=make_conninfo(direct, application_name=listener_app),
        pooler="transaction",
        schema=schema,
    )
    try:
        async with store, store.stream("s") as feed:
            await store.wait_listening()
            await store.append("s", [AppendEvent("note", {}, id="e1")])
            assert (await feed.receive()).id == "e1"
            clients = await trio.to_thread.run_sync(admin_rows, host, port, _USER, "show clients")
            listeners = await run_sql(
                direct,
                f"select query from pg_stat_activity where application_name = '{listener_app}'",
            )
    finally:
        await store.aclose()
        await run_sql(direct, f'drop schema if exists "{schema}" cascade')
    database = conninfo_to_dict(direct)["dbname"]
    # The pool's connections are PgBouncer's clients; the listener is the
    # server's own, straight from `listen_dsn`.
    assert [c for c in clients if c["database"] == database]
    assert [str(q).split()[0] for (q,) in listeners] == ["listen"]


async def test_without_pooler_the_startup_options_are_refused(bouncer: tuple[str, int]) -> None:
    # Why `pooler="transaction"` moves the schema's search_path and the plan
    # mode into each transaction: PgBouncer refuses the startup `options`.
    store = postgres(await _pooled_dsn(bouncer), listen=False, schema="never_created")
    try:
        with pytest.raises(A2Error) as caught:
            await store.read("s")
    finally:
        await store.aclose()
    assert caught.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "unsupported startup parameter: options" in str(caught.value.__cause__)


async def test_a_durable_scheduler_through_pgbouncer_delivers(bouncer: tuple[str, int]) -> None:
    # Its queries go through the pooler (no prepared statements: PgBouncer
    # 1.18 has none in transaction mode), its listener straight to the server.
    host, port = bouncer
    direct = await database_dsn()
    listener_app = f"a2s_{secrets.token_hex(4)}"
    shop = a2trio.contract(f"bounce_{secrets.token_hex(4)}", events={"note": Note})
    scheduler = DurableScheduler.postgres(
        await _pooled_dsn(bouncer),
        pooler="transaction",
        listen_dsn=make_conninfo(direct, application_name=listener_app),
    )
    server = a2trio.Server(shop, store=memory(), scheduler=scheduler)
    try:
        async with server:
            for n in range(3):
                await server.session("s1").schedule(
                    f"n{n}", "10ms", shop.event("note", Note(f"{n}"))
                )
            with trio.fail_after(10):
                while len(await server.session("s1").history()) < 3:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            clients = await trio.to_thread.run_sync(admin_rows, host, port, _USER, "show clients")
            listeners = await run_sql(
                direct,
                f"select query from pg_stat_activity where application_name = '{listener_app}'",
            )
    finally:
        await run_sql(direct, f"delete from a2_scheduler_tasks where contract = '{shop.name}'")
    database = conninfo_to_dict(direct)["dbname"]
    assert [c for c in clients if c["database"] == database]
    assert [str(q).split()[0].lower() for (q,) in listeners] == ["listen"]


def test_a_durable_scheduler_behind_a_transaction_pooler_needs_a_listen_dsn() -> None:
    with pytest.raises(ValueError, match=r"pass `listen_dsn`"):
        DurableScheduler.postgres("host=pooler", pooler="transaction")
    with pytest.raises(
        ValueError, match=r"^`pooler` must be None or 'transaction', got 'session'$"
    ):
        DurableScheduler.postgres("host=pooler", pooler="session")  # type: ignore[arg-type]
