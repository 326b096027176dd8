"""Group commit on Postgres: completions that arrive together share a transaction,
and each one is still fenced on its own attempt and holder.

Runs against a real server (``tests/backends/postgres.py``).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent, Claimed, CompleteResult, EventCause
from a2trio.stores.postgres import PostgresStore, postgres
from a2trio.stores.postgres.conn import PgPool, Statement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")

BEGIN = Statement("begin")
ROLLBACK = Statement("rollback")
LOCK = Statement("select pg_advisory_xact_lock(hashtext($1::text))")


@asynccontextmanager
async def _store() -> AsyncIterator[PostgresStore]:
    dsn = await database_dsn()
    schema = f"g_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema)
    try:
        async with store:
            yield store
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


async def _claim_one(
    store: PostgresStore, session_id: str, holder: str, expires_at_ms: int | None = None
) -> int:
    claim = await store.claim_available(
        session_id, holder=holder, ttl_ms=60_000, expires_at_ms=expires_at_ms
    )
    assert isinstance(claim, Claimed)
    [event] = claim.events
    return event.attempt_count


@asynccontextmanager
async def _occupied(store: PostgresStore) -> AsyncIterator[None]:
    """Keep one transaction in flight (an append waiting on a lock held here),
    so requests made together in the block share a group instead of running
    alone in their callers' tasks (what a store with nothing in flight does)."""
    holder = PgPool(store.dsn)
    try:
        async with holder.connection() as conn, trio.open_nursery() as nursery:
            await conn.run([(BEGIN, ()), (LOCK, ("occupier",))])
            nursery.start_soon(store.append, "occupier", [AppendEvent("job", {})])
            await trio.testing.wait_all_tasks_blocked()
            try:
                yield
            finally:
                await conn.run([(ROLLBACK, ())])
    finally:
        holder.close()


async def _together(
    store: PostgresStore, calls: list[tuple[str, int, list[AppendEvent]]]
) -> list[CompleteResult | A2Error]:
    """Start every completion in one scheduling batch, so they queue together."""
    async with _occupied(store):
        return await _in_one_batch(store, calls)


async def _in_one_batch(
    store: PostgresStore, calls: list[tuple[str, int, list[AppendEvent]]]
) -> list[CompleteResult | A2Error]:
    results: list[CompleteResult | A2Error | None] = [None] * len(calls)

    async def one(position: int, session_id: str, attempt: int, events: list[AppendEvent]) -> None:
        try:
            results[position] = await store.complete_attempt(
                session_id, index=1, attempt=attempt, events=events
            )
        except A2Error as exc:
            results[position] = exc

    async with trio.open_nursery() as nursery:
        for position, (session_id, attempt, events) in enumerate(calls):
            nursery.start_soon(one, position, session_id, attempt, events)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


async def test_a_superseded_attempt_inside_a_group_is_rejected_while_the_others_commit() -> None:
    async with _store() as store:
        for sid in ("a", "b", "c"):
            await store.append(sid, [AppendEvent("job", {"sid": sid}, id=f"{sid}-1")])
        assert await _claim_one(store, "a", "h1") == 1
        assert await _claim_one(store, "b", "h1") == 1
        # c's first claim is born expired, so a second holder takes attempt 2.
        now = store.clock.now_ms()
        assert await _claim_one(store, "c", "zombie", expires_at_ms=now - 1) == 1
        assert await _claim_one(store, "c", "h2") == 2
        reply = AppendEvent("reply", {"to": "a"}, id="a-reply")
        async with _occupied(store):
            before = store.group_statistics()
            results = await _in_one_batch(
                store, [("a", 1, [reply]), ("b", 1, []), ("c", 1, []), ("c", 2, [])]
            )
            after = store.group_statistics()
        assert after.groups - before.groups == 1
        assert after.members - before.members == 4
        assert all(isinstance(r, CompleteResult) for r in results)
        assert [getattr(r, "outcome", None) for r in results] == [
            "completed",
            "completed",
            "superseded",
            "completed",
        ]
        completed_a = results[0]
        assert isinstance(completed_a, CompleteResult)
        [stored_reply] = completed_a.events
        assert (stored_reply.id, stored_reply.index) == ("a-reply", 2)
        assert stored_reply.cause == EventCause(1, 1)
        [c1] = await store.read("c", through_index=1)
        assert c1.processed_by_attempt == 2
        for sid in ("a", "b"):
            [row] = await store.read(sid, through_index=1)
            assert row.processed_by_attempt == 1
        # The zombie's late retry still loses, alone this time.
        late = await store.complete_attempt("c", index=1, attempt=1, events=[])
        assert late.outcome == "superseded"


async def test_a_members_verdict_stays_its_own() -> None:
    async with _store() as store:
        for sid in ("a", "b"):
            await store.append(sid, [AppendEvent("job", {}, id=f"{sid}-1")])
            assert await _claim_one(store, sid, "h") == 1
        # a returns an event whose id b already stored: a duplicate for a alone.
        clash = AppendEvent("reply", {}, id="b-1")
        results = await _together(store, [("a", 1, [clash]), ("b", 1, [])])
        first, second = results
        assert isinstance(first, A2Error)
        assert first.code == ErrorCode.PARTIAL_DUPLICATE_BATCH
        assert isinstance(second, CompleteResult)
        assert second.outcome == "completed"
        [a1] = await store.read("a")
        assert a1.processed_at_ms is None
        assert a1.attempt_count == 1


async def test_a_completion_cancelled_before_it_is_queued_never_commits() -> None:
    async with _store() as store:
        await store.append("a", [AppendEvent("job", {}, id="a-1")])
        assert await _claim_one(store, "a", "h") == 1
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.complete_attempt("a", index=1, attempt=1, events=[])
        assert scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
        [row] = await store.read("a")
        assert row.processed_at_ms is None
        done = await store.complete_attempt("a", index=1, attempt=1, events=[])
        assert done.outcome == "completed"


async def test_a_member_cancelled_in_flight_writes_nothing_and_the_others_run_again() -> None:
    async with _store() as store:
        await store.append("warm", [AppendEvent("job", {}, id="warm-1")])
        dsn = store.dsn
        blocker = PgPool(dsn)
        try:
            async with blocker.connection() as conn:
                # Hold s's append lock: the group (s first in lock order) waits on it.
                await conn.run([(BEGIN, ()), (LOCK, ("s",))])
                landed: list[int] = []
                seen_at_cancel: list[int] = []
                cancelled: list[bool] = []

                async def append_t() -> None:
                    result = await store.append("t", [AppendEvent("job", {}, id="t-1")])
                    landed.extend(e.index for e in result.events)

                async def append_s() -> None:
                    with trio.move_on_after(0.2) as scope:
                        await store.append("s", [AppendEvent("job", {}, id="s-1")])
                    cancelled.append(scope.cancelled_caught)
                    seen_at_cancel.extend(landed)

                # Both queue in one scheduling batch, before either leads.
                async with _occupied(store), trio.open_nursery() as nursery:
                    nursery.start_soon(append_t)
                    nursery.start_soon(append_s)
                assert cancelled == [True]
                # t waited in s's group, so it landed only after the cancellation.
                assert seen_at_cancel == []
                assert landed == [1]
                await conn.run([(ROLLBACK, ())])
        finally:
            blocker.close()
        before = store.group_statistics()
        assert await store.read("s") == []
        result = await store.append("s", [AppendEvent("job", {}, id="s-2")])
        assert [(e.id, e.index) for e in result.events] == [("s-2", 1)]
        assert store.group_statistics().groups - before.groups == 1


async def test_one_statement_finishes_a_sessions_events_each_on_its_own_fence() -> None:
    async with _store() as store:
        await store.append("d", [AppendEvent("job", {}, id="d-1")])
        assert await _claim_one(store, "d", "h1") == 1
        await store.append("d", [AppendEvent("job", {}, id="d-2")])
        now = store.clock.now_ms()
        assert await _claim_one(store, "d", "zombie", expires_at_ms=now - 1) == 1
        assert await _claim_one(store, "d", "h2") == 2
        results = await _together_on(store, "d", [(1, 1), (2, 1)])
        assert [(r.outcome, r.drained) for r in results] == [
            ("completed", False),
            ("superseded", False),
        ]
        [late] = await _together_on(store, "d", [(2, 2)])
        assert (late.outcome, late.drained) == ("completed", True)
        assert [r.processed_by_attempt for r in await store.read("d")] == [1, 2]


async def _together_on(
    store: PostgresStore, session_id: str, claims: list[tuple[int, int]]
) -> list[CompleteResult]:
    results: dict[int, CompleteResult] = {}

    async def one(position: int, index: int, attempt: int) -> None:
        results[position] = await store.complete_attempt(
            session_id, index=index, attempt=attempt, events=[]
        )

    async with _occupied(store):
        before = store.group_statistics()
        async with trio.open_nursery() as nursery:
            for position, (index, attempt) in enumerate(claims):
                nursery.start_soon(one, position, index, attempt)
        assert store.group_statistics().groups - before.groups == 1
    return [results[position] for position in range(len(claims))]
