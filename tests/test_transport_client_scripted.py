"""The socket client against a scripted server: frames a real a2trio server
never sends (or sends only under faults), silences, and closes mid-request.

The server side is a bare trio-websocket server whose handler plays a script,
so each test decides exactly which frame the client sees next. Waits are on
frames and Trio events; the only timer is the client's own watchdog.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio_websocket

import a2trio
from a2trio.transport import wire
from a2trio.transport.client import open_client
from tests.test_transport import guarded

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")

Script = Callable[[trio_websocket.WebSocketConnection], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """Serve ``script`` for each accepted socket; yield the URL to connect to."""

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            await script(ws)
        except trio_websocket.ConnectionClosed:
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        )
        yield f"ws://127.0.0.1:{server.port}/orders/ws"
        nursery.cancel_scope.cancel()


async def next_frame(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await ws.get_message())
    return frame


async def send(ws: trio_websocket.WebSocketConnection, frame: dict[str, Any]) -> None:
    await ws.send_message(json.dumps(frame))


def event(session_id: str, index: int) -> dict[str, Any]:
    return {
        "kind": "event",
        "id": f"e-{index}",
        "type": "note",
        "payload": {"text": str(index)},
        "index": index,
        "sessionId": session_id,
        "createdAt": "2025-01-01T00:00:00.000Z",
    }


@guarded(20)
async def test_a_lane_iterates_until_the_server_ends_it_cleanly() -> None:
    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        subscribe = await next_frame(ws)
        assert subscribe == {"kind": "subscribe", "sessions": [{"id": "s1", "index": 3}]}
        await send(ws, {"kind": "subscribed", "sessionId": "s1"})
        # Frames for a session the client does not follow are ignored.
        await send(ws, event("other", 1))
        await send(ws, {"kind": "ping"})
        await send(ws, event("s1", 4))
        await send(
            ws,
            {
                "kind": "presence",
                "participant": "ann",
                "values": {"typing": True},
                "seen": 4,
                "at": "2025-01-01T00:00:00.000Z",
                "sessionId": "s1",
            },
        )
        await send(ws, {"kind": "presence-snapshot", "snapshot": {}, "sessionId": "s1"})
        await send(ws, {"kind": "unsubscribed", "sessionId": "s1"})
        assert await next_frame(ws) == {"kind": "bye"}

    async with scripted(script) as url, open_client(url) as client:
        async with client.subscribe("s1", start_after=3) as lane:
            frames = [frame async for frame in lane]
        assert [type(f) for f in frames] == [
            wire.EventFrame,
            wire.PresenceFrame,
            wire.PresenceSnapshotFrame,
        ]
        assert isinstance(frames[0], wire.EventFrame)
        assert (frames[0].session_id, frames[0].index) == ("s1", 4)
        # The lane ended on the server's word: leaving the block sends no unsubscribe.
        await client._ws.send_message(json.dumps({"kind": "bye"}))


@guarded(20)
async def test_a_lane_lost_with_a_reason_and_an_unintelligible_error() -> None:
    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        for _ in range(2):
            subscribe = await next_frame(ws)
            await send(ws, {"kind": "subscribed", "sessionId": subscribe["sessions"][0]["id"]})
        await send(ws, {"kind": "unsubscribed", "sessionId": "a", "reason": "kicked"})
        await send(
            ws,
            {
                "kind": "unsubscribed",
                "sessionId": "b",
                "reason": "refused",
                "error": {"code": "NOT_A_CODE", "message": "?"},
            },
        )
        await trio.sleep_forever()

    async with scripted(script) as url, open_client(url) as client:
        async with client.subscribe("a") as a:
            async with client.subscribe("b") as b:
                with pytest.raises(a2trio.A2Error) as kicked:
                    await a.receive()
                with pytest.raises(a2trio.A2Error) as garbled:
                    await b.receive()
    assert (kicked.value.code, kicked.value.message) == (
        a2trio.ErrorCode.STORE_UNAVAILABLE,
        "socket lost: kicked",
    )
    assert (garbled.value.code, garbled.value.message) == (
        a2trio.ErrorCode.STORE_UNAVAILABLE,
        "unintelligible subscription error",
    )


@guarded(20)
async def test_presence_patches_go_out_with_their_stamps() -> None:
    received: list[dict[str, Any]] = []
    done = trio.Event()

    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        received.extend([await next_frame(ws), await next_frame(ws)])
        done.set()
        await trio.sleep_forever()

    async with scripted(script) as url, open_client(url) as client:
        await client.set_presence("s1", "ann", {"typing": True})
        await client.set_presence("s1", "bob", {"typing": None}, seen=7, at_ms=1_000)
        await done.wait()
    assert received == [
        {"kind": "presence", "participant": "ann", "values": {"typing": True}, "sessionId": "s1"},
        {
            "kind": "presence",
            "participant": "bob",
            "values": {"typing": None},
            "sessionId": "s1",
            "seen": 7,
            "at": 1_000,
        },
    ]


@guarded(20)
async def test_a_socket_closed_before_the_ack_fails_the_push_and_everything_after() -> None:
    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        push = await next_frame(ws)
        assert push["kind"] == "push"
        await ws.aclose(code=1011, reason="crashed mid-push")

    async with scripted(script) as url, open_client(url) as client:
        with pytest.raises(a2trio.A2Error) as pushed:
            await client.push("s1", {"type": "note", "payload": {"text": "x"}, "id": "c-1"})
        assert pushed.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
        assert pushed.value.message.startswith("socket lost: ")
        assert "crashed mid-push" in pushed.value.message
        # Everything after fails the same way, without touching the socket.
        with pytest.raises(a2trio.A2Error, match="crashed mid-push"):
            await client.push("s1", {"type": "note", "payload": {"text": "y"}})
        with pytest.raises(a2trio.A2Error, match="crashed mid-push"):
            async with client.subscribe("s1"):
                pass
        # A presence patch (no ack) learns it from the closed socket itself.
        with pytest.raises(a2trio.A2Error) as patched:
            await client.set_presence("s1", "ann", {"typing": True})
        assert patched.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE


@guarded(20)
async def test_an_unintelligible_ack_fails_the_push_as_unavailable() -> None:
    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        first = await next_frame(ws)
        await send(ws, {"kind": "ack", "req": first["req"], "error": {"code": "??", "message": ""}})
        second = await next_frame(ws)
        await send(ws, {"kind": "ack", "req": second["req"]})
        await trio.sleep_forever()

    async with scripted(script) as url, open_client(url) as client:
        for _ in range(2):
            with pytest.raises(a2trio.A2Error) as failed:
                await client.push("s1", {"type": "note", "payload": {"text": "x"}})
            assert (failed.value.code, failed.value.message) == (
                a2trio.ErrorCode.STORE_UNAVAILABLE,
                "unintelligible ack",
            )


@guarded(20)
async def test_a_silent_server_trips_the_watchdog() -> None:
    async def script(ws: trio_websocket.WebSocketConnection) -> None:
        await next_frame(ws)
        await send(ws, {"kind": "subscribed", "sessionId": "s1"})
        await trio.sleep_forever()  # no pings, no frames

    async with scripted(script) as url, open_client(url, watchdog_s=0.2) as client:
        async with client.subscribe("s1") as lane:
            with pytest.raises(a2trio.A2Error) as silent:
                await lane.receive()
    assert (silent.value.code, silent.value.message) == (
        a2trio.ErrorCode.STORE_UNAVAILABLE,
        "socket lost: no frame for 0.2 s",
    )
    # Every later call fails with the same error.
    with pytest.raises(a2trio.A2Error) as after:
        await client.push("s1", {"type": "note", "payload": {"text": "x"}})
    assert after.value is silent.value


def test_a_close_reads_as_its_code_and_reason() -> None:
    from a2trio.transport.client import _closed

    assert _closed(None) == "closed"
    assert _closed(trio_websocket.CloseReason(1011, "boom")) == "1011 boom"
    assert _closed(trio_websocket.CloseReason(1001, None)) == "1001 GOING_AWAY"
