"""The example board's behaviour, on the memory store and Trio's mock clock."""

from __future__ import annotations

import trio

import a2trio
from a2trio.stores import memory
from examples.board import ESTIMATE_S, TaskAdded, TaskRemoved, board, handlers


def _server() -> a2trio.Server:
    return a2trio.Server(board, store=memory(clock=a2trio.TrioClock()), handlers=handlers)


async def test_a_task_gets_estimated_after_some_thought(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        session = server.session("team-1")
        await session.append(board.event("task_added", TaskAdded("t1", "ship the thing")))
        await server.settle()
        [added, estimated] = await session.history()
        assert (estimated.type, estimated.payload.points) == ("task_estimated", 3)
        assert (estimated.created_at - added.created_at).total_seconds() == ESTIMATE_S


async def test_removing_a_task_aborts_its_estimate(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        session = server.session("team-1")
        await session.append(
            board.event("task_added", TaskAdded("t1", "keep")),
            board.event("task_added", TaskAdded("t2", "drop me")),
        )
        await trio.sleep(ESTIMATE_S / 2)
        await session.append(board.event("task_removed", TaskRemoved("t2")))
        await server.settle()
        events = await session.history()
        assert [(e.type, e.payload.task_id) for e in events] == [
            ("task_added", "t1"),
            ("task_added", "t2"),
            ("task_removed", "t2"),
            ("task_estimated", "t1"),
        ]
