"""Shared session feeds: one store feed per session, readers at any pace."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine import fanout
from a2trio.stores import memory

from .apps import Note, orders


async def test_readers_share_one_store_feed_and_release_it_on_exit() -> None:
    store = memory()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("s1")
        await session.append(*(orders.event("note", Note(str(n))) for n in range(3)))
        async with session.stream(0) as first, session.stream(2) as second:
            assert store.feed_statistics().listeners == 1
            assert [(await first.receive()).index for _ in range(3)] == [1, 2, 3]
            assert (await second.receive()).index == 3
            await session.append(orders.event("note", Note("live")))
            with trio.fail_after(1):
                assert (await first.receive()).index == 4
                assert (await second.receive()).index == 4
        assert store.feed_statistics().listeners == 0


async def test_a_reader_far_behind_the_ring_reads_the_gap_from_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "RING", 4)
    store = memory()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("s1")
        async with session.stream(0) as fast, session.stream(0) as slow:
            for n in range(20):
                await session.append(orders.event("note", Note(str(n))))
                assert (await fast.receive()).index == n + 1
            # The ring holds only the last 4; the slow reader still gets all 20, in order.
            indexes = [(await slow.receive()).index for _ in range(20)]
        assert indexes == list(range(1, 21))
        assert store.feed_statistics().listeners == 0


async def test_a_late_reader_starting_before_the_pump_catches_up_in_order() -> None:
    store = memory()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("s1")
        await session.append(*(orders.event("note", Note(str(n))) for n in range(5)))
        async with session.stream(5) as live:
            await session.append(orders.event("note", Note("6")))
            assert (await live.receive()).index == 6
            async with session.stream(1) as late:
                assert [(await late.receive()).index for _ in range(5)] == [2, 3, 4, 5, 6]


async def test_readers_end_cleanly_when_the_server_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory()
    ended: list[str] = []
    # The reader runs in a task outside the server's block, as a transport's
    # stream does; the server closes under it by leaving its block. (It used
    # to cancel the server's nursery from inside the block, which cancelled
    # the test's body too: the assertion below never ran.)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async with a2trio.Server(orders, store=store) as server:
                feed_cm = server.session("s1").stream(0)
                feed = await feed_cm.__aenter__()

                async def read() -> None:
                    async for _ in feed:
                        pass
                    ended.append("clean")

                nursery.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()
        await feed_cm.__aexit__(None, None, None)
    assert ended == ["clean"]
