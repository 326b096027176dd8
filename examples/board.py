"""A small task board, served over HTTP and sockets.

Run it (the embedded sqlite store at ``.a2/dev.db``; ``--store memory:`` keeps
nothing)::

    python -m a2trio.serve examples.board:server

and open http://127.0.0.1:8000/ in a browser: the live board
(``examples/board_web/``, plain HTML and JavaScript). Add and remove tasks,
watch the estimates arrive, open a second tab to see each other's cursors.
The page pushes over HTTP, follows the board over SSE with ``presence=1``,
and keeps the board and its last index in ``localStorage``, so a reload
resumes with ``startAfter`` instead of reading the log again. Choose the board
and the name with ``/?board=team-2&as=ann``.

Or push a task and follow the board from a terminal::

    curl -X POST localhost:8000/board/team-1 \\
         -d '{"events": [{"type": "task_added", "payload": {"task_id": "t1", "title": "Ship it"}}]}'
    curl -N -H 'Accept: text/event-stream' 'localhost:8000/board/team-1?startAfter=0'

What happens: ``task_added`` wakes the ``estimate`` handler, which thinks for
``ESTIMATE_S`` seconds and then returns a ``task_estimated`` event (committed
atomically with its completion). If a ``task_removed`` for the same task lands
first, the handler is cancelled (``abort_on``) and estimates nothing. Handlers of
one board run in the ``"estimates"`` lane: one at a time, oldest first.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

import a2trio

__all__ = ["ESTIMATE_S", "PRESENCE_TTL_MS", "board", "handlers", "server", "static"]

#: How long the estimator takes: long enough to abort it by hand with curl.
ESTIMATE_S = 2.0
#: A viewer who stops refreshing (the page refreshes every 5 s) leaves after this.
PRESENCE_TTL_MS = 20_000


class TaskAdded(msgspec.Struct, frozen=True):
    task_id: str
    title: str


class TaskRemoved(msgspec.Struct, frozen=True):
    task_id: str


class TaskEstimated(msgspec.Struct, frozen=True):
    task_id: str
    points: int


class Cursor(msgspec.Struct, frozen=True):
    """Where a viewer's pointer is on the board, in thousandths of its size."""

    x: int
    y: int


board = a2trio.contract(
    "board",
    events={"task_added": TaskAdded, "task_removed": TaskRemoved, "task_estimated": TaskEstimated},
    # `viewing`: the task under the viewer's pointer, or "board".
    presence={"viewing": str, "cursor": Cursor},
)


async def estimate(ctx: a2trio.HandlerContext[TaskAdded]) -> a2trio.Returned:
    """Estimate a task: one point per word of its title, after some thought."""
    await trio.sleep(ESTIMATE_S)
    task = ctx.event.payload
    return board.event(
        "task_estimated", TaskEstimated(task.task_id, max(1, len(task.title.split())))
    )


def _same_task(
    removed: a2trio.Event[TaskRemoved], added: a2trio.Event[TaskAdded], _: dict[str, int]
) -> bool:
    return removed.payload.task_id == added.payload.task_id


handlers = {
    "task_added": a2trio.handler(estimate, lane="estimates", abort_on={"task_removed": _same_task}),
}

#: No store: ``A2_STORE`` picks one, else the default for ``A2_ENV``.
server = a2trio.Server(board, handlers=handlers, presence_ttl_ms=PRESENCE_TTL_MS)

#: The page, served at ``/`` by ``python -m a2trio.serve examples.board:server``
#: (``asgi(server, static=static)`` in an app of your own).
static = {"/": Path(__file__).with_name("board_web")}
