"""The network lanes against a real hypercorn on a loopback port, with real clients.

httpx (on Trio through anyio) drives HTTP and SSE; trio-websocket drives
sockets. Each test runs under a Trio-clock ``fail_after`` guard against hangs;
nothing asserts on elapsed time.
"""

from __future__ import annotations

import functools
import gc
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, ParamSpec, TypeVar, cast

import httpx
import hypercorn.config
import hypercorn.trio
import hypercorn.typing
import msgspec
import pytest
import trio
import trio_websocket

import a2trio
from a2trio.scheduler import AppendTask, ScheduledEvent
from a2trio.serve import guard_hypercorn
from a2trio.stores import MemoryStore, memory
from a2trio.testing import FaultyStore
from a2trio.transport import Limits, Operation, Request, asgi, sign_task
from a2trio.transport.sse import SSEDecoder, SSEEvent

P = ParamSpec("P")
R = TypeVar("R")

# Client-side artifacts left to the garbage collector, never the server's:
# leaving an SSE response early leaves httpx's nested byte-stream generators
# unexhausted (closing the response has closed the connection), and
# trio-websocket's client never closes its TCP stream after a server-initiated
# close or a refused handshake (its reader stops on EOF without `aclose`).
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


@pytest.fixture(autouse=True)
def collect_client_garbage() -> Iterator[None]:
    """Collect those artifacts inside this module's filters, not in a later test."""
    yield
    gc.collect()


FAST = Limits(heartbeat_s=0.05, ping_s=0.05)


def guarded(seconds: float) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Fail a test that hangs, on the Trio clock (trio-websocket's pattern)."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with trio.fail_after(seconds):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


class Ordered(msgspec.Struct, frozen=True):
    item: str
    qty: int = 1


class Note(msgspec.Struct, frozen=True):
    text: str


class Cursor(msgspec.Struct, frozen=True):
    x: int
    y: int


orders = a2trio.contract("orders", events={"ordered": Ordered, "note": Note})
rooms = a2trio.contract("rooms", events={"note": Note}, presence={"cursor": Cursor})


@asynccontextmanager
async def serving(app: a2trio.transport.App) -> AsyncIterator[str]:
    """Serve ``app`` with hypercorn's trio worker on a free loopback port,
    guarded as ``python -m a2trio.serve`` guards it."""
    guard_hypercorn()
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.2
    config.loglevel = "WARNING"
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            functools.partial(
                hypercorn.trio.serve,
                cast("hypercorn.typing.ASGIFramework", app),
                config,
                shutdown_trigger=stop.wait,
            )
        )
        try:
            yield binds[0]
        finally:
            stop.set()


@asynccontextmanager
async def client(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, timeout=5) as c:
        yield c


def push_body(*events: dict[str, Any], presence: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"events": list(events)}
    if presence is not None:
        body["presence"] = presence
    return body


def ordered(item: str, id: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "ordered", "payload": {"item": item, "qty": 1}}
    if id is not None:
        event["id"] = id
    return event


def chunks_of(response: httpx.Response) -> aclosing[AsyncGenerator[bytes]]:
    """The body's chunks, closed when the block ends (an async generator in httpx)."""
    return aclosing(cast("AsyncGenerator[bytes]", response.aiter_bytes()))


async def sse_frames(response: httpx.Response) -> AsyncGenerator[SSEEvent]:
    decoder = SSEDecoder()
    async for chunk in response.aiter_bytes():
        for frame in decoder.feed(chunk):
            yield frame


async def history(c: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    response = await c.get(path)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def ws_url(base: str, path: str) -> str:
    return "ws" + base.removeprefix("http") + path


async def until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition the server reaches asynchronously (under the guard)."""
    while not predicate():  # noqa: ASYNC110 (the store has no event for its counters)
        await trio.sleep(0.01)


# -- push, history, stream ------------------------------------------------------------


@guarded(20)
async def test_push_answers_wire_events_and_repush_replays() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base, client(base) as c:
        body = push_body(ordered("book", "c-1"), ordered("pen", "c-2"))
        first = await c.post("/orders/s1", json=body)
        assert first.status_code == 200
        events = first.json()["events"]
        assert [(e["id"], e["index"], e["sessionId"]) for e in events] == [
            ("c-1", 1, "s1"),
            ("c-2", 2, "s1"),
        ]
        assert events[0]["payload"] == {"item": "book", "qty": 1}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", events[0]["createdAt"])
        again = await c.post("/orders/s1", json=body)
        assert again.status_code == 200
        assert again.json() == first.json()
        mixed = await c.post("/orders/s1", json=push_body(ordered("x", "c-2"), ordered("y", "c-3")))
        assert mixed.status_code == 400
        assert mixed.json()["error"]["code"] == "PARTIAL_DUPLICATE_BATCH"
        assert [e["id"] for e in await history(c, "/orders/s1")] == ["c-1", "c-2"]


@guarded(20)
async def test_history_bounds() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base, client(base) as c:
        await c.post("/orders/s1", json=push_body(*(ordered(f"i{n}") for n in range(5))))
        assert [e["index"] for e in await history(c, "/orders/s1?gte=2&lte=4")] == [2, 3, 4]
        assert [e["index"] for e in await history(c, "/orders/s1?gte=4")] == [4, 5]
        assert [e["index"] for e in await history(c, "/orders/s1?lte=1")] == [1]
        assert await history(c, "/orders/s1?lte=0") == []
        assert await history(c, "/orders/empty") == []
        for query in ("gte=3&lte=2", "gte=-1", "lte=x", "gte=1.5", "gte=99999999999999999"):
            response = await c.get(f"/orders/s1?{query}")
            assert response.status_code == 400, query
            assert response.json()["error"]["code"] == "INVALID_PAYLOAD"


@guarded(20)
async def test_sse_resumes_from_start_after_and_last_event_id_with_heartbeats() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, limits=FAST)) as base, client(base) as c:
        await c.post("/orders/s1", json=push_body(*(ordered(f"i{n}") for n in range(3))))
        sse = {"accept": "text/event-stream"}
        async with c.stream("GET", "/orders/s1?startAfter=1", headers=sse) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = b""
            received: list[SSEEvent] = []
            decoder = SSEDecoder()
            pushed = False
            async with chunks_of(response) as chunks:
                async for chunk in chunks:
                    raw += chunk
                    received += decoder.feed(chunk)
                    if len(received) == 2 and not pushed:
                        pushed = True
                        await c.post("/orders/s1", json=push_body(ordered("live")))
                    if len(received) == 3 and b": ping" in raw:
                        break
        assert [(f.event, f.id) for f in received] == [
            ("event", "2"),
            ("event", "3"),
            ("event", "4"),
        ]
        assert json.loads(received[2].data)["payload"]["item"] == "live"
        headers = {**sse, "last-event-id": "3"}
        async with c.stream("GET", "/orders/s1?startAfter=0", headers=headers) as response:
            async with aclosing(sse_frames(response)) as frames:
                resumed = await anext(frames)
                assert (resumed.event, resumed.id) == ("event", "4")


@guarded(20)
async def test_presence_push_and_two_plane_stream() -> None:
    server = a2trio.Server(rooms, store=memory())
    async with serving(asgi(server)) as base, client(base) as c:
        ann = {"participant": "ann", "values": {"cursor": {"x": 1, "y": 2}}}
        assert (await c.post("/rooms/r1", json={"presence": ann})).json() == {"events": []}
        sse = {"accept": "text/event-stream"}
        async with (
            c.stream("GET", "/rooms/r1?presence=1", headers=sse) as response,
            aclosing(sse_frames(response)) as frames,
        ):
            snapshot = await anext(frames)
            assert snapshot.event == "presence-snapshot"
            entry = json.loads(snapshot.data)["snapshot"]["ann"]["cursor"]
            assert entry["value"] == {"x": 1, "y": 2}
            assert entry["at"].endswith("Z")
            answer = await c.post(
                "/rooms/r1",
                json=push_body(
                    {"type": "note", "payload": {"text": "hi"}},
                    presence={"participant": "bob", "values": {"cursor": {"x": 3, "y": 4}}},
                ),
            )
            assert answer.status_code == 200
            seen: dict[str, Any] = {}
            while len(seen) < 2:
                frame = await anext(frames)
                seen[frame.event] = json.loads(frame.data)
            assert seen["event"]["payload"] == {"text": "hi"}
            assert seen["presence"]["participant"] == "bob"
            assert seen["presence"]["values"] == {"cursor": {"x": 3, "y": 4}}


# -- sockets ---------------------------------------------------------------------------


async def frame(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
    """The next frame that is not a ping."""
    while True:
        decoded: dict[str, Any] = json.loads(await ws.get_message())
        if decoded["kind"] != "ping":
            return decoded


@guarded(20)
async def test_single_socket_streams_and_acks() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, limits=FAST)) as base, client(base) as c:
        await c.post("/orders/s1", json=push_body(ordered("old")))
        url = ws_url(base, "/orders/s1/ws?startAfter=0")
        async with trio_websocket.open_websocket_url(url) as ws:
            first = await frame(ws)
            assert (first["kind"], first["index"], first["sessionId"]) == ("event", 1, "s1")
            assert json.loads(await ws.get_message()) in ({"kind": "ping"}, *[])  # pings flow
            await ws.send_message(json.dumps({"kind": "future-thing", "x": 1}))
            await ws.send_message(
                json.dumps({"kind": "push", "req": 7, "events": [ordered("new", "w-1")]})
            )
            got = [await frame(ws), await frame(ws)]
            ack = next(f for f in got if f["kind"] == "ack")
            live = next(f for f in got if f["kind"] == "event")
            assert (ack["req"], [e["id"] for e in ack["events"]]) == (7, ["w-1"])
            assert (live["id"], live["index"]) == ("w-1", 2)
            await ws.send_message(json.dumps({"kind": "push", "req": 8, "events": "nope"}))
            bad = await frame(ws)
            assert (bad["kind"], bad["req"], bad["error"]["code"]) == ("ack", 8, "INVALID_PAYLOAD")
            await ws.send_message(
                json.dumps({"kind": "push", "req": 9, "events": [{"type": "zap", "payload": {}}]})
            )
            unknown = await frame(ws)
            assert (unknown["req"], unknown["error"]["code"]) == (9, "UNKNOWN_EVENT_TYPE")
        assert [e["id"] for e in await history(c, "/orders/s1")][1:] == ["w-1"]


@guarded(20)
async def test_multiplexed_socket_lanes() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base, client(base) as c:
        await c.post("/orders/s2", json=push_body(ordered("s2-old")))
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as ws:
            await ws.send_message(
                json.dumps(
                    {"kind": "subscribe", "sessions": [{"id": "s1", "index": 0}, {"id": "s2"}]}
                )
            )
            got = [await frame(ws) for _ in range(3)]
            assert {(f["kind"], f["sessionId"]) for f in got} == {
                ("subscribed", "s1"),
                ("subscribed", "s2"),
                ("event", "s2"),
            }
            await c.post("/orders/s1", json=push_body(ordered("s1-new")))
            live = await frame(ws)
            assert (live["kind"], live["sessionId"], live["index"]) == ("event", "s1", 1)
            await ws.send_message(
                json.dumps({"kind": "push", "req": 1, "sessionId": "s3", "events": [ordered("s3")]})
            )
            ack = await frame(ws)
            assert (ack["kind"], ack["req"], ack["sessionId"]) == ("ack", 1, "s3")
            await ws.send_message(json.dumps({"kind": "push", "req": 2, "events": [ordered("x")]}))
            untagged = await frame(ws)
            assert (untagged["req"], untagged["error"]["code"]) == (2, "INVALID_PAYLOAD")
            await ws.send_message(json.dumps({"kind": "unsubscribe", "sessions": ["s1"]}))
            assert await frame(ws) == {"kind": "unsubscribed", "sessionId": "s1"}
            await c.post("/orders/s1", json=push_body(ordered("s1-unseen")))
            await c.post("/orders/s2", json=push_body(ordered("s2-new")))
            after = await frame(ws)
            assert (after["sessionId"], after["payload"]["item"]) == ("s2", "s2-new")
            await ws.send_message(json.dumps({"kind": "subscribe", "sessions": [{"id": "\x1f"}]}))
            refused = await frame(ws)
            assert refused["reason"] == "refused"
            assert refused["error"]["code"] == "INVALID_PAYLOAD"


@guarded(20)
async def test_socket_closes_on_unreadable_or_oversized_frames() -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=Limits(max_frame_bytes=200))
    async with serving(app) as base:
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as ws:
            await ws.send_message("{not json")
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await frame(ws)
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1007
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/s1/ws")) as ws:
            await ws.send_message("x" * 201)
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await frame(ws)
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1009


# -- authorization -------------------------------------------------------------------


@guarded(20)
async def test_authorize_refuses_each_operation() -> None:
    asked: list[tuple[str, str]] = []

    async def authorize(request: Request, op: Operation) -> bool:
        asked.append((type(op).__name__, op.session_id))
        return op.session_id != "secret" and request.headers.get("x-user") != "mallory"

    def validate_push(validation: a2trio.PushValidation) -> bool:
        return all(e.type != "note" for e in validation.events)

    server = a2trio.Server(orders, store=memory(), validate_push=validate_push)
    async with serving(asgi(server, authorize=authorize)) as base, client(base) as c:
        for response in (
            await c.post("/orders/secret", json=push_body(ordered("x"))),
            await c.get("/orders/secret"),
            await c.get("/orders/secret", headers={"accept": "text/event-stream"}),
            await c.post("/orders/s1", json=push_body(ordered("x")), headers={"x-user": "mallory"}),
            await c.post("/orders/s1", json=push_body({"type": "note", "payload": {"text": "t"}})),
        ):
            assert response.status_code == 403
            assert response.json()["error"]["code"] == "FORBIDDEN"
        with pytest.raises(trio_websocket.HandshakeError) as refused:
            async with trio_websocket.open_websocket_url(ws_url(base, "/orders/secret/ws")):
                pass
        assert isinstance(refused.value, trio_websocket.ConnectionRejected)
        assert refused.value.status_code == 403
        assert json.loads(refused.value.body or b"")["error"]["code"] == "FORBIDDEN"
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as ws:
            await ws.send_message(json.dumps({"kind": "subscribe", "sessions": [{"id": "secret"}]}))
            notice = await frame(ws)
            assert (notice["kind"], notice["reason"]) == ("unsubscribed", "forbidden")
            assert notice["error"]["code"] == "FORBIDDEN"
        assert {name for name, _ in asked} == {
            "PushOperation",
            "HistoryOperation",
            "StreamOperation",
            "SubscribeOperation",
        }
        assert await history(c, "/orders/s1") == []


# -- bad input, outages, cleanup ---------------------------------------------------------

NOTE = b'{"type":"note","payload":{"text":"t"}}'
BAD_PUSHES: list[tuple[bytes, int, str]] = [
    (b"{not json", 400, "INVALID_PAYLOAD"),
    (b"[]", 400, "INVALID_PAYLOAD"),
    (b"{}", 400, "INVALID_PAYLOAD"),
    (b'{"events": []}', 400, "INVALID_PAYLOAD"),
    (b'{"events": [{"type": 3}]}', 400, "INVALID_PAYLOAD"),
    (b'{"events": [{"type": "zap", "payload": {}}]}', 400, "UNKNOWN_EVENT_TYPE"),
    (b'{"events": [{"type": "ordered", "payload": {"item": 1}}]}', 400, "INVALID_PAYLOAD"),
    (
        b'{"events": [{"type": "ordered", "payload": {"item": "a"}, "id": ""}]}',
        400,
        "INVALID_PAYLOAD",
    ),
    (b'{"presence": {"participant": "a", "values": {"cursor": 1}}}', 400, "INVALID_PAYLOAD"),
    (
        b'{"events": [' + b",".join([b'{"type":"note","payload":{"text":"t"}}'] * 4) + b"]}",
        413,
        "INVALID_PAYLOAD",
    ),
    (
        b'{"events": [{"type": "note", "payload": {"text": "' + b"x" * 600 + b'"}}]}',
        413,
        "INVALID_PAYLOAD",
    ),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_PUSHES)
@guarded(20)
async def test_bad_pushes_answer_an_envelope_and_write_nothing(
    body: bytes, status: int, code: str
) -> None:
    server = a2trio.Server(orders, store=memory())
    limits = Limits(max_body_bytes=500, max_push_events=3)
    async with serving(asgi(server, limits=limits)) as base, client(base) as c:
        response = await c.post("/orders/s1", content=body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
        assert await history(c, "/orders/s1") == []


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope/s1", 404),
        ("GET", "/orders", 404),
        ("GET", "/orders/s1/extra", 404),
        ("GET", "/orders/a%1Fb", 400),
        ("PUT", "/orders/s1", 405),
        ("GET", "/_a2/scheduler", 404),
    ],
)
@guarded(20)
async def test_bad_routes(method: str, path: str, status: int) -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base, client(base) as c:
        response = await c.request(method, path)
        assert response.status_code == status
        assert response.json()["error"]["code"] == "INVALID_PAYLOAD"


@guarded(20)
async def test_store_outage_is_503() -> None:
    store = FaultyStore(memory())
    server = a2trio.Server(orders, store=store)
    async with serving(asgi(server)) as base, client(base) as c:
        with store.fail("append", "read"):
            pushed = await c.post("/orders/s1", json=push_body(ordered("x")))
            read = await c.get("/orders/s1")
        for response in (pushed, read):
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "STORE_UNAVAILABLE"
        assert await history(c, "/orders/s1") == []


@guarded(20)
async def test_disconnects_release_feeds_and_listeners() -> None:
    store = memory()
    server = a2trio.Server(orders, store=store)
    async with serving(asgi(server)) as base, client(base) as c:
        sse = {"accept": "text/event-stream"}
        async with (
            c.stream("GET", "/orders/s1", headers=sse) as response,
            chunks_of(response) as chunks,
        ):
            await anext(chunks)  # the stream is open
            async with trio_websocket.open_websocket_url(ws_url(base, "/orders/s2/ws")) as one:
                async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as many:
                    await many.send_message(
                        json.dumps({"kind": "subscribe", "sessions": [{"id": "a"}, {"id": "b"}]})
                    )
                    assert {(await frame(many))["sessionId"] for _ in range(2)} == {"a", "b"}
                    await c.post("/orders/s2", json=push_body(ordered("x")))
                    assert (await frame(one))["kind"] == "event"
                    assert _listeners(store) == 4
                await until(lambda: _listeners(store) == 2)
            await until(lambda: _listeners(store) == 1)
        await until(lambda: _listeners(store) == 0)


def _listeners(store: MemoryStore) -> int:
    return store.feed_statistics().listeners


# -- the scheduler route ------------------------------------------------------------------


@guarded(20)
async def test_scheduler_route_verifies_signatures() -> None:
    server = a2trio.Server(orders, store=memory())
    secret = "s3cret"
    task = AppendTask(
        "sched-1",
        "orders",
        "s1",
        0,
        [ScheduledEvent("e-1", "ordered", {"item": "later", "qty": 1})],
    )
    body = msgspec.json.encode(task)
    other = msgspec.json.encode(msgspec.structs.replace(task, contract="elsewhere"))
    now = int(time.time())
    async with serving(asgi(server, scheduler_secret=secret)) as base, client(base) as c:
        cases = [
            (body, {}, 401),
            (body, sign_task("wrong", body, now), 403),
            (body, sign_task(secret, body, now - 301), 403),
            (body, sign_task(secret, b"{}", now), 403),
            (b"{}", sign_task(secret, b"{}", now), 400),
            (other, sign_task(secret, other, now), 404),
        ]
        for content, headers, status in cases:
            response = await c.post("/_a2/scheduler", content=content, headers=headers)
            assert response.status_code == status, (headers, response.text)
            assert "error" in response.json()
        assert await history(c, "/orders/s1") == []
        for _ in range(2):  # delivering twice appends once
            delivered = await c.post(
                "/_a2/scheduler", content=body, headers=sign_task(secret, body)
            )
            assert delivered.status_code == 204
        assert [e["id"] for e in await history(c, "/orders/s1")] == ["e-1"]
