"""The HTTP client (SSE streams, HTTP pushes, backscroll) against a real hypercorn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import a2trio
from a2trio.stores import memory, sqlite
from a2trio.transport import (
    Closed,
    ConnectionState,
    Lane,
    Limits,
    Live,
    Operation,
    Paused,
    Request,
    StreamOperation,
    asgi,
    open_http_client,
    wire,
)
from a2trio.transport.client.http_client import _frame
from a2trio.transport.sse import SSEEvent
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
    orders,
    rooms,
    serving,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

FAST = Limits(heartbeat_s=0.05, ping_s=0.05)


def state_of(lane: Lane) -> ConnectionState:
    return lane.connection.state


def ordered(item: str, id: str | None = None) -> dict[str, Any]:
    return {"type": "ordered", "payload": {"item": item}, **({"id": id} if id else {})}


def pause(session_id: str, error: a2trio.A2Error | None, attempt: int) -> bool:
    return False


@guarded(20)
async def test_push_subscribe_and_resume_with_last_event_id() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server, limits=FAST)) as base,
        open_http_client(f"{base}/orders") as client,
    ):
        [first] = await client.push("s 1", ordered("book", "c-1"))
        assert (first.id, first.index, first.session_id) == ("c-1", 1, "s 1")
        assert await client.push("s 1", ordered("book", "c-1")) == [first]
        with pytest.raises(a2trio.A2Error) as unknown:
            await client.push("s 1", {"type": "zap", "payload": {}})
        assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_EVENT_TYPE
        async with client.subscribe("s 1") as lane:
            assert await lane.wait_live() == Live(0)
            frame = await lane.receive()
            assert isinstance(frame, wire.EventFrame)
            assert (frame.id, frame.index) == ("c-1", 1)
            # A write outside the client, then reconnect(): a fresh GET from index 1.
            await server.session("s 1").append(orders.event("ordered", {"item": "b"}))
            client.reconnect()
            assert (await lane.receive()).index == 2  # type: ignore[union-attr]
            await lane.connection.wait_for(lambda s: s == Live(1))
            [third] = await client.push("s 1", ordered("c"))
            assert (await lane.receive()).index == third.index == 3  # type: ignore[union-attr]
            with pytest.raises(RuntimeError, match="already follows"):
                async with client.subscribe("s 1"):
                    pass
        assert state_of(lane) == Closed()


class _WritesElsewhere(httpx.AsyncBaseTransport):
    """Sends POSTs to another server (another process's store on the same file)."""

    def __init__(self, writes: str) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._writes = httpx.URL(writes)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            request.url = request.url.copy_with(port=self._writes.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@guarded(20)
async def test_a_push_refreshes_a_stream_that_has_not_seen_it(tmp_path: Path) -> None:
    # The stream's server polls its store once an hour and is not woken by the
    # write (another store instance makes it, as another process would): only
    # the client's refresh after its own push can deliver the event.
    db = str(tmp_path / "a2.db")
    hourly = a2trio.Timings(poll_active_s=3600.0, poll_idle_s=3600.0)
    streams = a2trio.Server(orders, store=sqlite(db, timings=hourly))
    writes = a2trio.Server(orders, store=sqlite(db))
    async with (
        serving(asgi(streams, limits=FAST)) as stream_base,
        serving(asgi(writes)) as write_base,
        open_http_client(f"{stream_base}/orders", transport=_WritesElsewhere(write_base)) as client,
        client.subscribe("s1") as lane,
    ):
        assert await lane.wait_live() == Live(0)
        [mine] = await client.push("s1", ordered("book"))
        frame = await lane.receive()
        assert isinstance(frame, wire.EventFrame)
        assert (frame.id, frame.index) == (mine.id, 1)
        assert await lane.wait_live() == Live(1)
        [again] = await client.push("s1", ordered("pen"))
        assert (await lane.receive()).index == again.index == 2  # type: ignore[union-attr]


@guarded(20)
async def test_a_revoked_stream_reconnects_and_is_asked_again() -> None:
    allowed = {"s1": True}

    def authorize(request: Request, op: Operation) -> bool:
        return not isinstance(op, StreamOperation) or allowed[op.session_id]

    errors: list[a2trio.ErrorCode | None] = []

    def policy(session_id: str, error: a2trio.A2Error | None, attempt: int) -> float | bool:
        errors.append(error.code if error else None)
        return 0.01 if len(errors) == 1 else False

    server = a2trio.Server(orders, store=memory())
    app = asgi(server, authorize=authorize)
    async with (
        serving(app) as base,
        open_http_client(f"{base}/orders", reconnect=policy) as client,
        client.subscribe("s1") as lane,
    ):
        await lane.wait_live()
        await client.push("s1", ordered("a"))
        assert (await lane.receive()).index == 1  # type: ignore[union-attr]
        allowed["s1"] = False
        assert app.revoke(lambda request, op: True) == 1
        # The revoked stream ends with FORBIDDEN (resumable); the retry is refused (403).
        with pytest.raises(a2trio.A2Error) as refused:
            await lane.connection.wait_for(lambda s: isinstance(s, Paused))
            await lane.wait_live()
        assert refused.value.code is a2trio.ErrorCode.FORBIDDEN
        assert errors == [a2trio.ErrorCode.FORBIDDEN, a2trio.ErrorCode.FORBIDDEN]
        allowed["s1"] = True
        await client.push("s1", ordered("b"))
        lane.reconnect()
        assert (await lane.receive()).index == 2  # type: ignore[union-attr]


@guarded(20)
async def test_presence_repaints_and_follow_folds() -> None:
    reducer = a2trio.Reducer("count", 0, lambda n, e: n + 1)
    server = a2trio.Server(rooms, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_http_client(f"{base}/rooms") as client,
    ):
        await client.set_presence("r1", "ann", {"cursor": {"x": 1, "y": 2}}, seen=0, at_ms=1_000)
        with pytest.raises(a2trio.A2Error) as unknown:
            await client.set_presence("r1", "ann", {"nope": 1})
        assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_PRESENCE_FIELD
        async with client.subscribe("r1", presence=True) as lane:
            snapshot = await lane.receive()
            assert isinstance(snapshot, wire.PresenceSnapshotFrame)
            assert lane.presence["ann"]["cursor"].value == {"x": 1, "y": 2}
            await client.set_presence("r1", "bob", {"cursor": {"x": 0, "y": 0}})
            assert isinstance(await lane.receive(), wire.PresenceFrame)
            assert set(lane.presence) == {"ann", "bob"}
            lane.presence.clear()
            lane.reconnect()
            assert isinstance(await lane.receive(), wire.PresenceSnapshotFrame)
            assert set(lane.presence) == {"ann", "bob"}
        async with client.follow("r1", reducer, contract=rooms) as fold:
            await client.push("r1", {"type": "note", "payload": {"text": "hi"}})
            folded = await anext(fold)
            assert (folded.state, folded.index) == (1, 1)


@guarded(20)
async def test_load_history_pages_backward_merged_and_complete_at_index_one() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_http_client(f"{base}/orders") as client,
    ):
        with pytest.raises(ValueError, match=r"nothing of 's1' is loaded or followed: pass"):
            await client.load_history("s1")
        for batch in range(5):
            await client.push("s1", *(ordered(f"{batch}-{n}") for n in range(10)))
        async with client.subscribe("s1", start_after=45) as lane:
            while lane.index < 50:
                await lane.receive()
            # Two calls at once: serialized, so the second pages on from the first.
            pages: list[list[int]] = []

            async def load() -> None:
                page = await client.load_history("s1", limit=20)
                pages.append([e.index for e in page.events])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(load)
                nursery.start_soon(load)
            # The feed already holds the live events 46..50 (it exists since the
            # first call above), so paging starts below them.
            assert sorted(pages) == [list(range(6, 26)), list(range(26, 46))]
            history = client.history("s1")
            assert (history.oldest_loaded, history.complete, history.loading) == (6, False, False)
            page = await client.load_history("s1", limit=50)
            assert ([e.index for e in page.events], page.complete) == (list(range(1, 6)), True)
            assert [e.index for e in history.events] == list(range(1, 51))
            # Live events merge into the same feed.
            await client.push("s1", ordered("live"))
            while lane.index < 51:
                await lane.receive()
            assert history.events[-1].index == 51
            done = await client.load_history("s1")
            assert (done.events, done.complete, done.oldest_loaded) == ((), True, 1)
        # Followed but never loaded: the first page ends at the lane's index.
        async with client.subscribe("s1", start_after=0) as fresh:
            while fresh.index < 3:
                await fresh.receive()
            client.history("s1")  # (already loaded: pages on from index 1)
        async with client.subscribe("s2", start_after=0) as followed:
            await client.push("s2", ordered("a"), ordered("b"))
            while followed.index < 2:
                await followed.receive()
            page = await client.load_history("s2", limit=1)
            assert [e.index for e in page.events] == [2]
        # An explicit range on an empty session: nothing below, complete.
        empty = await client.load_history("nobody", before=10)
        assert (empty.events, empty.complete, empty.oldest_loaded) == ((), True, None)
        for bad in ({"limit": 0}, {"before": 0}, {"before": True}):
            with pytest.raises(ValueError, match="must be a positive int"):
                await client.load_history("s1", **bad)
        with pytest.raises(a2trio.A2Error) as refused:
            await client.load_history("\x1f", before=5)
        assert refused.value.code is a2trio.ErrorCode.INVALID_PAYLOAD


@guarded(20)
async def test_transport_failures_are_retryable_and_bad_frames_lose_the_stream() -> None:
    attempts: list[str] = []

    def down(request: httpx.Request) -> httpx.Response:
        attempts.append(request.method)
        raise httpx.ConnectError("refused", request=request)

    async with open_http_client(
        "http://a2.invalid/orders", reconnect=pause, transport=httpx.MockTransport(down)
    ) as client:
        with pytest.raises(a2trio.A2Error, match=r"^STORE_UNAVAILABLE: request failed: "):
            await client.push("s1", ordered("x"))
        assert attempts == ["POST", "POST", "POST"]
        async with client.subscribe("s1") as lane:
            with pytest.raises(a2trio.A2Error, match=r"^STORE_UNAVAILABLE: stream lost: "):
                await lane.wait_live()

    def bad_gateway(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, content=b"<html>bad gateway</html>")

    async with open_http_client(
        "http://a2.invalid/orders", reconnect=pause, transport=httpx.MockTransport(bad_gateway)
    ) as client:
        async with client.subscribe("s1") as lane:
            with pytest.raises(a2trio.A2Error, match=r"^STORE_UNAVAILABLE: HTTP 502$"):
                await lane.wait_live()

    def sse(body: bytes) -> Any:
        def respond(request: httpx.Request) -> httpx.Response:
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, stream=httpx.ByteStream(body), headers=headers)

        return respond

    error = wire.encode_error(a2trio.A2Error(a2trio.ErrorCode.STORE_UNAVAILABLE, "db down"))
    for body, message in [
        (b"event: event\ndata: {}\n\n", r"^STORE_UNAVAILABLE: unreadable 'event' frame: "),
        (b"event: error\ndata: " + error + b"\n\n", r"^STORE_UNAVAILABLE: db down$"),
        (b"event: error\ndata: ?\n\n", r"^STORE_UNAVAILABLE: stream failed$"),
        (b"data: " + b"x" * (2**20 + 100), r"^STORE_UNAVAILABLE: stream lost: SSE line exceeds"),
        (b"event: other\ndata: 1\n\n", r"^STORE_UNAVAILABLE: the stream ended \(paused\)$"),
    ]:
        async with open_http_client(
            "http://a2.invalid/orders", reconnect=pause, transport=httpx.MockTransport(sse(body))
        ) as client:
            async with client.subscribe("s1") as lane:
                with pytest.raises(a2trio.A2Error, match=message):
                    await lane.wait_live()
                    await lane.connection.wait_for(lambda s: isinstance(s, Paused))
                    await lane.wait_live()


@guarded(20)
async def test_a_silent_stream_trips_the_watchdog() -> None:
    server = a2trio.Server(orders, store=memory())
    # heartbeat_s far above the watchdog: the stream is silent after its first comment.
    async with (
        serving(asgi(server, limits=Limits(heartbeat_s=60))) as base,
        open_http_client(f"{base}/orders", reconnect=pause, watchdog_s=0.2) as client,
        client.subscribe("s1") as lane,
    ):
        await lane.wait_live()
        state = await lane.connection.wait_for(lambda s: isinstance(s, Paused))
        assert isinstance(state, Paused)
        assert state.error is not None
        assert state.error.message == "stream lost: no frame for 0.2 s"


@guarded(20)
async def test_the_callers_error_is_not_a_group() -> None:
    with pytest.raises(KeyError):
        async with open_http_client("http://a2.invalid/orders") as client:
            async with client.subscribe("s1", start_after=0):
                raise KeyError("mine")


def test_sse_frames_mirror_socket_frames() -> None:
    patch = b'{"participant":"ann","values":{"x":1},"seen":2,"at":"t"}'
    assert _frame(SSEEvent("presence", patch.decode()), "s1") == wire.PresenceFrame(
        "ann", {"x": 1}, 2, "t", "s1"
    )
    assert _frame(SSEEvent("message", "1"), "s1") is None


def test_sse_frames_decode_as_the_seed_does() -> None:
    # The seed's client accepts an event without a payload and an error frame
    # without a message (the code is the message).
    data = '{"id":"e-1","type":"cleared","index":1,"sessionId":"s1","createdAt":"t"}'
    frame = _frame(SSEEvent("event", data), "s1")
    assert isinstance(frame, wire.EventFrame)
    assert (frame.id, frame.payload, frame.index) == ("e-1", None, 1)
    with pytest.raises(a2trio.A2Error) as refused:
        _frame(SSEEvent("error", '{"error":{"code":"FORBIDDEN"}}'), "s1")
    assert (refused.value.code, refused.value.message) == (a2trio.ErrorCode.FORBIDDEN, "FORBIDDEN")
