"""Concurrent ``state()`` calls coalesce into one ``read_states`` per store
round (the seed's batching; issue 23)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores.base import StateRead
from a2trio.stores.memory import MemoryStore

from .apps import Note, orders


class Counting(MemoryStore):
    def __init__(self) -> None:
        super().__init__(clock=a2trio.TrioClock())
        self.calls: list[tuple[str, Any]] = []
        self.fail = False

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        self.calls.append(("read_state", session_id))
        return await super().read_state(session_id, reducer)

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        self.calls.append(("read_states", sorted(session_ids)))
        if self.fail:
            await trio.lowlevel.checkpoint()
            raise a2trio.A2Error("STORE_UNAVAILABLE", "read states failed")
        return await super().read_states(session_ids, reducer)


def count() -> a2trio.Reducer[int]:
    return a2trio.Reducer("count", 0, lambda n, event: n + 1)


async def test_same_round_state_calls_are_one_read_states(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Counting()
    results: dict[str, tuple[int, int]] = {}
    async with a2trio.Server(orders, store=store) as server:
        for n, session in enumerate(("a", "b", "c")):
            await server.session(session).append(
                *(orders.event("note", Note(str(i))) for i in range(n + 1))
            )

        async def state(session: str) -> None:
            results[session] = await server.session(session).state(count())

        async with trio.open_nursery() as nursery:
            for session in ("a", "b", "c", "a"):
                nursery.start_soon(state, session)
        await server.settle()
        keys = sorted(server.key(s) for s in "abc")
        assert store.calls == [("read_states", keys)]
        assert results == {"a": (1, 1), "b": (2, 2), "c": (3, 3)}
        # A later round is a batch of its own.
        assert await server.session("a").state(count()) == (1, 1)
        assert store.calls[1:] == [("read_states", [server.key("a")])]


async def test_a_failed_batch_falls_back_to_the_log_and_a_closed_server_reads_directly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Counting()
    server = a2trio.Server(orders, store=store)
    async with server:
        await server.session("a").append(orders.event("note", Note("x")))
        store.fail = True
        assert await server.session("a").state(count()) == (1, 1)
        await server.settle()
    store.calls.clear()
    store.fail = False
    assert await server.session("a").state(count()) == (1, 1)
    assert store.calls == [("read_state", server.key("a"))]


async def test_a_cancelled_caller_leaves_the_batch_to_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Counting()
    async with a2trio.Server(orders, store=store) as server:
        await server.session("a").append(orders.event("note", Note("x")))
        got: list[tuple[int, int]] = []

        async def state() -> None:
            got.append(await server.session("a").state(count()))

        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as cancelled:
                cancelled.cancel()
                with pytest.raises(trio.Cancelled):
                    await server.session("a").state(count())
            nursery.start_soon(state)
        assert got == [(1, 1)]


def texts() -> a2trio.Reducer[dict[str, list[str]]]:
    def fold(state: dict[str, list[str]], event: a2trio.Event[Any]) -> dict[str, list[str]]:
        state["texts"].append(event.payload.text)  # mutates in place, as folds may
        return state

    return a2trio.Reducer("texts", {"texts": []}, fold)


async def test_same_round_callers_each_get_their_own_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Issue 29: the batch's one snapshot was every caller's starting state,
    # so a fold that mutates it in place folded each caller's tail into the
    # others' answers.
    store = Counting()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("a")
        await session.append(orders.event("note", Note("x")))
        assert await session.state(texts()) == ({"texts": ["x"]}, 1)
        await server.settle()  # the snapshot through 1 is written
        await session.append(orders.event("note", Note("y")))
        got: list[tuple[dict[str, list[str]], int]] = []

        async def state() -> None:
            got.append(await session.state(texts()))

        store.calls.clear()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(state)
        assert store.calls == [("read_states", [server.key("a")])]  # still one read
        assert got == [({"texts": ["x", "y"]}, 2)] * 3
        got[0][0]["texts"].append("mine")
        assert got[1][0] == got[2][0] == {"texts": ["x", "y"]}
        await server.settle()
