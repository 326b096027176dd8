"""Mixed fleets: the seed's DDL and a2trio's, run at once on a fresh database,
serialize on the one schema lock (issue 23).

The seed's ``initializeSchema`` (``store-postgres.ts``) runs ``begin``,
``select pg_advisory_xact_lock(hashtext('a2:postgres:schema'))``, its
``SCHEMA`` text and ``commit`` on one connection; a2trio's first operation
runs its own DDL under the same key. ``create table if not exists`` alone does
not serialize concurrent catalog writes (two of them race on ``pg_type``), so
both succeeding with one set of tables is what the shared key buys. A third
connection holds the lock until both are waiting on it, so they really do run
together. The seed's statement text is a verbatim copy
(``tests/seed/store_postgres_0.5.0_schema.sql``), checked in every clone against
the digest of the seed's text recorded here, and against the seed file itself
when ``shared/`` lies beside the repository.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from psycopg.conninfo import make_conninfo

from a2trio.stores.base import AppendEvent
from a2trio.stores.postgres import postgres
from a2trio.stores.postgres.conn import PgConnection

from .backends.postgres import admin_dsn, database_dsn, run_sql

ROOT = Path(__file__).resolve().parent.parent
SEED_DDL = ROOT / "tests" / "seed" / "store_postgres_0.5.0_schema.sql"
SEED_SOURCE = sorted((ROOT.parent / "shared" / "seeds").glob("002_*.txt"))
# sha256 of the seed's `const SCHEMA` text, newline-terminated, taken from
# shared/seeds/002_d080dc556d08ae54.txt when the copy was made.
SEED_SCHEMA_SHA256 = "041c4517702c5d7c05075c43cf8de53355dd8948cfd084b2de1ea034ac09c8b2"
LOCK = b"select pg_advisory_xact_lock(hashtext('a2:postgres:schema'))"


def _seed_schema() -> str:
    """The seed's ``SCHEMA`` text (the copy, without its origin comment)."""
    lines = SEED_DDL.read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("-- ")) + "\n"


def test_the_copy_is_the_seeds_text() -> None:
    # The digest holds in every clone; beside the seed sources the copy is
    # also compared with them directly.
    assert hashlib.sha256(_seed_schema().encode()).hexdigest() == SEED_SCHEMA_SHA256
    for source in SEED_SOURCE:
        lines = source.read_text().splitlines()
        start = lines.index("+const SCHEMA = `")
        end = lines.index("+`", start)
        assert _seed_schema() == "\n".join(line[1:] for line in lines[start + 1 : end]) + "\n"


@asynccontextmanager
async def _fresh_database() -> AsyncIterator[str]:
    name = f"a2trio_seedddl_{secrets.token_hex(5)}"
    await run_sql(admin_dsn(), f'create database "{name}"')
    try:
        yield make_conninfo(await database_dsn(), dbname=name)
    finally:
        await run_sql(admin_dsn(), f'drop database if exists "{name}" with (force)')


async def _waiting_on_the_lock(dsn: str) -> int:
    [(count,)] = await run_sql(
        dsn,
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and wait_event_type = 'Lock' and wait_event = 'advisory'",
    )
    assert isinstance(count, int)
    return count


async def test_the_seeds_ddl_and_ours_at_once_leave_one_schema() -> None:
    async with _fresh_database() as dsn:
        holder = await PgConnection.connect(dsn, timeout_s=5, prepare=False)
        seed = await PgConnection.connect(dsn, timeout_s=5, prepare=False)
        store = postgres(dsn)
        done: list[str] = []

        async def seed_initialize_schema() -> None:
            # initializeSchema's four queries, one by one on one connection.
            for query in (b"begin", LOCK, _seed_schema().encode(), b"commit"):
                await seed.script(query)
            done.append("seed")

        async def ours() -> None:
            await store.read("s")
            done.append("a2trio")

        try:
            await holder.script(b"begin; " + LOCK)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(seed_initialize_schema)
                nursery.start_soon(ours)
                with trio.fail_after(120):
                    # The server's view: no trio.Event crosses connections
                    # (the bound is a hang guard only).
                    while await _waiting_on_the_lock(dsn) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                assert done == []
                await holder.script(b"commit")
            assert sorted(done) == ["a2trio", "seed"]
            tables = await run_sql(
                dsn,
                "select n.nspname, c.relname from pg_class c"
                " join pg_namespace n on n.oid = c.relnamespace"
                " where c.relkind = 'r' and c.relname like 'a2\\_%' order by 2",
            )
            indexes = await run_sql(
                dsn, "select indexname from pg_indexes where tablename = 'a2_events' order by 1"
            )
            # Both frameworks' work lands in the one schema: a2trio's events
            # read and write on the tables whichever DDL created them.
            await store.append("s", [AppendEvent("note", {"n": 1}, id="e1")])
            assert [e.id for e in await store.read("s")] == ["e1"]
        finally:
            holder.close()
            seed.close()
            await store.aclose()
    # One schema: every table once, in `public`, the seed's among them.
    assert {schema for schema, _ in tables} == {"public"}
    names = [name for _, name in tables]
    assert {"a2_events", "a2_presence", "a2_snapshots"} <= set(names)
    assert len(names) == len(set(names))
    # The seed's two extra indexes (a2trio creates neither) sit beside the
    # ones both create: one table, one set of indexes.
    index_names = [name for (name,) in indexes]
    assert {
        "a2_events_unprocessed",
        "a2_events_dispatch_ready",
        "a2_events_event_id",
    } <= set(index_names)
    assert len(index_names) == len(set(index_names))


async def test_a_reader_holding_the_events_table_does_not_block_a_starting_store() -> None:
    # Every process runs the DDL when it opens; none of it may wait on a
    # plain reader (an `alter table` would: it takes an access-exclusive lock
    # even when there is nothing to add), or a fleet's restart queues every
    # query behind a long report.
    async with _fresh_database() as dsn:
        first = postgres(dsn)
        await first.read("s")
        # Closed, it releases the process's pool, so the next store runs the
        # DDL again, as a new process would.
        await first.aclose()
        reader = await PgConnection.connect(dsn, timeout_s=5, prepare=False)
        second = postgres(dsn)
        try:
            await reader.script(b"begin; lock table a2_events in access share mode")
            with trio.fail_after(120):
                await second.append("s", [AppendEvent("note", {"n": 1}, id="e1")])
            await reader.script(b"commit")
            assert [e.id for e in await second.read("s")] == ["e1"]
        finally:
            reader.close()
            await second.aclose()
