"""The socket client against a scripted server: frames a real a2trio server
never sends (or sends only under faults), silences, and closes mid-request.

The server side is a bare trio-websocket server whose handler plays a script
for each accepted socket (``conn`` counts them from 1), so each test decides
exactly which frame the client sees next. Waits are on frames and Trio events;
the only timers are the client's own watchdog and backoff.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio_websocket

import a2trio
from a2trio.transport import Connecting, ConnectionState, Lane, Live, Paused, open_client, wire
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
)

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


def state_of(lane: Lane) -> ConnectionState:
    """The lane's state, read fresh (mypy would narrow a property across awaits)."""
    return lane.connection.state


Script = Callable[[trio_websocket.WebSocketConnection, int], Awaitable[None]]
Calls = list[tuple[str, str | None, int]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """Serve ``script`` for each accepted socket; yield the URL to connect to."""
    accepted = itertools.count(1)

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            await script(ws, next(accepted))
        except trio_websocket.ConnectionClosed:
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        )
        yield f"ws://127.0.0.1:{server.port}/orders/ws"
        nursery.cancel_scope.cancel()


def recording(calls: Calls, answer: float | bool = False) -> Callable[..., float | bool]:
    def policy(session_id: str, error: a2trio.A2Error | None, attempt: int) -> float | bool:
        calls.append((session_id, error.message if error else None, attempt))
        return answer

    return policy


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


def note(text: str, id: str | None = None) -> dict[str, Any]:
    return {"type": "note", "payload": {"text": text}, **({"id": id} if id else {})}


@guarded(20)
async def test_a_clean_end_goes_to_the_policy_and_reconnect_resumes_from_the_index() -> None:
    subscribes: list[dict[str, Any]] = []

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        subscribes.append(await next_frame(ws))
        await send(ws, {"kind": "subscribed", "sessionId": "s1"})
        if len(subscribes) == 1:
            # Frames for a session the client does not follow are ignored,
            # and so are a replayed event and a ping.
            await send(ws, event("other", 1))
            await send(ws, {"kind": "ping"})
            await send(ws, event("s1", 4))
            await send(ws, event("s1", 4))
            await send(ws, {"kind": "presence-snapshot", "snapshot": {}, "sessionId": "s1"})
            await send(ws, {"kind": "unsubscribed", "sessionId": "s1"})
            subscribes.append(await next_frame(ws))
            await send(ws, {"kind": "subscribed", "sessionId": "s1"})
        await send(ws, event("s1", 5))
        await trio.sleep_forever()

    calls: Calls = []
    async with scripted(script) as url, open_client(url, reconnect=recording(calls)) as client:
        async with client.subscribe("s1", start_after=3) as lane:
            assert (await lane.receive()).index == 4  # type: ignore[union-attr]
            assert isinstance(await lane.receive(), wire.PresenceSnapshotFrame)
            state = await lane.connection.wait_for(lambda s: isinstance(s, Paused))
            assert state == Paused(1, None)
            assert calls == [("s1", None, 1)]
            client.reconnect()
            assert state_of(lane) == Connecting(1, None)
            assert (await lane.receive()).index == 5  # type: ignore[union-attr]
            assert state_of(lane) == Live(1)
    assert subscribes == [
        {"kind": "subscribe", "sessions": [{"id": "s1", "index": 3}]},
        {"kind": "subscribe", "sessions": [{"id": "s1", "index": 4}]},
    ]


@guarded(20)
async def test_a_lost_lane_resubscribes_alone_from_its_index() -> None:
    seen: list[dict[str, Any]] = []
    resubscribed = trio.Event()

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        for _ in range(2):
            subscribe = await next_frame(ws)
            sid = subscribe["sessions"][0]["id"]
            await send(ws, {"kind": "subscribed", "sessionId": sid})
            await send(ws, event(sid, 1))
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
        seen.extend([await next_frame(ws), await next_frame(ws)])
        resubscribed.set()
        await trio.sleep_forever()

    calls: Calls = []
    policy = recording(calls, 0.01)
    async with scripted(script) as url, open_client(url, reconnect=policy) as client:
        async with client.subscribe("a") as a, client.subscribe("b") as b:
            await a.receive()
            await b.receive()
            await resubscribed.wait()
    assert sorted(calls) == [
        ("a", "socket lost: kicked", 1),
        ("b", "unintelligible subscription error", 1),
    ]
    assert sorted(json.dumps(f) for f in seen) == sorted(
        json.dumps({"kind": "subscribe", "sessions": [{"id": sid, "index": 1}]}) for sid in "ab"
    )


@guarded(20)
async def test_a_gap_in_the_stream_counts_as_lost() -> None:
    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        for n in itertools.count():
            subscribe = await next_frame(ws)
            if subscribe["kind"] != "subscribe":
                return  # the lane's unsubscribe as it closes
            await send(ws, {"kind": "subscribed", "sessionId": "s1"})
            index = subscribe["sessions"][0]["index"]
            await send(ws, event("s1", index + (2 if n == 0 else 1)))

    calls: Calls = []
    async with scripted(script) as url, open_client(url, reconnect=recording(calls, 0)) as client:
        async with client.subscribe("s1") as lane:
            assert (await lane.receive()).index == 1  # type: ignore[union-attr]
    assert calls == [("s1", "gap in the stream: expected index 1, got 2", 1)]


@guarded(20)
async def test_presence_patches_go_out_with_their_stamps() -> None:
    received: list[dict[str, Any]] = []
    done = trio.Event()

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
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
async def test_a_push_whose_socket_closed_before_the_ack_is_retried_on_a_new_socket() -> None:
    pushes: list[dict[str, Any]] = []

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        push = await next_frame(ws)
        pushes.append(push)
        if conn == 1:
            await ws.aclose(code=1011, reason="crashed mid-push")
            return
        stored = [
            {**e, "index": 1, "sessionId": "s1", "createdAt": "2025-01-01T00:00:00.000Z"}
            for e in push["events"]
        ]
        await send(ws, {"kind": "ack", "req": push["req"], "events": stored})
        await trio.sleep_forever()

    async with scripted(script) as url, open_client(url) as client:
        [stored] = await client.push("s1", note("x"))
    first, second = pushes
    # The retry carries the same client-generated id: the server replays it.
    assert [e["id"] for e in first["events"]] == [e["id"] for e in second["events"]] == [stored.id]
    assert first["req"] != second["req"]


@guarded(20)
async def test_the_push_budget_is_three_attempts() -> None:
    connections: list[int] = []

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        connections.append(conn)
        await next_frame(ws)
        await ws.aclose(code=1011, reason="crashed mid-push")

    async with scripted(script) as url, open_client(url) as client:
        with pytest.raises(a2trio.A2Error) as pushed:
            await client.push("s1", note("x", "c-1"))
    assert pushed.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
    assert pushed.value.message == "socket lost: 1011 crashed mid-push"
    assert connections == [1, 2, 3]


@guarded(20)
async def test_unintelligible_acks_are_retried_and_refusals_are_not() -> None:
    reqs: list[int] = []

    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        while True:
            push = await next_frame(ws)
            reqs.append(push["req"])
            req = push["req"]
            if push["events"][0]["id"] == "refused":
                await send(
                    ws, {"kind": "ack", "req": req, "error": {"code": "FORBIDDEN", "message": "no"}}
                )
            elif len(reqs) == 1:
                await send(ws, {"kind": "ack", "req": req, "error": {"code": "??", "message": ""}})
            elif len(reqs) == 2:
                await send(ws, {"kind": "ack", "req": req})
            else:
                await send(ws, {"kind": "ack", "req": req, "events": []})

    async with scripted(script) as url, open_client(url) as client:
        assert await client.push("s1", note("x")) == []
        assert len(reqs) == 3
        with pytest.raises(a2trio.A2Error) as refused:
            await client.push("s1", note("y", "refused"))
        assert (refused.value.code, refused.value.message) == (a2trio.ErrorCode.FORBIDDEN, "no")
        assert len(reqs) == 4


@guarded(20)
async def test_a_silent_server_trips_the_watchdog_and_the_lane_reconnects() -> None:
    async def script(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        await next_frame(ws)
        await send(ws, {"kind": "subscribed", "sessionId": "s1"})
        if conn == 2:
            await send(ws, event("s1", 1))
        await trio.sleep_forever()  # no pings

    calls: Calls = []
    policy = recording(calls, 0)
    async with (
        scripted(script) as url,
        open_client(url, reconnect=policy, watchdog_s=0.2) as client,
    ):
        async with client.subscribe("s1") as lane:
            assert (await lane.receive()).index == 1  # type: ignore[union-attr]
            assert state_of(lane) == Live(1)
    assert calls == [("s1", "socket lost: no frame for 0.2 s", 1)]


@guarded(20)
async def test_refused_and_failed_connects_reach_the_policy() -> None:
    async def refuse(request: trio_websocket.WebSocketRequest) -> None:
        body = wire.encode_error(a2trio.A2Error(a2trio.ErrorCode.FORBIDDEN, "go away"))
        await request.reject(403, extra_headers=[(b"content-type", b"application/json")], body=body)

    calls: Calls = []
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(trio_websocket.serve_websocket, refuse, "127.0.0.1", 0, None)
        )
        url = f"ws://127.0.0.1:{server.port}/orders/ws"
        async with open_client(url, reconnect=recording(calls)) as client:
            async with client.subscribe("s1") as lane:
                with pytest.raises(a2trio.A2Error, match=r"^FORBIDDEN: go away$"):
                    await lane.wait_live()
            with pytest.raises(a2trio.A2Error, match="go away"):
                await client.push("s1", note("x"))
        nursery.cancel_scope.cancel()
    # Nothing listens there any more.
    async with open_client(url, reconnect=recording(calls)) as client:
        async with client.subscribe("s1") as lane:
            with pytest.raises(a2trio.A2Error, match=r"^STORE_UNAVAILABLE: cannot connect: "):
                await lane.wait_live()
    assert [call[0] for call in calls] == ["s1", "s1"]


def test_a_close_reads_as_its_code_and_reason() -> None:
    from a2trio.transport.client.client import _closed

    assert _closed(None) == "closed"
    assert _closed(trio_websocket.CloseReason(1011, "boom")) == "1011 boom"
    assert _closed(trio_websocket.CloseReason(1001, None)) == "1001 GOING_AWAY"
