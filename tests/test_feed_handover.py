"""Local writes hand their rows to live feeds: no read when the rows continue a
feed's cursor, a read as before when they do not (counted reads)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores.base import AppendEvent, StoredEvent
from a2trio.stores.memory import MemoryStore
from a2trio.stores.postgres import ListenerStatistics
from a2trio.stores.postgres.conn import PgConnectionError

from .backends.postgres import database_dsn

#: No safety re-read within a test: only a wake-up can bring a row, so the
#: bounds on the Postgres feeds below are hang guards, as long as a loaded
#: machine needs (the default 10 s re-read would otherwise pass them anyway).
NO_SAFETY_READ = a2trio.Timings(notify_safety_s=3600)


class CountingReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__(clock=a2trio.TrioClock())
        self.reads = 0

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        self.reads += 1
        return await super().read(session_id, after_index=after_index, through_index=through_index)


def note(n: int) -> AppendEvent:
    return AppendEvent("note", {"n": n}, settled=True)


async def test_appended_rows_reach_a_feed_without_a_read() -> None:
    store = CountingReads()
    async with store, store.stream("s") as feed:
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == 1  # the catch-up read, empty
        for n in range(3):
            appended = await store.append("s", [note(n), note(n + 10)])
            got = [await feed.receive(), await feed.receive()]
            assert got == appended.events
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == 1


async def test_a_wake_up_without_rows_still_reads() -> None:
    # What a notification from another process looks like: after rows were
    # handed over, the next wake-up without rows must not be skipped.
    store = CountingReads()
    async with store, store.stream("s") as feed:
        await store.append("s", [note(0)])
        assert (await feed.receive()).index == 1
        await trio.testing.wait_all_tasks_blocked()
        reads = store.reads
        store._wakeups.notify("s")
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == reads + 1


async def test_feeds_see_every_row_once_however_writes_and_pumps_interleave() -> None:
    store = CountingReads()
    async with store:
        await store.append("s", [note(0)])
        async with store.stream("s", start_after=1) as behind, store.stream("s") as fresh:
            assert (await fresh.receive()).index == 1
            async with trio.open_nursery() as nursery:
                for n in range(1, 20):
                    nursery.start_soon(store.append, "s", [note(n)])
            assert [(await behind.receive()).index for _ in range(19)] == list(range(2, 21))
            assert [(await fresh.receive()).index for _ in range(19)] == list(range(2, 21))


async def test_postgres_feeds_skip_their_own_stores_notifications() -> None:
    # Notifications name the store that wrote: the writer's own are skipped
    # (its rows were handed over), another store's still mean a read.
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    writer = a2trio.stores.postgres(dsn, schema=schema, timings=NO_SAFETY_READ)
    other = a2trio.stores.postgres(dsn, schema=schema)
    reads = 0
    read = writer.read

    async def counting(
        session_id: str, *, after_index: int | None = None, through_index: int | None = None
    ) -> list[StoredEvent]:
        nonlocal reads
        reads += 1
        return await read(session_id, after_index=after_index, through_index=through_index)

    writer.read = counting  # type: ignore[method-assign]
    sentinel = trio.Event()

    def heard(session_id: str) -> None:
        if session_id == "sentinel":
            sentinel.set()

    async with writer, other, writer.stream("s") as feed:
        writer.pending.watch_pending(heard)
        await writer.wait_listening()
        for n in range(3):
            appended = await writer.append("s", [note(n)])
            assert await feed.receive() == appended.events[0]
        caught_up = reads
        # Notifications arrive in commit order: once the writer hears another
        # store's later commit, it has heard (and skipped) its own three.
        await other.append("sentinel", [note(0)])
        with trio.fail_after(60):
            await sentinel.wait()
        assert writer.listener_statistics() == ListenerStatistics(notifications=4, own=3)
        await trio.testing.wait_all_tasks_blocked()
        assert reads == caught_up
        await other.append("s", [note(3)])
        with trio.fail_after(60):
            assert (await feed.receive()).index == 4
        assert reads > caught_up


async def test_a_postgres_write_that_lost_its_answer_still_reaches_local_feeds() -> None:
    # The commit happened but the writer never learned it (here: its answer
    # was lost): nothing was handed over, and the notification is skipped as
    # the store's own, so the feed must be woken to read instead.
    dsn = await database_dsn()
    store = a2trio.stores.postgres(dsn, schema=f"s_{secrets.token_hex(6)}", timings=NO_SAFETY_READ)
    async with store, store.stream("s") as feed:
        await store.wait_listening()
        submit = store._writes._groups.submit

        async def answer_lost(*args: Any, **kwargs: Any) -> Any:
            await submit(*args, **kwargs)
            raise PgConnectionError("connection lost after the commit")

        store._writes._groups.submit = answer_lost  # type: ignore[method-assign]
        with pytest.raises(a2trio.A2Error):
            await store.append("s", [note(0)])
        with trio.fail_after(60):  # a hang guard
            assert (await feed.receive()).index == 1
