"""Which completions wait for a session's append lock (real server).

Every append takes the session's append lock,
``pg_advisory_xact_lock(hashtext(session_id))``. A completion that returns no
events takes it only if the completed event has a lane (it hands the lane on,
and an append decides a new lane event's readiness from the lane's pending
events). So while another transaction holds the lock, completing a lane-less
event finishes at once and completing a lane event waits. Checked through group
commit (inside ``async with store``) and through lone transactions (outside it).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from a2trio.stores.base import AppendEvent, Claimed, CompleteResult
from a2trio.stores.postgres import PostgresStore, postgres
from a2trio.stores.postgres.conn import PgConnection, PgPool, Statement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")

BEGIN = Statement("begin")
ROLLBACK = Statement("rollback")
# The store's own append lock statement (`_pg_sql.LOCK`).
LOCK = Statement("select pg_advisory_xact_lock(hashtext($1::text))")
ADVISORY_WAITERS = Statement(
    "select count(*) from pg_locks where locktype = 'advisory' and not granted"
    " and database = (select oid from pg_database where datname = current_database())"
)
#: A hang guard: what is under test either happens or waits on a lock held
#: until after the check, so a long bound still fails a wrong wait, and a
#: loaded machine does not fail a right one.
GUARD_S = 60


@asynccontextmanager
async def _store(grouped: bool) -> AsyncIterator[PostgresStore]:
    dsn = await database_dsn()
    schema = f"x_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema)
    try:
        if grouped:
            async with store:
                yield store
        else:
            yield store
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


@asynccontextmanager
async def _append_lock_held(dsn: str, session_id: str) -> AsyncIterator[PgConnection]:
    """Hold ``session_id``'s append lock in an open transaction on a connection
    of our own; the caller rolls back to release it (or leaving does)."""
    conn = await PgPool(dsn).open_connection()
    try:
        await conn.run([(BEGIN, ()), (LOCK, (session_id,))])
        yield conn
    finally:
        conn.close()


async def _until_someone_waits(conn: PgConnection) -> None:
    """Poll until a transaction in this database waits on an advisory lock
    (the server's view: no trio.Event crosses connections)."""
    with trio.fail_after(GUARD_S):
        while True:
            [[(count,)]] = await conn.run([(ADVISORY_WAITERS, ())])
            if count:
                return
            await trio.sleep(0.01)


@pytest.mark.parametrize("grouped", [True, False], ids=["group-commit", "alone"])
async def test_only_completing_a_lane_event_waits_for_the_append_lock(grouped: bool) -> None:
    session_id = f"locks-{secrets.token_hex(4)}"
    async with _store(grouped) as store:
        await store.append(
            session_id,
            [
                AppendEvent("t", {}, id="plain-1"),
                AppendEvent("t", {}, id="plain-2"),
                AppendEvent("t", {}, id="lane-1", lane="a"),
                AppendEvent("t", {}, id="lane-2", lane="a"),
            ],
        )
        claim = await store.claim_available(session_id, holder="h", ttl_ms=60_000)
        assert isinstance(claim, Claimed)
        # lane-2 waits for lane-1 to be processed.
        assert [e.index for e in claim.events] == [1, 2, 3]
        before = store.group_statistics()
        lane_done: list[CompleteResult] = []
        lane_returned = trio.Event()
        async with _append_lock_held(store.dsn, session_id) as holder:
            with trio.fail_after(GUARD_S):
                plain = await store.complete_attempt(session_id, index=1, attempt=1, events=[])
            assert plain.outcome == "completed"

            async def complete_lane() -> None:
                lane_done.append(
                    await store.complete_attempt(session_id, index=3, attempt=1, events=[])
                )
                lane_returned.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(complete_lane)
                # It queues on the lock, and stays there.
                await _until_someone_waits(holder)
                await trio.sleep(0.2)
                assert not lane_returned.is_set()
                # A lane-less completion does not queue behind the blocked one.
                with trio.fail_after(GUARD_S):
                    other = await store.complete_attempt(session_id, index=2, attempt=1, events=[])
                assert other.outcome == "completed"
                assert not lane_returned.is_set()
                [row] = await store.read(session_id, after_index=2, through_index=3)
                assert row.processed_at_ms is None
                # Releasing the lock lets it through.
                await holder.run([(ROLLBACK, ())])
                with trio.fail_after(GUARD_S):
                    await lane_returned.wait()
        [lane] = lane_done
        assert lane.outcome == "completed"
        # The lane was handed on: its next event is now claimable.
        claim = await store.claim_available(session_id, holder="h", ttl_ms=60_000)
        assert isinstance(claim, Claimed)
        assert [e.id for e in claim.events] == ["lane-2"]
        # Each path was the one under test: the three completions and the claim
        # went through group commit, or nothing did.
        members = store.group_statistics().members - before.members
        assert members == (4 if grouped else 0)
