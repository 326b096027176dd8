"""The scheduler's task queues, one contract on every backend.

``MemoryQueue`` (the local scheduler's), ``SqliteQueue`` and ``PostgresQueue``
(the durable scheduler's) promise the same row semantics: a claim leases due
rows earliest first, and only the lease's token may renew, delete or
reschedule its row. Times are epoch milliseconds passed in by the caller, so
nothing here waits on a clock.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import psycopg
import pytest
import trio
import trio.testing

import a2trio
from a2trio.schedulers import DurableScheduler
from a2trio.schedulers._pg_queue import PostgresQueue
from a2trio.schedulers._queue import MemoryQueue, TaskQueue, TaskRow
from a2trio.schedulers._sqlite_queue import SqliteQueue
from a2trio.stores.feed import Wakeups
from tests.test_scheduler_durable import (  # pg_dsn: a fixture, used by name
    pg_dsn,  # noqa: F401
    real_time_limit,
    until,
)

MakeQueue = Callable[[], TaskQueue]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_queue(request: pytest.FixtureRequest, tmp_path: Path) -> MakeQueue:
    if request.param == "memory":
        return MemoryQueue
    if request.param == "sqlite":
        return lambda: SqliteQueue(tmp_path / "queue.db")
    dsn: str = request.getfixturevalue("pg_dsn")
    return lambda: PostgresQueue(dsn)


def ids(rows: list[TaskRow]) -> list[tuple[str, int]]:
    return [(row.id, row.attempts) for row in rows]


async def test_claims_lease_due_rows_earliest_first_and_only_the_token_holder_writes(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    await queue.open()
    try:
        assert await queue.next_due("shop") is None
        assert await queue.insert("late", "shop", 300, b'{"n": 3}')
        assert await queue.insert("early", "shop", 100, b'{"n": 1}')
        assert await queue.insert("mid", "shop", 200, b'{"n": 2}')
        assert await queue.insert("elsewhere", "other", 0, b"{}")
        assert not await queue.insert("early", "shop", 0, b"{}")  # queued once
        assert (await queue.count(), await queue.count("shop")) == (4, 3)
        assert await queue.next_due("shop") == 100

        # Due rows only, earliest first, up to the limit; attempts count claims.
        first = await queue.claim("shop", 250, 1_000, "A", 10)
        assert ids(first) == [("early", 1), ("mid", 1)]
        assert first[0].body in (b'{"n": 1}', b'{"n":1}')
        # Leased rows are not claimable until their lease ends.
        assert ids(await queue.claim("shop", 1_249, 1_000, "B", 10)) == [("late", 1)]
        assert await queue.next_due("shop") == 1_250

        # Renewal extends the lease, for the token that holds it only.
        assert await queue.renew("early", "A", 5_000)
        assert not await queue.renew("early", "B", 9_000)
        assert ids(await queue.claim("shop", 1_250, 1_000, "B", 10)) == [("mid", 2)]
        # "mid" moved to token B: A's lease is gone and its writes do nothing.
        assert not await queue.renew("mid", "A", 9_000)
        await queue.delete("mid", "A")
        await queue.reschedule("mid", "A", 0, "stale")
        assert await queue.count("shop") == 3
        assert await queue.next_due("shop") == 2_249

        # B reschedules "mid" (lease dropped, due again at 400) and deletes "late".
        await queue.reschedule("mid", "B", 400, "boom")
        await queue.delete("late", "B")
        assert await queue.count("shop") == 2
        assert await queue.next_due("shop") == 400
        assert ids(await queue.claim("shop", 400, 1_000, "C", 10)) == [("mid", 3)]
        # "early" stays A's until 5,000; then both are claimable again.
        assert ids(await queue.claim("shop", 5_000, 1_000, "D", 10)) == [
            ("early", 2),
            ("mid", 4),
        ]
        assert ids(await queue.claim("other", 0, 1_000, "E", 10)) == [("elsewhere", 1)]
    finally:
        await queue.aclose()
        await queue.aclose()  # idempotent


async def test_a_reopened_durable_queue_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    queue = SqliteQueue(path)
    assert repr(queue) == f"SqliteQueue({str(path)!r})"
    await queue.open()
    await queue.insert("t", "shop", 0, b"{}")
    await queue.aclose()
    again = SqliteQueue(path)
    await again.open()
    try:
        assert await again.count() == 1
    finally:
        await again.aclose()


async def test_a_sqlite_queue_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    queue = SqliteQueue("queue.db")
    await queue.open()
    try:
        assert await queue.insert("t", "shop", 0, b"{}")
    finally:
        await queue.aclose()
    assert (tmp_path / "queue.db").exists()


async def test_a_file_that_is_not_a_database_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    path.write_bytes(b"this is not a sqlite database, just bytes " * 100)
    scheduler = DurableScheduler.sqlite(path)
    with pytest.raises(a2trio.A2Error) as caught:
        async with scheduler:
            pass
    assert caught.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    # The failed connection was closed, not leaked: the file can be replaced.
    os.remove(path)
    async with scheduler:
        assert await scheduler.queued() == 0
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_postgres_listener_that_cannot_connect_still_reports_started() -> None:
    queue = PostgresQueue("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.listen, Wakeups())
            nursery.cancel_scope.cancel()


@pytest.fixture
def database(request: pytest.FixtureRequest) -> str:
    """A fresh Postgres database (test_scheduler_durable's ``pg_dsn``)."""
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


async def test_a_postgres_listener_that_lost_its_connection_reconnects_and_wakes_everyone(
    database: str, mock_clock: trio.testing.MockClock
) -> None:
    queue = PostgresQueue(database)
    wakeups = Wakeups()
    wakeups.watch("shop")
    async with real_time_limit(30), trio.open_nursery() as nursery:
        await nursery.start(queue.listen, wakeups)
        woken = wakeups.arm("shop")
        with psycopg.connect(database, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
        # The listener notices, closes, and waits LISTEN_RETRY_S before reconnecting.
        await until(lambda: trio.lowlevel.current_statistics().seconds_to_next_deadline <= 1.0)
        assert not woken.is_set()
        mock_clock.jump(1.0)
        # Notifications may have been lost meanwhile: every armed key is woken.
        await woken.wait()
        assert wakeups.seq("shop") == 1
        nursery.cancel_scope.cancel()
