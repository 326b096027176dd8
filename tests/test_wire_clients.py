"""The clients put on the wire exactly the bytes of ``tests/test_wire.py``'s
seed table: the socket client against a scripted server that records each
message, the HTTP clients against an httpx transport that records each body."""

from __future__ import annotations

import json

import httpx
import trio
import trio_websocket

from a2trio.transport import open_actor_client, open_client, open_http_client
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
)
from tests.test_transport_client_scripted import scripted


@guarded(10)
async def test_the_socket_client_sends_the_seed_up_frames() -> None:
    seen: list[str] = []
    unsubscribed = trio.Event()

    async def record(ws: trio_websocket.WebSocketConnection, conn: int) -> None:
        while True:
            message = str(await ws.get_message())
            seen.append(message)
            frame = json.loads(message)
            match frame["kind"]:
                case "push":
                    await ws.send_message(
                        json.dumps({"kind": "ack", "req": frame["req"], "events": []})
                    )
                case "subscribe":
                    sid = frame["sessions"][0]["id"]
                    await ws.send_message(json.dumps({"kind": "subscribed", "sessionId": sid}))
                case "unsubscribe":
                    unsubscribed.set()

    async with scripted(record) as url, open_client(url) as client:
        await client.push("s1", {"type": "note", "payload": {"text": "hi"}, "id": "e-1"})
        await client.set_presence("s1", "ann", {"cursor": 3})
        await client.set_presence("s1", "ann", {}, seen=2, at_ms=1000)
        async with client.subscribe("s1", start_after=4) as lane:
            await lane.wait_live()
        await unsubscribed.wait()
    assert seen == [
        '{"kind":"push","req":1,"events":[{"type":"note","payload":{"text":"hi"},"id":"e-1"}],'
        '"sessionId":"s1"}',
        '{"kind":"presence","participant":"ann","values":{"cursor":3},"sessionId":"s1"}',
        '{"kind":"presence","participant":"ann","values":{},"seen":2,"at":1000,"sessionId":"s1"}',
        '{"kind":"subscribe","sessions":[{"id":"s1","index":4}]}',
        '{"kind":"unsubscribe","sessions":["s1"]}',
    ]


async def test_the_http_clients_send_the_seed_bodies() -> None:
    bodies: list[bytes] = []

    def record(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        if request.url.path.startswith("/vault/"):
            return httpx.Response(200, json={"state": None, "index": 1})
        return httpx.Response(200, json={"events": []})

    transport = httpx.MockTransport(record)
    async with open_http_client("http://a2.invalid/orders", transport=transport) as client:
        await client.push("s1", {"type": "note", "id": "e-1"})
        await client.set_presence("s1", "ann", {"typing": True})
        await client.set_presence("s1", "ann", {}, seen=2, at_ms=1000)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://a2.invalid") as http,
        open_actor_client("http://a2.invalid", "vault", "alice", http=http) as alice,
    ):
        await alice.call("deposit", {"amount": 5}, id="m-1")
        await alice.call("close")
    assert bodies == [
        b'{"events":[{"type":"note","payload":null,"id":"e-1"}]}',
        b'{"presence":{"participant":"ann","values":{"typing":true}}}',
        b'{"presence":{"participant":"ann","values":{},"seen":2,"at":1000}}',
        b'{"event":"deposit","input":{"amount":5},"messageId":"m-1"}',
        b'{"event":"close","input":null}',
    ]
