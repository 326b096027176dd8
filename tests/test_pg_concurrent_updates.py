"""A row another transaction updated while a statement waited for its lock is
still written (real server).

Under READ COMMITTED, ``select ... for update`` in a CTE locks the *latest*
version of a row that a concurrent transaction updated and committed after the
statement's snapshot; that version is invisible to the statement's own
``update``. The completion (``FINISH``) and the claim join their update to the
locked rows by tuple id (for their plans' sake), so such a row is not written
by that statement: a completion answered "completed" and left its event
claimed and unprocessed, to run again once the claim expired (found while
measuring issue 30, where a heartbeat's renewal commits while completions
wait; issue 29). They now report the row ``stale`` and the store runs them again.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg
import trio

import a2trio
from a2trio.stores.base import AppendEvent, Claimed, ClaimRequest
from a2trio.stores.postgres import PostgresStore, postgres

from .backends.postgres import database_dsn, run_sql


@asynccontextmanager
async def store_in_schema() -> AsyncIterator[tuple[PostgresStore, str, str]]:
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    store = postgres(dsn, clock=a2trio.SystemClock(), schema=schema)
    try:
        async with store:
            yield store, dsn, schema
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


@asynccontextmanager
async def row_updated_under(
    dsn: str, schema: str, statement: str
) -> AsyncIterator[Callable[[], None]]:
    """Run ``statement`` in a transaction left open (its rows locked); the
    yielded function commits it. The transaction lives on a thread of its own
    (a blocking connection), rolled back if never committed."""
    begun, commit, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(f'set search_path to "{schema}"')
            conn.execute(statement)
            begun.set()
            commit.wait(120)
            conn.commit()
        done.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    await trio.to_thread.run_sync(begun.wait, 120)
    try:
        yield commit.set
    finally:
        commit.set()
        await trio.to_thread.run_sync(done.wait, 120)


async def wait_for_a_lock_wait(dsn: str) -> None:
    """Until some backend of this database waits on a row lock (the store's
    statement queued behind the open transaction)."""
    query = (
        "select count(*) from pg_stat_activity"
        " where datname = current_database() and wait_event_type = 'Lock'"
    )
    with trio.fail_after(120):
        while True:
            # Another server's state: polled, nothing here to wait on.
            if (await run_sql(dsn, query))[0][0]:
                return
            await trio.sleep(0.01)


async def test_a_completion_waiting_on_a_renewal_marks_its_event_processed() -> None:
    async with store_in_schema() as (store, dsn, schema):
        appended = await store.append("s1", [AppendEvent("t", {})], claim=ClaimRequest("h", 60_000))
        [event] = appended.claimed
        renewal = "update a2_events set claim_expires_at = claim_expires_at + 1000 where idx = 1"
        async with row_updated_under(dsn, schema, renewal) as commit, trio.open_nursery() as n:
            results: list[str] = []

            async def complete() -> None:
                done = await store.complete_attempt(
                    "s1", index=1, attempt=event.attempt_count, events=[]
                )
                results.append(done.outcome)

            n.start_soon(complete)
            await wait_for_a_lock_wait(dsn)
            commit()
        assert results == ["completed"]
        [row] = await store.read("s1")
        assert row.processed_at_ms is not None
        assert row.claim_holder is None


async def test_a_claim_waiting_on_another_update_claims_the_event() -> None:
    async with store_in_schema() as (store, dsn, schema):
        await store.append("s1", [AppendEvent("t", {})])
        touch = "update a2_events set last_error = 'touched' where idx = 1"
        async with row_updated_under(dsn, schema, touch) as commit, trio.open_nursery() as n:
            claims: list[object] = []

            async def claim() -> None:
                claims.append(await store.claim_available("s1", holder="h", ttl_ms=60_000))

            n.start_soon(claim)
            await wait_for_a_lock_wait(dsn)
            commit()
        [claimed] = claims
        assert isinstance(claimed, Claimed)
        assert [e.index for e in claimed.events] == [1]
        [row] = await store.read("s1")
        assert row.claim_holder == "h"
