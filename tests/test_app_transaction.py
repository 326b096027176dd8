"""The app's own transaction (issue 35, the outbox): ``server.transaction()``.

On Postgres and SQLite an app's own rows and its events commit together or
not at all: visible, claimable and live only at the commit, gone after a
rollback, an exception, a cancellation or a crash (SIGKILL) inside the block;
the seed's verdicts and deterministic ids hold inside it; other appenders
wait for the sessions it holds. The memory and Redis stores refuse it with
``TRANSACTIONS_NOT_SUPPORTED``.
"""

from __future__ import annotations

import contextlib
import importlib
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio import A2Error, ErrorCode, SqlError
from a2trio.stores.base import AppendEvent, Store
from a2trio.stores.postgres import PostgresStore, postgres
from a2trio.stores.sqlite import sqlite
from a2trio.testing import TrioClock, open_harness

from .apps import Note, Ordered, Shipped, orders
from .backends.postgres import database_dsn, run_sql

ROOT = Path(__file__).resolve().parent.parent
#: Hang guard for what another process or a commit wakes; not a speed bound.
DEADLINE_S = 30.0


@dataclass
class Db:
    """A store on a fresh database of the backend, and how to reach it again."""

    backend: str
    store: Store
    #: The worker's arguments after the backend: where the store lives.
    where: list[str]

    def ph(self, n: int) -> str:
        """The backend's placeholder for the ``n``-th parameter."""
        return f"${n}" if self.backend == "postgres" else "?"

    def reopen(self) -> Store:
        """Another store on the same database (another process's view)."""
        if self.backend == "postgres":
            return postgres(self.where[0], schema=self.where[1])
        return sqlite(self.where[0])


@pytest.fixture(params=["postgres", "sqlite"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    backend = str(request.param)
    if backend == "postgres":
        dsn = await database_dsn()
        schema = f"s_{secrets.token_hex(6)}"
        store: Store = postgres(dsn, schema=schema)
        try:
            async with store:
                yield Db(backend, store, [dsn, schema])
        finally:
            await store.aclose()
            await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
    else:
        path = str(tmp_path / "outbox.db")
        async with sqlite(path) as store:
            yield Db(backend, store, [path])


async def create_orders(server: a2trio.Server) -> None:
    async with server.transaction() as tx:
        await tx.execute("create table app_orders (id text primary key, qty integer not null)")


async def app_orders(server: a2trio.Server) -> list[tuple[Any, ...]]:
    async with server.transaction() as tx:
        return await tx.fetch("select id, qty from app_orders order by id")


def ordered(item: str = "book", qty: int = 1, id: str | None = None) -> a2trio.AppendInput:
    return orders.event("ordered", Ordered(item, qty), id=id)


@asynccontextmanager
async def serving(db: Db, runs: list[str] | None = None) -> AsyncIterator[a2trio.Server]:
    """A server on the store whose ``ordered`` handler records each session."""

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if runs is not None:
            runs.append(ctx.session.id)

    async with a2trio.Server(orders, store=db.store, handlers={"ordered": ship}) as server:
        await create_orders(server)
        yield server


async def test_commit_writes_the_row_and_the_events_together_and_wakes_at_the_commit(
    db: Db,
) -> None:
    runs: list[str] = []
    async with serving(db, runs) as server:
        session = server.session("o1")
        async with session.stream() as feed:
            async with server.transaction() as tx:
                await tx.execute(
                    f"insert into app_orders values ({db.ph(1)}, {db.ph(2)})", ("o1", 2)
                )
                appended = await session.append(ordered(qty=2), transaction=tx)
                assert [(e.index, e.type) for e in appended] == [(1, "ordered")]
                # Its own statements see its rows; nobody else does yet.
                assert await tx.fetch("select id, qty from app_orders") == [("o1", 2)]
                assert await session.history() == []
                await server.settle()
                assert runs == []
                with trio.move_on_after(0.05):
                    await feed.receive()
                    raise AssertionError("the feed saw an uncommitted event")
            with trio.fail_after(DEADLINE_S):
                live = await feed.receive()
        assert (live.index, live.id) == (1, appended[0].id)
        assert [e.id for e in await session.history()] == [appended[0].id]
        assert await app_orders(server) == [("o1", 2)]
        with trio.fail_after(DEADLINE_S):
            await server.settle()
        assert runs == ["o1"]


async def test_an_exception_in_the_block_rolls_back_the_row_and_the_events(db: Db) -> None:
    runs: list[str] = []
    async with serving(db, runs) as server:
        session = server.session("o1")
        with pytest.raises(KeyError, match="out of stock"):
            async with server.transaction() as tx:
                await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o1",))
                await session.append(ordered(), orders.event("note", Note("x")), transaction=tx)
                raise KeyError("out of stock")
        assert await app_orders(server) == []
        assert await session.history() == []
        await server.settle()
        assert runs == []
        # The indexes it took are free again, and so is the session's lock.
        [again] = await session.append(ordered())
        assert again.index == 1
        with trio.fail_after(DEADLINE_S):
            await server.settle()
        assert runs == ["o1"]


async def test_a_cancelled_block_rolls_back_entirely(db: Db) -> None:
    async with serving(db) as server:
        session = server.session("o1")
        with trio.CancelScope() as scope:
            async with server.transaction() as tx:
                await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o1",))
                await session.append(ordered(), transaction=tx)
                scope.cancel()
                await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o2",))
        assert scope.cancelled_caught
        # Cancelled in flight, at every point of a short transaction.
        for n in range(12):
            with trio.move_on_after(n * 2e-4), contextlib.suppress(KeyError):
                async with server.transaction() as tx:
                    await session.append(ordered(id=f"c{n}"), transaction=tx)
                    await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", (f"c{n}",))
                    raise KeyError("rolled back")
        assert await app_orders(server) == []
        assert await session.history() == []


async def test_a_refused_statement_aborts_and_the_block_says_so(db: Db) -> None:
    async with serving(db) as server:
        session = server.session("o1")
        async with server.transaction() as tx:
            await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o1",))
        with pytest.raises(SqlError) as refused:
            async with server.transaction() as tx:
                await session.append(ordered(), transaction=tx)
                await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o1",))
        assert refused.value.code in ("23505", "SQLITE_CONSTRAINT_PRIMARYKEY")
        assert await session.history() == []
        if db.backend == "postgres":
            # Swallowed, the abort still rolls the block back, and says so.
            with pytest.raises(SqlError) as aborted:
                async with server.transaction() as tx:
                    await session.append(ordered(), transaction=tx)
                    with pytest.raises(SqlError):
                        await tx.execute("select * from no_such_table")
            assert aborted.value.code == "25P02"
            assert await session.history() == []
        for ends in ("commit", " ROLLBACK", "end", "begin", "rollback work"):
            with pytest.raises(ValueError, match="ends a transaction"):
                async with server.transaction() as tx:
                    await session.append(ordered(), transaction=tx)
                    await tx.execute(ends)
        async with server.transaction() as tx:
            await tx.execute("savepoint before")
            await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o2",))
            await tx.execute("rollback to savepoint before")
            await tx.execute("release savepoint before")
        assert await session.history() == []
        assert await app_orders(server) == [("o1", 1)]


async def test_deterministic_ids_and_the_seeds_verdicts_hold_inside_it(db: Db) -> None:
    async with serving(db) as server:
        session = server.session("o1")
        async with server.transaction() as tx:
            [first] = await session.append(ordered(id="o1-ordered"), transaction=tx)
            # A replay inside the same transaction answers its own row.
            [twin] = await session.append(ordered(id="o1-ordered"), transaction=tx)
            assert (twin.id, twin.index) == (first.id, first.index) == ("o1-ordered", 1)
            with pytest.raises(A2Error) as partial:
                await session.append(
                    ordered(id="o1-ordered"), ordered(id="o1-fresh"), transaction=tx
                )
            assert partial.value.code == ErrorCode.PARTIAL_DUPLICATE_BATCH
            # A verdict writes nothing and leaves the transaction usable.
            await tx.execute(f"insert into app_orders values ({db.ph(1)}, 1)", ("o1",))
        # After the commit another transaction's retry replays too.
        async with server.transaction() as tx:
            [replayed] = await session.append(ordered(id="o1-ordered"), transaction=tx)
        assert (replayed.id, replayed.index) == ("o1-ordered", 1)
        assert [e.id for e in await session.history()] == ["o1-ordered"]
        assert await app_orders(server) == [("o1", 1)]


async def test_concurrent_appenders_wait_for_the_sessions_it_holds(db: Db) -> None:
    """Others' appends to a session the transaction appended to index after
    it, at its commit; a rollback gives them its indexes."""
    async with serving(db) as server:
        s1, s2 = server.session("s1"), server.session("s2")
        done: list[tuple[str, int]] = []

        async def outside(session: a2trio.Session, text: str) -> None:
            [event] = await session.append(orders.event("note", Note(text)))
            done.append((text, event.index))

        async with trio.open_nursery() as nursery:
            async with server.transaction() as tx:
                await s1.append(orders.event("note", Note("in")), transaction=tx)
                for n in range(5):
                    nursery.start_soon(outside, s1, f"out{n}")
                await trio.sleep(0.2)
                if db.backend == "postgres":
                    # Another session's append does not wait for it, even
                    # with appends to the held session queued in this process.
                    with trio.fail_after(DEADLINE_S):
                        await outside(s2, "other")
                    assert done == [("other", 1)]
                assert [text for text, _ in done if text.startswith("out")] == []
        assert sorted(i for text, i in done if text.startswith("out")) == [2, 3, 4, 5, 6]
        history = await s1.history()
        assert [e.index for e in history] == [1, 2, 3, 4, 5, 6]
        assert history[0].payload == Note("in")

        async with trio.open_nursery() as nursery:
            with pytest.raises(KeyError):
                async with server.transaction() as tx:
                    await s2.append(orders.event("note", Note("gone")), transaction=tx)
                    nursery.start_soon(outside, s2, "after")
                    await trio.sleep(0.05)
                    raise KeyError("rolled back")
        history = await s2.history()
        assert [e.index for e in history] == list(range(1, len(history) + 1))
        assert history[-1].payload == Note("after")
        assert Note("gone") not in [e.payload for e in history]


async def test_an_append_outside_the_tasks_own_transaction_is_refused_not_hung(db: Db) -> None:
    async with serving(db) as server:
        session = server.session("o1")
        async with server.transaction() as tx:
            await session.append(ordered(), transaction=tx)
            with trio.fail_after(DEADLINE_S), pytest.raises(RuntimeError, match="transaction"):
                await session.append(ordered())
        assert [e.index for e in await session.history()] == [1]


async def test_other_processes_hear_the_appends_at_the_commit(db: Db) -> None:
    if db.backend != "postgres":
        pytest.skip("cross-process wake-up is Postgres's (store.pending)")
    other = db.reopen()
    heard: list[str] = []
    arrived = trio.Event()

    def on_session(key: str) -> None:
        heard.append(key)
        arrived.set()

    async with serving(db) as server, other:
        assert other.pending is not None
        stop = other.pending.watch_pending(on_session)
        try:
            assert isinstance(other, PostgresStore)
            await other.wait_listening()
            async with server.transaction() as tx:
                await server.session("held").append(ordered(), transaction=tx)
                # A commit after the append's insert is heard first.
                await server.session("marker").append(ordered())
                with trio.fail_after(DEADLINE_S):
                    while server.key("marker") not in heard:
                        arrived = trio.Event()
                        await arrived.wait()
                assert server.key("held") not in heard
            with trio.fail_after(DEADLINE_S):
                while server.key("held") not in heard:
                    arrived = trio.Event()
                    await arrived.wait()
        finally:
            stop()


async def test_a_crash_before_the_commit_leaves_nothing_behind(db: Db) -> None:
    async with serving(db):
        pass  # the table
    command = [sys.executable, "-m", "tests.outbox_worker", db.backend, *db.where, "o1"]
    process = await trio.lowlevel.open_process(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(DEADLINE_S):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                assert chunk, "the worker exited before its transaction was open"
                line += chunk
        assert line == b"ready\n"
        process.send_signal(signal.SIGKILL)
    finally:
        with trio.fail_after(DEADLINE_S):
            await process.wait()
    assert process.returncode == -signal.SIGKILL
    async with a2trio.Server(orders, store=db.reopen()) as after:
        session = after.session("o1")
        assert await session.history() == []
        assert await app_orders(after) == []
        # Its locks died with it: the session takes index 1 at once.
        with trio.fail_after(DEADLINE_S):
            [event] = await session.append(ordered())
        assert event.index == 1


async def test_misuse_is_refused_with_a_clear_error(db: Db) -> None:
    async with serving(db) as server:
        session = server.session("o1")
        async with server.transaction() as tx:
            with pytest.raises(TypeError, match="parameter"):
                await tx.execute(f"select {db.ph(1)}", ({"a": 1},))  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="transaction"):
                await session.append(ordered(), transaction=object())  # type: ignore[arg-type]
            async with a2trio.Server(orders, store=db.reopen()) as elsewhere:
                with pytest.raises(ValueError, match="not on the session's store"):
                    await elsewhere.session("o1").append(ordered(), transaction=tx)
            values = (
                "select $1::int, $2::text, $3::bytea, $4::float8, $5::bool"
                if db.backend == "postgres"
                else "select ?, ?, ?, ?, ?"
            )
            [row] = await tx.fetch(values, (1, "two", b"\x00\x03", 0.5, True))
            assert row == (1, "two", b"\x00\x03", 0.5, True)
        with pytest.raises(RuntimeError, match="over"):
            await tx.execute("select 1")
        with pytest.raises(RuntimeError, match="over"):
            await session.append(ordered(), transaction=tx)
        assert await session.history() == []


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_stores_without_app_transactions_say_so(backend: str) -> None:
    open_store = importlib.import_module(f"tests.backends.{backend}").open_store
    async with open_store(a2trio.SYSTEM_CLOCK) as store:
        async with a2trio.Server(orders, store=store) as server:
            with pytest.raises(A2Error) as refused:
                async with server.transaction():
                    raise AssertionError("unreachable")
    assert refused.value.code == ErrorCode.TRANSACTIONS_NOT_SUPPORTED
    assert type(store).__name__ in refused.value.message


def test_the_outbox_example_commits_one_order_and_replays_it(tmp_path: Path) -> None:
    def run() -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "outbox.py"), str(tmp_path / "shop.db")],
            cwd=tmp_path,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    first = run()
    assert "handler: confirming o-1" in first
    assert "rolled back: o-2: out of stock" in first
    assert "orders: [('o-1', 3)]" in first
    assert "o-1: ['ordered']" in first
    assert "o-2: []" in first
    second = run()
    assert "handler: confirming" not in second
    assert "o-1: ['ordered']" in second


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_an_unreachable_store_fails_the_block_with_store_unavailable(backend: str) -> None:
    open_unreachable = importlib.import_module(f"tests.backends.{backend}").open_unreachable_store
    async with open_unreachable(a2trio.SYSTEM_CLOCK) as store:
        server = a2trio.Server(orders, store=store)
        with trio.fail_after(DEADLINE_S), pytest.raises(A2Error) as failed:
            async with server.transaction():
                raise AssertionError("unreachable")
    assert failed.value.code == ErrorCode.STORE_UNAVAILABLE
    assert failed.value.__cause__ is not None


async def test_behind_a_transaction_mode_pooler_the_block_sets_the_schema_itself() -> None:
    """With ``pooler="transaction"`` no startup option carries the schema's
    ``search_path``: the transaction's first pipeline sets it for the whole
    block, so the app's unqualified tables and the events land in the
    store's schema."""
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema, pooler="transaction", listen=False)
    try:
        async with a2trio.Server(orders, store=store) as server:
            await create_orders(server)
            async with server.transaction() as tx:
                await tx.execute("insert into app_orders values ($1, 1)", ("o1",))
                await server.session("o1").append(ordered(), transaction=tx)
                [(path,)] = await tx.fetch("select current_setting('search_path')")
                assert schema in path
            assert [e.index for e in await server.session("o1").history()] == [1]
        assert await run_sql(dsn, f'select id, qty from "{schema}".app_orders') == [("o1", 1)]
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


async def test_a_memory_sqlite_store_shares_its_one_connection_with_the_block() -> None:
    """On ``":memory:"`` reads share the writer: a read from the block's own
    task would wait for itself and is refused; other tasks' reads wait."""
    async with a2trio.Server(orders, store=sqlite(":memory:")) as server:
        session = server.session("o1")
        seen: list[int] = []

        async def read() -> None:
            seen.extend(e.index for e in await session.history())

        async with trio.open_nursery() as nursery:
            async with server.transaction() as tx:
                await session.append(ordered(), transaction=tx)
                with pytest.raises(RuntimeError, match="holds the SQLite writer"):
                    await session.history()
                nursery.start_soon(read)
                await trio.sleep(0.05)
                assert seen == []
        assert seen == [1]


async def test_lanes_hold_for_events_appended_in_it(db: Db) -> None:
    """Events appended in a transaction keep their lanes: at the commit they
    run one at a time, in order, after the lane's older event."""
    runs: list[tuple[str, str]] = []
    started, release = trio.Event(), trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        runs.append(("start", ctx.event.payload.item))
        if ctx.event.payload.item == "first":
            started.set()
            await release.wait()
        runs.append(("end", ctx.event.payload.item))

    handlers = {"ordered": a2trio.handler(ship, lane="fifo")}
    async with a2trio.Server(orders, store=db.store, handlers=handlers) as server:
        session = server.session("o1")
        await session.append(ordered("first"))
        async with server.transaction() as tx:
            await session.append(ordered("second"), ordered("third"), transaction=tx)
        with trio.fail_after(DEADLINE_S):
            await started.wait()
        await trio.sleep(0.05)
        assert runs == [("start", "first")]
        release.set()
        with trio.fail_after(DEADLINE_S):
            await server.settle()
        assert runs == [
            ("start", "first"),
            ("end", "first"),
            ("start", "second"),
            ("end", "second"),
            ("start", "third"),
            ("end", "third"),
        ]


async def test_another_stores_group_commits_wait_for_the_held_session(db: Db) -> None:
    """Another process's group-committed appends (here another store on the
    database, its own group commit and pool) to a session the transaction
    holds wait for its commit and index after it; a rollback frees them to
    the indexes it took."""
    if db.backend != "postgres":
        pytest.skip("SQLite has no group commit: its one writer waits (the test above)")
    other = db.reopen()
    assert isinstance(other, PostgresStore)
    async with serving(db) as server, other:
        key = server.key("held")
        done: list[int] = []

        async def grouped(n: int) -> None:
            result = await other.append(key, [AppendEvent("note", {"text": f"g{n}"})])
            done.extend(e.index for e in result.events)

        for commit in (True, False):
            with trio.fail_after(DEADLINE_S):
                async with trio.open_nursery() as nursery:
                    with contextlib.suppress(KeyError):
                        async with server.transaction() as tx:
                            await server.session("held").append(ordered(), transaction=tx)
                            for n in range(8):
                                nursery.start_soon(grouped, n)
                            await trio.sleep(0.2)
                            assert len(done) == (0 if commit else 8)
                            if not commit:
                                raise KeyError("rolled back")
        # Committed: 1 then the others 2..9; rolled back: its 10 freed, 10..17.
        assert sorted(done) == list(range(2, 18))
        assert other.group_statistics().members >= 16


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_an_app_under_the_test_harness_uses_its_transaction(
    backend: str, mock_clock: trio.testing.MockClock
) -> None:
    """The harness's ``FaultyStore`` passes the app's transaction through,
    so an app that writes its rows with its events is tested as it runs."""

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    open_store = importlib.import_module(f"tests.backends.{backend}").open_store
    async with open_store(TrioClock()) as store:
        async with open_harness(orders, handlers={"ordered": ship}, store=store) as app:
            await create_orders(app.server)
            place = "insert into app_orders values ($1, 1)"
            if backend == "sqlite":
                place = place.replace("$1", "?")
            async with app.server.transaction() as tx:
                await tx.execute(place, ("o1",))
                await app.session("o1").append(ordered(), transaction=tx)
            await app.settle()
            await app.assert_log("o1", ["ordered", "shipped"])
            assert await app_orders(app.server) == [("o1", 1)]
            app.store.fail("append")
            # The store's own appends fail; the app's transaction is not injected.
            with pytest.raises(A2Error):
                await app.session("o2").append(ordered())
            async with app.server.transaction() as tx:
                await app.session("o2").append(ordered(), transaction=tx)
            await app.settle()
            await app.assert_log("o2", ["ordered", "shipped"])
