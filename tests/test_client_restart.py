"""The clients against a real served app that dies: ``python -m a2trio.serve``
in a subprocess on a SQLite file, SIGKILLed mid-stream and started again.

Between the clients and the server sits a small TCP proxy in the test process:
the server comes back on a new port and the proxy follows it, and the proxy can
drop the next answer the server sends and cut the connection (an ack lost after
the server committed). What is asserted is what the readers saw and what the
store holds (read back over the history lane, straight from the server).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import a2trio
from a2trio.transport import (
    Backoff,
    ConnectionState,
    Lane,
    Live,
    Paused,
    open_client,
    open_http_client,
    wire,
)
from tests.serve_kit import start_serve
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
)

EVENTS = 40
#: Quick retries: the server is back within a second or two.
QUICK = Backoff(base_s=0.05, cap_s=0.5)
#: How long a socket's handshake may take. A dead server costs nothing here
#: (the proxy closes at once), so this only has to outlast a loaded machine:
#: a handshake with a just-started server, beside other test suites, can take
#: over a second, and a reconnect the test counts on would become a spent try.
CONNECT_S = 30.0

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


def state_of(lane: Lane) -> ConnectionState:
    return lane.connection.state


class Served:
    """One ``python -m a2trio.serve`` process on the test's SQLite file."""

    def __init__(self, process: trio.Process, url: str) -> None:
        self.process = process
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])


@asynccontextmanager
async def serving(db: Path) -> AsyncIterator[list[Served]]:
    """Yield a list holding the running server; ``restart`` replaces it."""
    running: list[Served] = []
    try:
        running.append(await start(db))
        yield running
    finally:
        for served in running:
            if served.process.returncode is None:
                served.process.kill()
                await served.process.wait()


async def start(db: Path) -> Served:
    started = await start_serve(
        "tests.client_workers.app:server",
        *("--store", f"sqlite:///{db}", "--port", "0", "--gc-threshold", "0"),
    )
    return Served(started.process, started.url)


async def kill(served: Served) -> None:
    served.process.send_signal(signal.SIGKILL)
    await served.process.wait()


class Proxy:
    """Forwards each accepted connection to ``target`` (a port) on loopback."""

    def __init__(self) -> None:
        self.target: int | None = None
        self.drop_next_answer = False
        self.dropped = 0
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.target is None:
                return
            try:
                upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope, False)
                nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope, True)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        scope: trio.CancelScope,
        down: bool,
    ) -> None:
        try:
            while chunk := await source.receive_some():
                if down and self.drop_next_answer:
                    # The server committed and answered; the client never hears it.
                    self.drop_next_answer = False
                    self.dropped += 1
                    break
                await sink.send_all(chunk)
        except trio.BrokenResourceError:
            pass
        scope.cancel()


@asynccontextmanager
async def proxied(served: Served) -> AsyncIterator[Proxy]:
    proxy = Proxy()
    proxy.target = served.port
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()


async def stored(served: Served, session_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as c:
        response = await c.get(f"/notes/{session_id}")
        assert response.status_code == 200, response.text
        events: list[dict[str, Any]] = response.json()["events"]
        return events


def note(n: int) -> dict[str, Any]:
    return {"type": "note", "payload": {"n": n}, "id": f"note-{n}"}


@pytest.mark.parametrize("lane_kind", ["socket", "sse"])
@guarded(120)
async def test_a_server_killed_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path, lane_kind: str
) -> None:
    db = tmp_path / "notes.db"
    back = trio.Event()
    seen: list[wire.EventFrame] = []
    final: list[ConnectionState] = []
    async with serving(db) as running, proxied(running[0]) as proxy:
        base = f"127.0.0.1:{proxy.port}"
        async with (
            open_client(
                f"ws://{base}/notes/ws", reconnect=QUICK, connect_timeout_s=CONNECT_S
            ) as ws_client,
            open_http_client(f"http://{base}/notes", reconnect=QUICK) as http_client,
        ):
            subscribe = ws_client.subscribe if lane_kind == "socket" else http_client.subscribe

            async def write() -> None:
                # The writer pushes through the proxy too. A push that spends its
                # three attempts while the server is down is pushed again, with
                # the same id, once it is back: the log holds each note once.
                for n in range(1, EVENTS + 1):
                    while True:
                        try:
                            await http_client.push("s1", note(n))
                            break
                        except a2trio.A2Error as exc:
                            if exc.code is not a2trio.ErrorCode.STORE_UNAVAILABLE:
                                raise
                            await back.wait()
                    if n == EVENTS // 2:
                        await restarted.wait()

            async def read(lane: Lane) -> None:
                async for frame in lane:
                    if isinstance(frame, wire.EventFrame):
                        seen.append(frame)
                        if len(seen) == EVENTS // 4:
                            quarter.set()
                        if frame.index == EVENTS:
                            final.append(state_of(lane))
                            return

            restarted, quarter = trio.Event(), trio.Event()
            async with subscribe("s1") as lane, trio.open_nursery() as nursery:
                nursery.start_soon(write)
                nursery.start_soon(read, lane)
                await quarter.wait()
                await kill(running[0])  # mid-stream: the reader is a quarter in
                await lane.connection.wait_for(lambda s: s.status == "connecting")
                running.append(await start(db))
                proxy.target = running[-1].port
                back.set()
                restarted.set()
            [live] = final
            assert isinstance(live, Live)
            assert live.reconnects >= 1
        assert [f.index for f in seen] == list(range(1, EVENTS + 1))
        assert [f.id for f in seen] == [f"note-{n}" for n in range(1, EVENTS + 1)]
        assert [e["id"] for e in await stored(running[-1], "s1")] == [f.id for f in seen]


@guarded(120)
async def test_the_policy_paces_retries_pauses_and_reconnect_resumes(tmp_path: Path) -> None:
    calls: list[tuple[int, float, str | None]] = []
    delays = {1: 0.2, 2: 0.4}

    def policy(session_id: str, error: a2trio.A2Error | None, attempt: int) -> float | bool:
        calls.append((attempt, trio.current_time(), error.message if error else None))
        return delays.get(attempt, False)

    db = tmp_path / "notes.db"
    async with serving(db) as running, proxied(running[0]) as proxy:
        url = f"ws://127.0.0.1:{proxy.port}/notes/ws"
        async with (
            open_client(url, reconnect=policy, connect_timeout_s=CONNECT_S) as client,
            client.subscribe("s1") as lane,
        ):
            await client.push("s1", note(1))
            assert (await lane.receive()).index == 1  # type: ignore[union-attr]
            await kill(running[0])
            paused = await lane.connection.wait_for(lambda s: isinstance(s, Paused))
            assert isinstance(paused, Paused)
            assert paused.error is not None
            assert paused.error.code is a2trio.ErrorCode.STORE_UNAVAILABLE
            assert [c[0] for c in calls] == [1, 2, 3]
            # Each try waited at least the policy's delay (the first try right away).
            assert calls[1][1] - calls[0][1] >= 0.2
            assert calls[2][1] - calls[1][1] >= 0.4
            running.append(await start(db))
            proxy.target = running[-1].port
            # Paused: pushes do not resume the lane...
            await client.push("s1", note(2))
            assert isinstance(state_of(lane), Paused)
            # ...reconnect() does, from index 1, and attempt starts at 1 again.
            lane.reconnect()
            frame = await lane.receive()
            assert isinstance(frame, wire.EventFrame)
            assert (frame.index, frame.id) == (2, "note-2")
            assert state_of(lane) == Live(paused.reconnects)


@pytest.mark.parametrize("client_kind", ["socket", "http"])
@guarded(120)
async def test_a_push_whose_ack_was_lost_is_retried_once_and_stored_once(
    tmp_path: Path, client_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio.transport.client")
    async with serving(tmp_path / "notes.db") as running, proxied(running[0]) as proxy:
        base = f"127.0.0.1:{proxy.port}"
        opened = (
            open_client(f"ws://{base}/notes/ws", connect_timeout_s=CONNECT_S)
            if client_kind == "socket"
            else open_http_client(f"http://{base}/notes")
        )
        async with opened as client:
            await client.push("s1", note(1))  # the connection is open
            proxy.drop_next_answer = True
            [event] = await client.push("s1", note(2))
        assert (event.id, event.index) == ("note-2", 2)
        assert proxy.dropped == 1
        retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert len(retries) == 1, retries
        assert retries[0].startswith("push attempt 1 failed")
        assert [e["id"] for e in await stored(running[0], "s1")] == ["note-1", "note-2"]
