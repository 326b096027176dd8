"""examples/board_client.py against the board served in process."""

from __future__ import annotations

import pytest

import a2trio
from a2trio.stores import memory
from a2trio.transport import asgi
from examples.board import board, handlers
from examples.board_client import follow_board
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
    serving,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


@pytest.mark.parametrize("http", [False, True])
@guarded(30)
async def test_the_client_example_adds_a_task_and_folds_the_board(
    http: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    server = a2trio.Server(board, store=memory(), handlers=handlers)
    async with serving(asgi(server)) as base:
        tasks = await follow_board(base, "team-1", http=http, until_index=1)
        # Run twice: the client id replays the push, the fold starts over.
        again = await follow_board(base, "team-1", http=http, until_index=1)
    assert tasks == again == {"t-client": "Follow the board"}
    out = capsys.readouterr().out.splitlines()
    assert out == ["#1 ['Follow the board'] (Live(reconnects=0))"] * 2
