"""The ASGI app driven directly, message by message, on the autojump clock.

No sockets: each test plays the ASGI server's part (``receive``/``send``
through memory channels), so disconnects mid-body, a lifespan whose store
cannot open, feeds that fail or end mid-stream, and non-connect messages on a
socket are exact and instant.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores import memory
from a2trio.stores.memory import MemoryStore
from a2trio.transport import App, Limits, asgi

from .breaking_feeds import BreakingFeeds
from .test_transport import orders, rooms

Message = dict[str, Any]

#: No pings or SSE heartbeats get in the way of what a test reads.
QUIET = Limits(heartbeat_s=1000, ping_s=1000)


class Peer:
    """The ASGI server's side of one connection: what the app receives, what it sent."""

    def __init__(self) -> None:
        self._inbox_send, self._inbox = trio.open_memory_channel[Message](64)
        self._outbox_send, self._outbox = trio.open_memory_channel[Message](64)

    async def receive(self) -> Message:
        return await self._inbox.receive()

    async def send(self, message: Any) -> None:
        await self._outbox_send.send(dict(message))

    async def tell(self, message: Message) -> None:
        await self._inbox_send.send(message)

    async def heard(self) -> Message:
        return await self._outbox.receive()

    def nothing_sent(self) -> bool:
        return self._outbox.statistics().current_buffer_used == 0

    async def frame(self) -> dict[str, Any]:
        """The next socket text frame, decoded."""
        message = await self.heard()
        assert message["type"] == "websocket.send", message
        frame: dict[str, Any] = json.loads(message["text"])
        return frame


def http_scope(
    method: str, path: str, headers: Sequence[tuple[bytes, bytes]] = (), query: bytes = b""
) -> Message:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": list(headers),
        "query_string": query,
    }


def ws_scope(path: str, query: bytes = b"") -> Message:
    return {"type": "websocket", "path": path, "headers": [], "query_string": query}


@asynccontextmanager
async def running(app: App, scope: Message) -> AsyncIterator[Peer]:
    """Run one ASGI call of ``app`` for the block; cancelled at the end."""
    peer = Peer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, peer.receive, peer.send)
        yield peer
        nursery.cancel_scope.cancel()


async def call(app: App, scope: Message, *messages: Message) -> list[Message]:
    """Run one ASGI call to its end with ``messages`` to receive; what it sent."""
    peer = Peer()
    for message in messages:
        await peer.tell(message)
    await app(scope, peer.receive, peer.send)
    sent = []
    while not peer.nothing_sent():
        sent.append(await peer.heard())
    return sent


def answer(sent: list[Message]) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a whole HTTP answer."""
    [start, body] = sent
    assert start["type"] == "http.response.start"
    return start["status"], json.loads(body["body"])


def request(body: bytes, more: bool = False) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


def push(*events: dict[str, Any], presence: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"events": list(events)}
    if presence is not None:
        body["presence"] = presence
    return msgspec.json.encode(body)


# -- construction ------------------------------------------------------------------


def test_asgi_refuses_what_it_cannot_mount() -> None:
    one = a2trio.Server(orders, store=memory())
    with pytest.raises(TypeError, match=r"^asgi\(\) needs at least one a2trio.Server$"):
        asgi()
    with pytest.raises(TypeError, match=r"takes a2trio.Server objects, got 'orders'"):
        asgi("orders")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"two servers implement the contract 'orders'"):
        asgi(one, a2trio.Server(orders, store=memory()))
    reserved = a2trio.contract("_a2", events={"note": dict})
    with pytest.raises(ValueError, match=r"'_a2' is reserved"):
        asgi(a2trio.Server(reserved, store=memory()))
    with pytest.raises(ValueError, match=r"`scheduler_secret` must not be empty"):
        asgi(one, scheduler_secret=b"")
    both = asgi(one, a2trio.Server(rooms, store=memory()))
    assert repr(both) == "App(orders, rooms)"
    assert sorted(both.servers) == ["orders", "rooms"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_body_bytes", 0, "`max_body_bytes` must be a positive integer, got 0"),
        ("max_push_events", True, "`max_push_events` must be a positive integer, got True"),
        ("max_socket_sessions", 1.5, "`max_socket_sessions` must be a positive integer, got 1.5"),
        ("heartbeat_s", 0, "`heartbeat_s` must be positive seconds, got 0"),
        ("ping_s", "1", "`ping_s` must be positive seconds, got '1'"),
    ],
)
def test_limits_are_validated(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        Limits(**{field: value})


async def test_an_unknown_scope_type_is_ignored(autojump_clock: trio.testing.MockClock) -> None:
    app = asgi(a2trio.Server(orders, store=memory()))
    assert await call(app, {"type": "telepathy"}) == []


# -- lifespan ----------------------------------------------------------------------


class Unopenable(MemoryStore):
    async def __aenter__(self) -> MemoryStore:
        raise a2trio.A2Error("STORE_UNAVAILABLE", "the database is down")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise AssertionError("never opened, never closed")


async def test_lifespan_reports_a_server_that_cannot_open_and_closes_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = a2trio.Server(orders, store=memory())
    broken = a2trio.Server(rooms, store=Unopenable())
    sent = await call(asgi(first, broken), {"type": "lifespan"}, {"type": "lifespan.startup"})
    [failed] = sent
    assert failed["type"] == "lifespan.startup.failed"
    assert "the database is down" in failed["message"]
    # The server opened before the failure was closed again.
    with pytest.raises(RuntimeError, match="cannot reopen"):
        await first.__aenter__()


async def test_lifespan_opens_every_server_until_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server)
    async with running(app, {"type": "lifespan"}) as peer:
        await peer.tell({"type": "lifespan.startup"})
        assert await peer.heard() == {"type": "lifespan.startup.complete"}
        with pytest.raises(RuntimeError, match="already open"):
            await server.__aenter__()
        await peer.tell({"type": "lifespan.shutdown"})
        assert await peer.heard() == {"type": "lifespan.shutdown.complete"}
    with pytest.raises(RuntimeError, match="cannot reopen"):  # closed by the shutdown
        await server.__aenter__()


# -- http ------------------------------------------------------------------------


async def test_a_client_leaving_mid_body_gets_no_answer_and_nothing_is_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server)
    async with server:
        body = push({"type": "note", "payload": {"text": "hi"}})
        sent = await call(
            app,
            http_scope("POST", "/orders/s1"),
            request(body[:5], more=True),
            {"type": "http.disconnect"},
        )
        assert sent == []
        assert await server.session("s1").history() == []


async def test_bodies_over_the_limit_are_refused_declared_or_streamed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=Limits(max_body_bytes=64))
    async with server:
        declared = await call(
            app, http_scope("POST", "/orders/s1", [(b"content-length", b"65")]), request(b"")
        )
        streamed = await call(
            app,
            http_scope("POST", "/orders/s1"),
            request(b"x" * 40, more=True),
            request(b"x" * 40, more=True),
        )
        for sent in (declared, streamed):
            status, body = answer(sent)
            assert status == 413
            assert body["error"] == {
                "code": "INVALID_PAYLOAD",
                "message": "request bodies are limited to 64 bytes",
            }
        assert await server.session("s1").history() == []


async def test_the_scheduler_route_takes_only_post(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = asgi(a2trio.Server(orders, store=memory()), scheduler_secret="s3cret")
    sent = await call(app, http_scope("GET", "/_a2/scheduler"))
    assert sent[0]["status"] == 405
    assert (b"allow", b"GET, POST") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["message"] == "the scheduler route takes POST"


async def test_push_limits_and_an_empty_push(autojump_clock: trio.testing.MockClock) -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=Limits(max_push_events=2))
    note = {"type": "note", "payload": {"text": "x"}}
    async with server:
        too_many = await call(app, http_scope("POST", "/orders/s1"), request(push(*[note] * 3)))
        empty = await call(app, http_scope("POST", "/orders/s1"), request(push()))
        assert answer(too_many) == (
            413,
            {"error": {"code": "INVALID_PAYLOAD", "message": "a push carries at most 2 events"}},
        )
        assert answer(empty) == (
            400,
            {
                "error": {
                    "code": "INVALID_PAYLOAD",
                    "message": "a push needs at least one event or presence",
                }
            },
        )
        assert await server.session("s1").history() == []


BAD_PRESENCE = [
    ({"participant": "", "values": {}}, "presence participant must be a non-empty string, got ''"),
    (
        {"participant": "ann", "values": {}, "at": -1},
        "presence at must be epoch milliseconds in range, got -1",
    ),
    (
        {"participant": "ann", "values": {}, "seen": -2},
        "presence seen must be a non-negative integer up to 2**53 - 1, got -2",
    ),
    (
        {"participant": "ann", "values": {"mood": None}},
        "contract 'rooms' has no presence field 'mood'",
    ),
]


@pytest.mark.parametrize(("presence", "message"), BAD_PRESENCE)
async def test_a_bad_presence_half_writes_neither_half(
    presence: dict[str, Any], message: str, autojump_clock: trio.testing.MockClock
) -> None:
    server = a2trio.Server(rooms, store=memory())
    app = asgi(server)
    async with server:
        sent = await call(
            app,
            http_scope("POST", "/rooms/r1"),
            request(push({"type": "note", "payload": {"text": "x"}}, presence=presence)),
        )
        status, body = answer(sent)
        assert status == 400
        assert body["error"]["message"] == message
        assert body["error"]["code"] in ("INVALID_PAYLOAD", "UNKNOWN_PRESENCE_FIELD")
        assert await server.session("r1").history() == []
        assert await server.session("r1").presence() == {}


async def test_presence_on_a_contract_without_presence_is_refused_everywhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server)
    expected = "contract 'orders' declares no presence"
    async with server:
        pushed = await call(
            app,
            http_scope("POST", "/orders/s1"),
            request(push(presence={"participant": "ann", "values": {}})),
        )
        assert answer(pushed)[1]["error"]["message"] == f"{expected} fields"
        sse = await call(
            app,
            http_scope("GET", "/orders/s1", [(b"accept", b"text/event-stream")], b"presence=1"),
        )
        assert answer(sse)[1]["error"]["message"] == f"{expected}: drop presence=1"
        refused = await call(
            app, ws_scope("/orders/s1/ws", b"presence=1"), {"type": "websocket.connect"}
        )
        assert refused[0] == {
            "type": "websocket.http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json")],
        }
        assert json.loads(refused[1]["body"])["error"]["message"] == (
            f"{expected}: drop presence=1"
        )


# -- SSE with feeds that break -------------------------------------------------------


def sse_chunks(sent: list[Message]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


@pytest.mark.parametrize("ends", [True, False], ids=["feed-ends", "feed-fails"])
async def test_sse_ends_on_a_feed_that_ends_or_fails(
    ends: bool, autojump_clock: trio.testing.MockClock
) -> None:
    error = None if ends else a2trio.A2Error("STORE_UNAVAILABLE", "the feed's connection dropped")
    store = BreakingFeeds(breaks_on="ordered", error=error)
    server = a2trio.Server(orders, store=store)
    app = asgi(server, limits=QUIET)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("note", {"text": "first"}))
        sse = http_scope("GET", "/orders/s1", [(b"accept", b"text/event-stream")])
        async with running(app, sse) as peer:
            assert (await peer.heard())["status"] == 200
            assert (await peer.heard())["body"] == b": ok\n\n"
            assert b'"first"' in (await peer.heard())["body"]
            await session.append(orders.event("ordered", {"item": "book", "qty": 1}))
            last = await peer.heard()
            if ends:
                assert last == {"type": "http.response.body", "body": b""}
            else:
                assert last["body"].startswith(b"event: error\n")
                assert b"STORE_UNAVAILABLE" in last["body"]
                assert await peer.heard() == {"type": "http.response.body", "body": b""}
        assert store.broke_at == [0.0]


# -- sockets ---------------------------------------------------------------------------


async def test_socket_routes_refused_before_the_handshake(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = asgi(a2trio.Server(orders, store=memory()))
    refused = await call(app, ws_scope("/orders/s1/nope"), {"type": "websocket.connect"})
    assert refused[0]["status"] == 404
    assert json.loads(refused[1]["body"])["error"]["message"] == (
        "sockets are /{contract}/{session}/ws and /{contract}/ws"
    )
    # A client that went away before connecting gets nothing at all.
    for path in ("/orders/s1/nope", "/orders/s1/ws", "/orders/ws"):
        assert await call(app, ws_scope(path), {"type": "websocket.disconnect"}) == []


async def socket(peer: Peer) -> None:
    await peer.tell({"type": "websocket.connect"})
    assert await peer.heard() == {"type": "websocket.accept"}


async def send_frame(peer: Peer, frame: dict[str, Any]) -> None:
    await peer.tell({"type": "websocket.receive", "text": json.dumps(frame)})


@pytest.mark.parametrize("ends", [True, False], ids=["feed-ends", "feed-fails"])
async def test_a_single_session_socket_closes_when_its_feed_ends_or_fails(
    ends: bool, autojump_clock: trio.testing.MockClock
) -> None:
    error = None if ends else RuntimeError("driver bug")
    store = BreakingFeeds(breaks_on="ordered", error=error)
    server = a2trio.Server(orders, store=store)
    app = asgi(server, limits=QUIET)
    async with server, running(app, ws_scope("/orders/s1/ws")) as peer:
        await socket(peer)
        await server.session("s1").append(orders.event("ordered", {"item": "a", "qty": 1}))
        close = await peer.heard()
        if ends:
            assert close == {"type": "websocket.close", "code": 1001, "reason": "stream ended"}
        else:
            assert close == {
                "type": "websocket.close",
                "code": 1011,
                "reason": "stream failed (503)",
            }
        # The server waits for the client's side of the closing handshake.
        await peer.tell({"type": "websocket.disconnect"})


async def test_a_single_session_socket_pushes_and_drops_bad_presence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(rooms, store=memory())
    app = asgi(server, limits=Limits(max_push_events=1, heartbeat_s=1000, ping_s=1000))
    note = {"type": "note", "payload": {"text": "x"}}
    async with server, running(app, ws_scope("/rooms/r1/ws", b"presence=1")) as peer:
        await socket(peer)
        snapshot = await peer.frame()
        assert snapshot["kind"] == "presence-snapshot"
        await peer.tell({"type": "websocket.bogus"})  # not a receive: skipped
        await send_frame(peer, {"kind": "push", "req": 1, "events": [note], "sessionId": "r2"})
        await send_frame(peer, {"kind": "push", "req": 2, "events": []})
        await send_frame(peer, {"kind": "push", "req": 3, "events": [note, note]})
        errors = [(await peer.frame())["error"]["message"] for _ in range(3)]
        assert errors == [
            "this socket follows 'r1', not 'r2'",
            "a push frame needs at least one event",
            "a push carries at most 1 events",
        ]
        # A refused presence patch is dropped without an answer; a good one lands.
        await send_frame(
            peer, {"kind": "presence", "participant": "", "values": {"cursor": {"x": 1, "y": 2}}}
        )
        await send_frame(
            peer,
            {"kind": "presence", "participant": "ann", "values": {"cursor": {"x": 1, "y": 2}}},
        )
        patch = await peer.frame()
        assert (patch["kind"], patch["participant"]) == ("presence", "ann")
        assert await server.session("r1").history() == []
        assert list(await server.session("r1").presence()) == ["ann"]
        await peer.tell({"type": "websocket.disconnect"})


def by_session(frames: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Frames grouped by lane, in order (lanes interleave in any order)."""
    lanes: dict[str, list[dict[str, Any]]] = {}
    for frame in frames:
        lanes.setdefault(frame["sessionId"], []).append(frame)
    return lanes


async def test_multiplexed_lanes_end_resubscribe_and_are_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = BreakingFeeds(breaks_on="note", error=None, times=1)
    server = a2trio.Server(rooms, store=store)
    limits = Limits(max_socket_sessions=2, heartbeat_s=1000, ping_s=1000)
    app = asgi(server, limits=limits)

    def subscribe(*sessions: tuple[str, int]) -> dict[str, Any]:
        return {"kind": "subscribe", "sessions": [{"id": s, "index": i} for s, i in sessions]}

    async with server, running(app, ws_scope("/rooms/ws", b"presence=1")) as peer:
        await socket(peer)
        await send_frame(peer, subscribe(("a", 0), ("bad", -1)))
        lanes = by_session([await peer.frame() for _ in range(3)])
        assert lanes["a"] == [
            {"kind": "subscribed", "sessionId": "a"},
            {"kind": "presence-snapshot", "snapshot": {}, "sessionId": "a"},
        ]
        [refused] = lanes["bad"]
        assert (refused["kind"], refused["reason"], refused["error"]["message"]) == (
            "unsubscribed",
            "refused",
            "subscribe index must be a non-negative integer, got -1",
        )
        # Resubscribing replaces lane a; a third lane is over the limit.
        await send_frame(peer, subscribe(("a", 0), ("b", 0), ("c", 0)))
        lanes = by_session([await peer.frame() for _ in range(5)])
        assert {sid: [f["kind"] for f in frames] for sid, frames in lanes.items()} == {
            "a": ["subscribed", "presence-snapshot"],
            "b": ["subscribed", "presence-snapshot"],
            "c": ["unsubscribed"],
        }
        assert lanes["c"][0]["error"]["message"] == "a socket follows at most 2 sessions"
        # A presence frame on a multiplexed socket needs a sessionId: dropped.
        await send_frame(peer, {"kind": "presence", "participant": "ann", "values": {}})
        await send_frame(
            peer,
            {
                "kind": "presence",
                "participant": "ann",
                "values": {"cursor": {"x": 0, "y": 0}},
                "sessionId": "b",
                "seen": 0,
                "at": 1_735_689_600_000,
            },
        )
        patch = await peer.frame()
        assert (patch["kind"], patch["sessionId"], patch["participant"]) == (
            "presence",
            "b",
            "ann",
        )
        # Lane a's feed ends cleanly: only lane a is unsubscribed, b lives on.
        await server.session("a").append(rooms.event("note", {"text": "x"}))
        assert await peer.frame() == {"kind": "unsubscribed", "sessionId": "a"}
        assert store.broke_at == [0.0]
        await server.session("b").append(rooms.event("note", {"text": "still here"}))
        event = await peer.frame()
        assert (event["kind"], event["sessionId"], event["payload"]) == (
            "event",
            "b",
            {"text": "still here"},
        )
        await peer.tell({"type": "websocket.disconnect"})


async def test_a_multiplexed_lane_whose_feed_fails_is_lost_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    error = a2trio.A2Error("STORE_UNAVAILABLE", "the feed's connection dropped")
    store = BreakingFeeds(breaks_on="ordered", error=error)
    server = a2trio.Server(orders, store=store)
    app = asgi(server, limits=QUIET)
    async with server, running(app, ws_scope("/orders/ws")) as peer:
        await socket(peer)
        await send_frame(peer, {"kind": "subscribe", "sessions": [{"id": "a", "index": 0}]})
        assert await peer.frame() == {"kind": "subscribed", "sessionId": "a"}
        await send_frame(peer, {"kind": "subscribe", "sessions": [{"id": "b", "index": 0}]})
        assert await peer.frame() == {"kind": "subscribed", "sessionId": "b"}
        await server.session("a").append(orders.event("ordered", {"item": "x", "qty": 1}))
        assert await peer.frame() == {
            "kind": "unsubscribed",
            "sessionId": "a",
            "reason": "stream failed",
            "error": {"code": "STORE_UNAVAILABLE", "message": "the feed's connection dropped"},
        }
        await server.session("b").append(orders.event("ordered", {"item": "y", "qty": 1}))
        frame = await peer.frame()
        assert (frame["kind"], frame["sessionId"], frame["payload"]) == (
            "event",
            "b",
            {"item": "y", "qty": 1},
        )
        # Unsubscribing a lane the socket no longer follows is a no-op.
        await send_frame(peer, {"kind": "unsubscribe", "sessions": ["a", "b"]})
        assert await peer.frame() == {"kind": "unsubscribed", "sessionId": "b"}
        await peer.tell({"type": "websocket.disconnect"})
