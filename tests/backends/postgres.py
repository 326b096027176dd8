"""The Postgres store as a conformance backend: a fresh schema per check.

Each test run creates its own database, ``a2trio_test_<epoch>_<random>``, on
the server at ``A2_TEST_POSTGRES_URL`` (default: the local trust-auth server)
and drops it when the interpreter exits, failed tests or not; each store gets a
fresh schema in it, dropped on exit. Nothing is dropped by age or name pattern:
another run on the same server may own it (a run killed with SIGKILL leaves its
database behind, named by the epoch it started at). If the server is
unreachable the checks skip with the reason, unless
``A2_TEST_POSTGRES_REQUIRED=1`` (CI), where they fail.
"""

from __future__ import annotations

import atexit
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from a2trio.clock import Clock
from a2trio.stores.base import Store
from a2trio.stores.postgres import PostgresStore, postgres
from tests.backends import unreachable_port

__all__ = ["admin_dsn", "database_dsn", "open_store", "open_unreachable_store", "run_sql"]

# Read at import: the autouse fixture clears A2_* variables before each test.
SERVER_DSN = os.environ.get("A2_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres")
REQUIRED = os.environ.get("A2_TEST_POSTGRES_REQUIRED") == "1"

_database: str | None = None


def admin_dsn() -> str:
    """The server's maintenance database."""
    return make_conninfo(SERVER_DSN, connect_timeout=3)


def _create_database() -> str:
    global _database
    if _database is None:
        name = f"a2trio_test_{int(time.time())}_{secrets.token_hex(4)}"
        try:
            with psycopg.connect(admin_dsn(), autocommit=True) as conn:
                conn.execute(f'create database "{name}"')
        except psycopg.OperationalError as exc:
            if REQUIRED:
                raise
            pytest.skip(f"Postgres at {SERVER_DSN} is unreachable ({exc}); set it up or unset it")
        _database = name
        atexit.register(_drop_database, name)
    return _database


def _drop_database(name: str) -> None:
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


async def database_dsn() -> str:
    """The DSN of this run's database (created on first use)."""
    name = await trio.to_thread.run_sync(_create_database)
    return make_conninfo(SERVER_DSN, dbname=name)


def _run_sql(dsn: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


async def run_sql(dsn: str, statement: str) -> list[tuple[object, ...]]:
    """Run one statement on a fresh connection (test set-up and inspection)."""
    return await trio.to_thread.run_sync(_run_sql, dsn, statement)


@asynccontextmanager
async def open_store(clock: Clock, **options: Any) -> AsyncIterator[Store]:
    """A new Postgres store in a fresh schema on ``clock``; the schema is
    dropped and the store closed on exit."""
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    store: PostgresStore = postgres(dsn, clock=clock, schema=schema, **options)
    try:
        async with store:
            yield store
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


@asynccontextmanager
async def open_unreachable_store(clock: Clock) -> AsyncIterator[Store]:
    """A Postgres store pointed at a loopback port where nothing listens
    (bound, never listening: each connection is refused), not entered;
    closed on exit."""
    with unreachable_port() as port:
        store = postgres(f"postgresql://root@127.0.0.1:{port}/test", clock=clock)
        try:
            yield store
        finally:
            await store.aclose()
