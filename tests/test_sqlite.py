"""The SQLite store beyond the conformance suite: files, schema versions,
cancellation, feeds across stores, ``:memory:``, and a server on top.

The conformance suite (``tests/test_conformance.py``) covers the operations'
semantics; these tests cover what only a file-backed, threaded store can get
wrong. Real files in ``tmp_path``, never a mocked database.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
import trio

import a2trio
from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent, ClaimRequest
from a2trio.stores.feed import adaptive_poll
from a2trio.stores.sqlite import SqliteStore, sqlite
from a2trio.stores.sqlite.conn import BUSY_TIMEOUT_S, ConnectionPool
from a2trio.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from a2trio.timings import Timings


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


class Cursor(msgspec.Struct, frozen=True):
    x: int
    y: int


orders = a2trio.contract("orders", events={"ordered": Ordered, "shipped": Shipped})
rooms = a2trio.contract("rooms", events={"shipped": Shipped}, presence={"cursor": Cursor})

#: Polling so slow that a delivery inside a test's deadline can only be a wake-up.
NO_POLLING = Timings(poll_active_s=600.0, poll_idle_s=600.0)
#: Polling fast enough for cross-store deliveries to land quickly.
FAST_POLLING = Timings(poll_active_s=0.01, poll_idle_s=0.05)
#: The bound on waits for a delivery: a hang guard, long enough for a loaded
#: machine (NO_POLLING, where it matters, leaves only the wake-up to come).
GUARD_S = 30


def _event(n: int, event_id: str | None = None) -> AppendEvent:
    return AppendEvent("ordered", {"item": f"item-{n}"}, event_id)


def _user_version(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("pragma user_version").fetchone()[0])
    finally:
        conn.close()


def _set_user_version(path: str, version: int) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"pragma user_version = {version}")
        conn.commit()
    finally:
        conn.close()


# -- files and schema ---------------------------------------------------------


async def test_construction_and_entering_do_no_io(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "dev.db"
    store = sqlite(str(path))
    assert store.path == str(path)
    async with store:
        assert not path.parent.exists()
        await store.append("s", [_event(1)])
        assert path.exists()


def test_relative_path_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite().path == str(tmp_path / ".a2" / "dev.db")
    assert sqlite(":memory:").path == ":memory:"


def test_rejects_an_empty_path() -> None:
    with pytest.raises(TypeError, match=r"^sqlite path must be a non-empty string, got ''$"):
        sqlite("")


def test_default_store_in_development_is_sqlite_at_dev_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    server = a2trio.Server(orders)
    assert isinstance(server.store, SqliteStore)
    assert server.store.path == str(tmp_path / ".a2" / "dev.db")
    assert not (tmp_path / ".a2").exists()


async def test_schema_is_versioned_and_reopening_keeps_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    async with sqlite(path) as first:
        await first.append("s", [_event(1, "e1")])
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION
    async with sqlite(path) as second:
        [row] = await second.read("s")
        assert (row.id, row.index) == ("e1", 1)
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION


def _database_at(path: str, version: int) -> None:
    """A database as the release at schema ``version`` wrote it, with one event."""
    conn = sqlite3.connect(path)
    try:
        for statements in MIGRATIONS[:version]:
            for statement in statements:
                conn.execute(statement)
        conn.execute(
            "insert into a2_events (session_id, idx, event_type, payload, event_id, created_at)"
            " values ('s', 1, 'ordered', '{\"item\":\"old\"}', 'old-1', 5)"
        )
        conn.execute(f"pragma user_version = {version}")
        conn.commit()
    finally:
        conn.close()


async def test_a_version_2_database_gains_the_trace_context_column(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_database_at, path, 2)
    async with sqlite(path) as store:
        traced = msgspec.structs.replace(_event(2, "new-2"), trace_context='{"traceparent":"x"}')
        await store.append("s", [traced])
        old, new = await store.read("s")
    assert (old.id, old.payload, old.trace_context) == ("old-1", {"item": "old"}, None)
    assert (new.id, new.trace_context) == ("new-2", '{"traceparent":"x"}')
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION


async def test_a_version_3_database_gains_the_not_before_column(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_database_at, path, 3)
    async with sqlite(path) as store:
        await store.append("s", [_event(2, "new-2")])
        await store.claim_available("s", holder="h", ttl_ms=1_000, limit=1)
        released = await store.release_attempt("s", index=2, attempt=1, delay_ms=5_000)
        old, new = await store.read("s")
    assert (old.id, old.not_before_ms) == ("old-1", None)
    assert released.not_before_ms is not None
    assert (new.id, new.not_before_ms) == ("new-2", released.not_before_ms)
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION


async def test_a_version_4_database_gains_the_version_column(tmp_path: Path) -> None:
    # Issue 35: events written before versions read as version None (1).
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_database_at, path, 4)
    async with sqlite(path) as store:
        await store.append("s", [msgspec.structs.replace(_event(2, "new-2"), version=2)])
        old, new = await store.read("s")
    assert (old.id, old.payload, old.version) == ("old-1", {"item": "old"}, None)
    assert (new.id, new.version) == ("new-2", 2)
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION


async def test_a_version_6_database_gains_the_failed_attempts_table(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_database_at, path, 6)
    async with sqlite(path) as store:
        assert store.inspect is not None
        assert await store.inspect.read_failures("s", [1]) == []
        await store.append("s", [_event(2, "new-2")], claim=ClaimRequest("h", 1_000))
        await store.fail_attempt("s", index=2, attempt=1, error="boom", max_failures=3)
        [failed] = await store.inspect.read_failures("s", [1, 2])
    assert (failed.index, failed.attempt, failed.error, failed.holder) == (2, 1, "boom", "h")


async def test_a_version_8_database_gains_the_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_database_at, path, 8)
    async with sqlite(path) as store:
        await store.append("s", [_event(2, "new-2")])
        await store.claim_available("s", holder="h", ttl_ms=1_000)
        await store.journal.write_step("s", index=2, attempt=1, name="charge", result=b"1")
        [entry] = await store.journal.read_journal("s", 2)
    assert (entry.name, entry.result, entry.attempt) == ("charge", b"1", 1)
    assert await trio.to_thread.run_sync(_user_version, path) == SCHEMA_VERSION


async def test_a_database_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    await trio.to_thread.run_sync(_set_user_version, path, SCHEMA_VERSION + 1)
    async with sqlite(path) as store:
        with pytest.raises(A2Error) as caught:
            await store.read("s")
    assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
    assert caught.value.message == (
        f"the sqlite database has schema version {SCHEMA_VERSION + 1}, newer than the "
        f"{SCHEMA_VERSION} this a2trio supports: upgrade a2trio or point the store at "
        "another file"
    )


async def test_a_corrupt_file_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "dev.db"
    await trio.to_thread.run_sync(path.write_bytes, b"definitely not sqlite" * 512)
    async with sqlite(str(path)) as store:
        with pytest.raises(A2Error) as caught:
            await store.append("s", [_event(1)])
    assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


# -- cancellation ------------------------------------------------------------


async def test_cancelled_append_waiting_on_another_writer_commits_nothing(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "dev.db")
    async with sqlite(path) as store:
        await store.append("s", [_event(1)])
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("begin immediate")
            # A busy wait inside SQLite would hold the cancelled call for the
            # whole busy timeout; the guard fails the test if it does.
            with trio.fail_after(BUSY_TIMEOUT_S / 2):
                with trio.move_on_after(0.2) as waiting:
                    await store.append("s", [_event(2, "never")])
            assert waiting.cancelled_caught
            blocker.execute("rollback")
        finally:
            blocker.close()
        assert [row.index for row in await store.read("s")] == [1]
        [row] = (await store.append("s", [_event(3, "later")])).events
        assert row.index == 2


async def test_cancelled_transaction_is_interrupted_and_rolled_back(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    insert = "insert into a2_snapshots values ('s', 'r', 1, '{}', 0)"
    # Counting to 10**9 takes minutes: only an interrupt ends it this soon.
    endless = (
        "with recursive n(i) as (select 1 union all select i + 1 from n where i < 1000000000) "
        "select count(*) from n"
    )

    def work(conn: sqlite3.Connection) -> None:
        conn.execute(insert)
        conn.execute(endless).fetchone()

    try:
        with trio.move_on_after(0.2) as cs:
            await pool.write(work)
        assert cs.cancelled_caught

        def count(conn: sqlite3.Connection) -> int:
            return int(conn.execute("select count(*) from a2_snapshots").fetchone()[0])

        assert await pool.read(count) == 0
        assert await pool.write(lambda conn: conn.execute(insert).rowcount) == 1
        assert await pool.read(count) == 1
    finally:
        await pool.aclose()


async def test_an_already_cancelled_call_never_touches_the_database(tmp_path: Path) -> None:
    async with sqlite(str(tmp_path / "dev.db")) as store:
        with trio.CancelScope() as cs:
            cs.cancel()
            await store.append("s", [_event(1)])
        assert cs.cancelled_caught
        assert await store.read("s") == []


# -- live feeds ----------------------------------------------------------------


async def test_own_append_wakes_a_feed_without_polling(tmp_path: Path) -> None:
    async with sqlite(str(tmp_path / "dev.db"), timings=NO_POLLING) as store:
        async with store.stream("s") as feed:
            # The pump's first read finds nothing; then only a wake-up can help.
            await trio.testing.wait_all_tasks_blocked()
            await store.append("s", [_event(1, "e1")])
            with trio.fail_after(GUARD_S):
                row = await feed.receive()
            assert row.id == "e1"
            assert store.feed_statistics().listeners == 1
        assert store.feed_statistics().listeners == 0


async def test_another_stores_append_reaches_a_feed_by_polling(tmp_path: Path) -> None:
    path = str(tmp_path / "dev.db")
    async with sqlite(path, timings=FAST_POLLING) as follower, sqlite(path) as writer:
        async with follower.stream("s") as feed:
            await writer.append("s", [_event(1, "e1"), _event(2, "e2")])
            with trio.fail_after(GUARD_S):
                ids = [(await feed.receive()).id, (await feed.receive()).id]
            assert ids == ["e1", "e2"]


def test_polling_backs_off_from_active_to_idle() -> None:
    poll = adaptive_poll(Timings(poll_active_s=0.025, poll_idle_s=0.2))
    waits = [poll(False) for _ in range(6)]
    assert waits == [0.025, 0.05, 0.1, 0.2, 0.2, 0.2]
    assert poll(True) == 0.025
    assert poll(False) == 0.025
    assert poll(False) == 0.05


# -- lifecycle -----------------------------------------------------------------


async def test_memory_database_lives_until_the_last_user_leaves() -> None:
    store = sqlite(":memory:")
    async with store:
        async with store:
            await store.append("s", [_event(1, "e1")])
        [row] = await store.read("s")
        assert row.id == "e1"
    with pytest.raises(trio.ClosedResourceError, match=r"^this ':memory:' sqlite store"):
        await store.read("s")
    await store.aclose()


async def test_file_store_reopens_after_close(tmp_path: Path) -> None:
    store = sqlite(str(tmp_path / "dev.db"))
    await store.append("s", [_event(1, "e1")])
    await store.aclose()
    await store.aclose()
    assert [row.id for row in await store.read("s")] == ["e1"]
    await store.aclose()


# -- a server on top -------------------------------------------------------------


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.Returned:
    return orders.event("shipped", Shipped(ctx.event.payload.item))


async def test_server_runs_handlers_and_streams_on_sqlite(tmp_path: Path) -> None:
    store = sqlite(str(tmp_path / "dev.db"))
    server = a2trio.Server(orders, store=store, handlers={"ordered": a2trio.handler(ship)})
    async with server:
        session = server.session("order-1")
        async with session.stream() as feed:
            await session.append(orders.event("ordered", Ordered("book")))
            with trio.fail_after(GUARD_S):
                first, second = await feed.receive(), await feed.receive()
        await server.settle()
        assert (first.type, first.index, second.type, second.index) == (
            "ordered",
            1,
            "shipped",
            2,
        )
        assert second.payload == Shipped("book")
        [trigger, _] = await store.read(server.key("order-1"))
        assert (trigger.processed_by_attempt, trigger.returned_event_ids) == (1, [second.id])
    assert store.feed_statistics().listeners == 0


async def test_presence_is_the_degraded_tier_on_sqlite(tmp_path: Path) -> None:
    store = sqlite(str(tmp_path / "dev.db"))
    assert store.presence.push is False
    store.presence.subscribe("s", lambda patch: None)()
    server = a2trio.Server(rooms, store=store, timings=FAST_POLLING)
    async with server:
        session = server.session("room-1")
        await session.set_presence("alice", {"cursor": Cursor(1, 2)}, at=10)
        async with session.stream(presence=True) as feed:
            with trio.fail_after(GUARD_S):
                snapshot = await feed.receive()
                assert isinstance(snapshot, a2trio.PresenceSnapshot)
                assert snapshot.snapshot["alice"]["cursor"].value == Cursor(1, 2)
                await session.set_presence("alice", {"cursor": Cursor(3, 4)}, at=20)
                patch = await feed.receive()
            assert patch == a2trio.PresencePatch("alice", {"cursor": Cursor(3, 4)}, 0, 20)


async def test_two_stores_on_one_file_append_without_gaps(tmp_path: Path) -> None:
    # Two stores have two writer connections: the file lock, not a Trio lock,
    # serializes them, as it does between processes.
    path = str(tmp_path / "dev.db")
    async with sqlite(path) as first, sqlite(path) as second:

        async def append_many(store: SqliteStore, tag: str) -> None:
            for n in range(50):
                await store.append("s", [_event(n, f"{tag}-{n}"), _event(n, f"{tag}-{n}-b")])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_many, first, "first")
            nursery.start_soon(append_many, second, "second")
        rows = await first.read("s")
    assert [row.index for row in rows] == list(range(1, 201))
    # Each batch is contiguous: a batch is one transaction.
    for pair in zip(rows[::2], rows[1::2], strict=True):
        assert pair[1].id == pair[0].id + "-b"
