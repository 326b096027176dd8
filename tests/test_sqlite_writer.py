"""The SQLite writer's thread: group commit, per-write verdicts, cancellation.

A write that blocks inside the writer's thread (on a ``threading.Event``)
holds the thread, so the writes queued meanwhile are taken together as the
next batch. Real files in ``tmp_path``, real time (the thread is not Trio's to
jump), every wait bounded by a guard.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from a2trio.stores.base import AppendEvent
from a2trio.stores.group import GroupStatistics
from a2trio.stores.sqlite import sqlite
from a2trio.stores.sqlite.conn import ConnectionPool

#: A hang guard, long enough for a loaded machine.
GUARD_S = 30

INSERT = "insert into a2_snapshots values (?, 'r', 1, '{}', 0)"
Work = Callable[[sqlite3.Connection], object]


def _insert(session_id: str) -> Work:
    return lambda conn: conn.execute(INSERT, (session_id,)).rowcount


def _count(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("select session_id from a2_snapshots order by session_id").fetchall()
    return [str(session_id) for (session_id,) in rows]


@asynccontextmanager
async def _held_thread(pool: ConnectionPool) -> AsyncIterator[threading.Event]:
    """A write that holds the writer's thread until the yielded event is set."""
    entered, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(GUARD_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.write, hold)
        with trio.fail_after(GUARD_S):
            await trio.to_thread.run_sync(entered.wait, GUARD_S)
        yield release
        release.set()


async def test_writes_queued_together_commit_as_one_transaction(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    results: dict[str, object] = {}

    async def write(session_id: str) -> None:
        results[session_id] = await pool.write(_insert(session_id))

    try:
        await pool.write(lambda conn: None)
        async with _held_thread(pool) as release, trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(write, f"s{n}")
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert results == {f"s{n}": 1 for n in range(5)}
        assert await pool.read(_count) == [f"s{n}" for n in range(5)]
        # The opening write, the holding one, then the five in one transaction.
        assert pool.group_statistics() == GroupStatistics(3, 7, 5)
    finally:
        await pool.aclose()


async def test_a_failing_write_rolls_back_alone_and_the_batch_commits(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    outcomes: dict[str, object] = {}

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute(INSERT, ("bad",))
        raise ValueError("refused")

    async def write(session_id: str, work: Work) -> None:
        try:
            outcomes[session_id] = await pool.write(work)
        except (ValueError, sqlite3.IntegrityError) as exc:
            outcomes[session_id] = exc

    try:
        await pool.write(_insert("dup"))
        async with _held_thread(pool) as release, trio.open_nursery() as nursery:
            nursery.start_soon(write, "a", _insert("a"))
            nursery.start_soon(write, "bad", failing)
            # A duplicate key: SQLite's own error, rolled back to its savepoint too.
            nursery.start_soon(write, "dup", _insert("dup"))
            nursery.start_soon(write, "b", _insert("b"))
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert outcomes["a"] == outcomes["b"] == 1
        assert isinstance(outcomes["bad"], ValueError)
        assert isinstance(outcomes["dup"], sqlite3.IntegrityError)
        assert await pool.read(_count) == ["a", "b", "dup"]
        assert pool.group_statistics().largest == 2
    finally:
        await pool.aclose()


async def test_a_cancelled_queued_write_is_withdrawn_at_once(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    try:
        async with _held_thread(pool):
            with trio.fail_after(GUARD_S), trio.move_on_after(0.05) as waiting:
                await pool.write(_insert("never"))
            assert waiting.cancelled_caught
        assert await pool.read(_count) == []
    finally:
        await pool.aclose()


async def test_a_write_cancelled_once_running_returns_its_committed_result(
    tmp_path: Path,
) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    entered, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> int:
        entered.set()
        release.wait(GUARD_S)  # no statement runs: the interrupt finds nothing
        return int(conn.execute(INSERT, ("late",)).rowcount)

    try:
        with trio.fail_after(GUARD_S):
            async with trio.open_nursery() as nursery:
                got: list[int] = []

                async def write(scope: trio.CancelScope) -> None:
                    with scope:
                        got.append(await pool.write(slow))

                scope = trio.CancelScope()
                nursery.start_soon(write, scope)
                await trio.to_thread.run_sync(entered.wait, GUARD_S)
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                release.set()
        assert got == [1]
        assert await pool.read(_count) == ["late"]
    finally:
        await pool.aclose()


async def test_sequential_appends_each_commit_alone_and_close_ends_the_thread(
    tmp_path: Path,
) -> None:
    before = threading.active_count()
    store = sqlite(str(tmp_path / "dev.db"))
    for n in range(3):
        await store.append("s", [AppendEvent("ordered", {"n": n})])
    assert store.group_statistics() == GroupStatistics(3, 3, 1)
    assert threading.active_count() > before
    await store.aclose()
    assert threading.active_count() == before


@pytest.mark.parametrize("path", [":memory:", "file"])
async def test_an_app_transaction_keeps_queued_writes_out_of_its_block(
    tmp_path: Path, path: str
) -> None:
    store = sqlite(path if path == ":memory:" else str(tmp_path / "dev.db"))
    async with store:
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = trio.current_time() + GUARD_S
            async with store.transactions.begin() as tx:
                nursery.start_soon(store.append, "other", [AppendEvent("ordered", {"n": 0})])
                await trio.testing.wait_all_tasks_blocked()
                await tx.append("mine", [AppendEvent("ordered", {"n": 1})])
                # The other append waits for the block: not inside it, not yet written.
                assert await tx.fetch("select count(*) from a2_events") == [(1,)]
        # ... and it committed once the block did.
        assert [e.index for e in await store.read("other")] == [1]
        assert [e.index for e in await store.read("mine")] == [1]


async def test_a_write_that_ends_the_transaction_leaves_the_others_to_run_alone(
    tmp_path: Path,
) -> None:
    pool = ConnectionPool(str(tmp_path / "dev.db"))
    outcomes: dict[str, object] = {}

    def ending(conn: sqlite3.Connection) -> None:
        # What an interrupt or a full disk does: the whole transaction is gone.
        conn.execute("rollback")
        raise sqlite3.OperationalError("the transaction ended")

    async def write(session_id: str, work: Work) -> None:
        try:
            outcomes[session_id] = await pool.write(work)
        except sqlite3.OperationalError as exc:
            outcomes[session_id] = exc

    try:
        async with _held_thread(pool) as release, trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(write, name, _insert(name))
            nursery.start_soon(write, "ending", ending)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert outcomes["a"] == outcomes["b"] == outcomes["c"] == 1
        assert isinstance(outcomes["ending"], sqlite3.OperationalError)
        assert await pool.read(_count) == ["a", "b", "c"]
    finally:
        await pool.aclose()
