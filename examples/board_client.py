"""Follow a board from another process: the Trio client, folded locally.

Serve the board, then run this against it::

    python -m a2trio.serve examples.board:server
    python -m examples.board_client http://localhost:8000 team-1

It adds a task, then follows the board over the multiplexed socket, folding
the log into the open tasks and printing each change with the connection's
state. Stop the server and start it again: the client reconnects by itself
(``Connecting(reconnects=1, ...)``) and resumes from the last index it saw,
so nothing is printed twice and nothing is missed. ``--http`` follows over
SSE instead (for networks that block WebSockets).
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

import a2trio
from a2trio.transport import Backoff, Client, HttpClient, open_client, open_http_client
from examples.board import board

__all__ = ["follow_board", "open_tasks"]


def _fold(tasks: dict[str, str], event: a2trio.Event[Any]) -> dict[str, str]:
    if event.type == "task_added":
        return {**tasks, event.payload.task_id: event.payload.title}
    if event.type == "task_removed":
        return {k: v for k, v in tasks.items() if k != event.payload.task_id}
    return tasks


#: The open tasks of a board, ``{task_id: title}``.
open_tasks: a2trio.Reducer[dict[str, str]] = a2trio.Reducer("open_tasks", {}, _fold)

#: Reconnect quickly while a developer restarts the server by hand.
POLICY = Backoff(base_s=0.2, cap_s=5.0)


async def follow_board(
    base_url: str, board_id: str, *, http: bool = False, until_index: int | None = None
) -> dict[str, str]:
    """Add a task to ``board_id``, then print the open tasks after every event.

    Returns the open tasks once the fold reaches ``until_index`` (never, by default).
    """
    task = {"type": "task_added", "payload": {"task_id": "t-client", "title": "Follow the board"}}
    opened: AbstractAsyncContextManager[Client | HttpClient]
    if http:
        opened = open_http_client(f"{base_url}/board", reconnect=POLICY)
    else:
        ws = "ws" + base_url.removeprefix("http")
        opened = open_client(f"{ws}/board/ws", reconnect=POLICY)
    async with opened as client:
        # The id makes the push idempotent: running this twice adds one task.
        await client.push(board_id, {**task, "id": f"{board_id}-t-client"})
        async with client.follow(board_id, open_tasks, contract=board) as fold:
            async for folded in fold:
                print(f"#{folded.index} {sorted(folded.state.values())} ({fold.lane.state})")
                if until_index is not None and folded.index >= until_index:
                    break
            return fold.state


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--http"]
    url, board_id = (args + ["http://localhost:8000", "team-1"][len(args) :])[:2]
    trio.run(lambda: follow_board(url, board_id, http="--http" in sys.argv))
