"""The Durable Streams lane's mapping onto a2trio (issue 37): what a request
writes into the stream's session, offsets, producers across processes,
forks, limits, authorization, mounted sessions and prefixes.

The protocol itself is checked by its own suite
(``tests/test_durable_streams_conformance.py``); these tests pin what the
suite cannot see: the events in the store, two lane processes on one store,
and the a2trio side of the lane.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

import a2trio
from a2trio.stores import memory, sqlite
from a2trio.stores.base import Store
from a2trio.transport import Cors, HistoryOperation, Limits, Request, asgi
from a2trio.transport import StreamOperation as SessionStreamOperation
from a2trio.transport.durable_streams import (
    CONTRACT,
    DurableStreams,
    StreamOperation,
    durable_streams,
    mount,
    table,
)
from a2trio.transport.durable_streams.model import REDUCER, Producer
from a2trio.transport.durable_streams.protocol import (
    Offset,
    control_frame,
    data_frame,
    format_offset,
    json_messages,
    parse_offset,
    response_cursor,
)
from a2trio.transport.durable_streams.table import producer_event_id
from tests.test_transport import (  # the autouse collector keeps client garbage here
    chunks_of,
    collect_client_garbage,  # noqa: F401
    serving,
)

# Leaving an SSE response early leaves httpx's byte-stream generators to the
# garbage collector (tests/test_transport.py says why).
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
]

BINARY = bytes(range(256))


@asynccontextmanager
async def lane_client(
    lane: DurableStreams | Any, *, open_lane: DurableStreams | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on ``lane`` (in memory: whole bodies), the lane open."""
    opened = open_lane or lane
    assert isinstance(opened, DurableStreams)
    async with opened.opened():
        transport = httpx.ASGITransport(app=lane)
        async with httpx.AsyncClient(transport=transport, base_url="http://lane") as http:
            yield http


async def session_events(store: Store, path: str) -> list[tuple[str, Any]]:
    rows = await store.read(f"{CONTRACT.name}\x1f{path}")
    return [(row.type, row.payload) for row in rows]


# -- the protocol's vocabulary (sans I/O) -------------------------------------------


def test_offsets_sort_as_positions_and_round_trip() -> None:
    offsets = [Offset(0, 0), Offset(0, 9), Offset(0, 10), Offset(1, 2), Offset(2, 1)]
    texts = [format_offset(o) for o in offsets]
    assert texts == sorted(texts)
    assert [parse_offset(t) for t in texts] == offsets
    assert texts[0] == "0000000000000000_0000000000000000"
    for bad in ("-1", "now", "0_1", "0000000000000000_000000000000000x", "a" * 33):
        assert parse_offset(bad) is None


def test_json_mode_flattens_one_level() -> None:
    assert json_messages(b'{"a": 1}', allow_empty=False) == [{"a": 1}]
    assert json_messages(b"[[1, 2], [3]]", allow_empty=False) == [[1, 2], [3]]
    assert json_messages(b"[]", allow_empty=True) == []
    with pytest.raises(ValueError, match="empty array"):
        json_messages(b"[]", allow_empty=False)
    with pytest.raises(ValueError, match="not valid JSON"):
        json_messages(b"{", allow_empty=False)


def test_sse_frames_split_every_line_break_and_base64_binary() -> None:
    assert (
        data_frame(b"a\r\nb\rc\nd", text=True) == b"event: data\ndata:a\ndata:b\ndata:c\ndata:d\n\n"
    )
    assert data_frame(b"\x00\xff", text=False) == b"event: data\ndata:AP8=\n\n"
    assert control_frame("x", cursor="7", up_to_date=True, closed=False) == (
        b'event: control\ndata:{"streamNextOffset":"x","streamCursor":"7","upToDate":true}\n\n'
    )
    closed = control_frame("x", cursor=None, up_to_date=True, closed=True)
    assert b"streamCursor" not in closed
    assert b'"streamClosed":true' in closed


def test_cursors_never_repeat_the_clients() -> None:
    now_s = 1_728_432_000 + 20 * 1000
    assert response_cursor(None, now_s=now_s) == "1000"
    assert response_cursor("10", now_s=now_s) == "1000"
    for _ in range(50):
        assert int(response_cursor("1000", now_s=now_s)) > 1000


# -- what a request writes -------------------------------------------------------


async def test_each_append_is_one_event_of_its_kind_with_the_bytes_kept() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        put = await http.put("/b", content=BINARY, headers={"content-type": "application/x-raw"})
        assert put.status_code == 201
        await http.put("/t", content="héllo", headers={"content-type": "text/plain"})
        await http.post("/t", content=b"\xff\xfe", headers={"content-type": "text/plain"})
        await http.put("/j", content=b"[1, [2]]", headers={"content-type": "application/json"})
        read_b = await http.get("/b")
        read_t = await http.get("/t")
        read_j = await http.get("/j?offset=-1")
        assert read_b.content == BINARY
        assert read_t.content == "héllo".encode() + b"\xff\xfe"
        assert read_j.json() == [1, [2]]
    assert await session_events(store, "/b") == [
        (
            "created",
            {
                "content_type": "application/x-raw",
                "ttl_s": None,
                "expires_at": None,
                "expires_at_ms": None,
                "closed": False,
                "fork": None,
            },
        ),
        (
            "bytes",
            {
                "data": base64.b64encode(BINARY).decode(),
                "producer": None,
                "seq": None,
                "close": False,
            },
        ),
    ]
    kinds = [kind for kind, _ in await session_events(store, "/t")]
    assert kinds == ["created", "text", "bytes"]  # not UTF-8: kept as bytes
    [_, (kind, payload)] = await session_events(store, "/j")
    assert (kind, payload["messages"]) == ("json", [1, [2]])


async def test_the_stream_is_an_a2trio_session_of_the_contract() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        await http.put("/chat", headers={"content-type": "application/json"})
        await http.post("/chat", json=[{"n": 1}, {"n": 2}])
    async with a2trio.Server(CONTRACT, store=store, run_handlers=False) as server:
        [created, appended] = await server.session("/chat").history()
    assert created.type == "created"
    assert created.payload.content_type == "application/json"
    assert appended.payload.messages == [{"n": 1}, {"n": 2}]


async def test_offsets_are_the_session_indexes_of_the_appends() -> None:
    lane = durable_streams(memory())
    async with lane_client(lane) as http:
        put = await http.put("/s", content=b"a", headers={"content-type": "text/plain"})
        assert put.headers["stream-next-offset"] == format_offset(Offset(0, 2))
        post = await http.post("/s", content=b"b", headers={"content-type": "text/plain"})
        assert post.headers["stream-next-offset"] == format_offset(Offset(0, 3))
        closed = await http.post("/s", headers={"stream-closed": "true"})
        assert closed.headers["stream-next-offset"] == format_offset(Offset(0, 3))
        head = await http.head("/s")
        assert head.headers["stream-closed"] == "true"
        middle = await http.get("/s", params={"offset": format_offset(Offset(0, 2))})
        assert middle.content == b"b"
        assert middle.headers["stream-closed"] == "true"


async def test_catch_up_reads_answer_about_chunk_bytes_and_decode_little_past_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = memory()
    rows_read: list[int] = []
    read = store.read

    async def counted(session_id: str, **bounds: int | None) -> list[Any]:
        rows = await read(session_id, **bounds)
        rows_read.append(len(rows))
        return rows

    lane = durable_streams(store, chunk_bytes=20_000)
    appends = [bytes([n]) * 1000 for n in range(100)]
    async with lane_client(lane) as http:
        headers = {"content-type": "application/octet-stream"}
        await http.put("/c", headers=headers)
        for body in appends:
            (await http.post("/c", content=body, headers=headers)).raise_for_status()
        monkeypatch.setattr(store, "read", counted)
        bodies, offset = [], "-1"
        while True:
            r = await http.get("/c", params={"offset": offset})
            bodies.append(r.content)
            offset = r.headers["stream-next-offset"]
            if r.headers.get("stream-up-to-date") == "true":
                break
    assert b"".join(bodies) == b"".join(appends)
    assert [len(b) for b in bodies] == [20_000] * 5
    # Each read decodes its appends and one more (that it is not the tail),
    # not a fixed page of them: 256 a read would be 300 rows here.
    assert sum(rows_read) <= len(appends) + 2 * len(bodies)


async def test_a_recreated_stream_starts_a_new_generation_in_the_same_session() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        await http.put("/g", content=b"old", headers={"content-type": "text/plain"})
        assert (await http.delete("/g")).status_code == 204
        assert (await http.get("/g")).status_code == 404
        again = await http.put("/g", content=b"new", headers={"content-type": "text/plain"})
        assert again.status_code == 201
        assert (await http.get("/g")).content == b"new"
        stale = await http.get("/g", params={"offset": format_offset(Offset(0, 0))})
        assert stale.content == b"new"
    kinds = [kind for kind, _ in await session_events(store, "/g")]
    assert kinds == ["created", "text", "deleted", "created", "text"]


# -- producers, and two lane processes on one store ----------------------------------


def producer(seq: int, epoch: int = 0, name: str = "p") -> dict[str, str]:
    return {
        "content-type": "text/plain",
        "producer-id": name,
        "producer-epoch": str(epoch),
        "producer-seq": str(seq),
    }


async def test_producer_appends_have_deterministic_ids_and_retries_dedupe() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        await http.put("/p", headers={"content-type": "text/plain"})
        first = await http.post("/p", content=b"x", headers=producer(0))
        assert first.status_code == 200
        assert first.headers["producer-seq"] == "0"
        retry = await http.post("/p", content=b"x", headers=producer(0))
        assert retry.status_code == 204
        gap = await http.post("/p", content=b"y", headers=producer(2))
        assert gap.status_code == 409
        assert gap.headers["producer-expected-seq"] == "1"
        await http.post("/p", content=b"z", headers=producer(0, epoch=1))
        stale = await http.post("/p", content=b"w", headers=producer(1, epoch=0))
        assert stale.status_code == 403
        assert stale.headers["producer-epoch"] == "1"
        assert (await http.get("/p")).content == b"xz"
    rows = await store.read(f"{CONTRACT.name}\x1f/p")
    assert rows[1].id == producer_event_id("/p", 1, Producer("p", 0, 0))


async def test_two_lane_processes_on_one_store_decide_on_the_fresh_state() -> None:
    # Each lane caches the states it folded: B's appends must not be lost
    # on A's stale cache (conditional commits, then a fresh decision).
    store = memory()
    a, b = durable_streams(store), durable_streams(store)
    async with lane_client(a) as http_a, lane_client(b) as http_b:
        await http_a.put("/shared", headers={"content-type": "text/plain"})
        assert (await http_a.post("/shared", content=b"0", headers=producer(0))).status_code == 200
        assert (await http_b.post("/shared", content=b"1", headers=producer(1))).status_code == 200
        assert (await http_a.post("/shared", content=b"2", headers=producer(2))).status_code == 200
        assert (await http_a.post("/shared", content=b"1", headers=producer(1))).status_code == 204
        seq = {"content-type": "text/plain", "stream-seq": "b"}
        assert (await http_b.post("/shared", content=b"3", headers=seq)).status_code == 204
        seq["stream-seq"] = "a"
        assert (await http_a.post("/shared", content=b"4", headers=seq)).status_code == 409
        assert (await http_b.post("/shared", headers={"stream-closed": "true"})).status_code == 204
        late = await http_a.post("/shared", content=b"5", headers={"content-type": "text/plain"})
        assert late.status_code == 409
        assert late.headers["stream-closed"] == "true"
        assert (await http_a.get("/shared")).content == b"0123"


# -- forks ---------------------------------------------------------------------------


async def test_a_fork_stitches_its_source_and_keeps_it_until_deleted() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        put = await http.put("/src", content=b"ab", headers={"content-type": "text/plain"})
        offset = put.headers["stream-next-offset"]
        await http.post("/src", content=b"cd", headers={"content-type": "text/plain"})
        fork = await http.put(
            "/fork", headers={"stream-forked-from": "/src", "stream-fork-offset": offset}
        )
        assert fork.status_code == 201
        assert fork.headers["content-type"] == "text/plain"
        post = await http.post("/fork", content=b"EF", headers={"content-type": "text/plain"})
        assert parse_offset(post.headers["stream-next-offset"]) == Offset(1, 2)
        assert (await http.get("/fork")).content == b"abEF"
        assert (await http.delete("/src")).status_code == 204
        assert (await http.get("/src")).status_code == 410
        assert (await http.get("/fork")).content == b"abEF"
        assert (await http.delete("/fork")).status_code == 204
        assert (await http.get("/src")).status_code == 404
    kinds = [kind for kind, _ in await session_events(store, "/src")]
    assert kinds == ["created", "text", "text", "forked", "deleted", "unforked"]


# -- limits, authorization ------------------------------------------------------------


async def test_bodies_over_the_cap_are_refused_and_nothing_is_written() -> None:
    store = memory()
    lane = durable_streams(store, limits=Limits(max_body_bytes=10))
    async with lane_client(lane) as http:
        await http.put("/cap", headers={"content-type": "text/plain"})
        big = await http.post("/cap", content=b"x" * 11, headers={"content-type": "text/plain"})
        assert big.status_code == 413
    assert [kind for kind, _ in await session_events(store, "/cap")] == ["created"]


async def test_a_body_that_never_arrives_answers_408(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lane = durable_streams(memory(), limits=Limits(body_timeout_s=5))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent and not hasattr(receive, "once"):
            receive.once = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"x", "more_body": True}
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/slow", "headers": [], "query_string": b""}
    async with lane.opened():
        await lane(scope, receive, send)
    assert sent[0]["status"] == 408
    assert trio.current_time() == 5


async def test_authorize_sees_each_operation_and_refuses_with_403() -> None:
    asked: list[Any] = []

    def authorize(request: Request, operation: Any) -> bool:
        asked.append(operation)
        return not (isinstance(operation, StreamOperation) and operation.action == "delete")

    lane = durable_streams(memory(), authorize=authorize)
    async with lane_client(lane) as http:
        await http.put("/a", headers={"content-type": "text/plain", "stream-closed": "true"})
        await http.get("/a", params={"offset": "-1"})
        assert (await http.delete("/a")).status_code == 403
    assert asked == [
        StreamOperation("create", "/a", close=True),
        StreamOperation("read", "/a"),
        StreamOperation("delete", "/a"),
    ]


# -- an ordinary session through the lane, and mounting ----------------------------


class Said(msgspec.Struct, frozen=True):
    text: str


chat = a2trio.contract("chat", events={"said": Said})


async def test_an_a2trio_session_reads_as_a_json_stream_and_long_polls() -> None:
    store = memory()
    server = a2trio.Server(chat, store=store)
    asked: list[Any] = []

    def authorize(request: Request, operation: Any) -> bool:
        asked.append(type(operation))
        return True

    lane = durable_streams(store, sessions=[server], authorize=authorize)
    async with lane_client(lane) as http:
        await server.session("room").append(chat.event("said", {"text": "hi"}))
        read = await http.get("/chat/room", params={"offset": "-1"})
        assert read.headers["content-type"] == "application/json"
        [message] = read.json()
        assert (message["type"], message["payload"], message["index"]) == (
            "said",
            {"text": "hi"},
            1,
        )
        offset = read.headers["stream-next-offset"]
        assert parse_offset(offset) == Offset(0, 1)
        async with trio.open_nursery() as nursery:
            polled: list[httpx.Response] = []

            async def poll() -> None:
                params = {"offset": offset, "live": "long-poll"}
                polled.append(await http.get("/chat/room", params=params))

            nursery.start_soon(poll)
            await trio.sleep(0.2)
            await server.session("room").append(chat.event("said", {"text": "there"}))
        [later] = polled[0].json()
        assert later["payload"] == {"text": "there"}
        assert parse_offset(polled[0].headers["stream-next-offset"]) == Offset(0, 2)
        assert (await http.post("/chat/room", json={})).status_code == 405
    assert asked == [HistoryOperation, SessionStreamOperation]


async def test_mounted_under_a_prefix_beside_a_session_app() -> None:
    store = memory()
    server = a2trio.Server(chat, store=store)
    lane = durable_streams(store, sessions=[server])
    app = mount(asgi(server), {"/ds": lane})
    async with server, lane.opened(sessions=False):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            put = await http.put("/ds/notes", content=b"n", headers={"content-type": "text/plain"})
            assert put.headers["location"] == "http://x/ds/notes"
            pushed = await http.post(
                "/chat/room", json={"events": [{"type": "said", "payload": {"text": "a"}}]}
            )
            assert pushed.status_code == 200
            [message] = (await http.get("/ds/chat/room")).json()
            assert message["payload"] == {"text": "a"}
            assert (await http.get("/ds/notes")).content == b"n"
    with pytest.raises(ValueError, match="prefix"):
        mount(asgi(a2trio.Server(chat, store=memory())), {"ds": lane})


# -- SSE over a real server -------------------------------------------------------------


async def test_sse_pairs_data_and_control_then_follows_live() -> None:
    lane = durable_streams(memory())
    async with serving(lane) as base:  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            await http.put(
                "/live", content=b"\x00\x01", headers={"content-type": "application/octet-stream"}
            )
            params = {"offset": "-1", "live": "sse"}
            async with http.stream("GET", "/live", params=params) as response:
                assert response.headers["stream-sse-data-encoding"] == "base64"
                received = b""
                async with chunks_of(response) as chunks:
                    async for chunk in chunks:
                        received += chunk
                        if b"upToDate" in received:
                            break
                    headers = {"content-type": "application/octet-stream"}
                    await http.post("/live", content=b"\x02", headers=headers)
                    async for chunk in chunks:
                        received += chunk
                        if received.count(b"event: control") == 2:
                            break
    frames = [f for f in received.decode().split("\n\n") if f]
    assert [f.split("\n")[0] for f in frames] == [
        "event: data",
        "event: control",
        "event: data",
        "event: control",
    ]
    assert frames[0] == "event: data\ndata:AAE="
    assert frames[2] == "event: data\ndata:Ag=="


# -- time: TTL, expiry and long-polls on the mock clock ---------------------------------


async def test_a_sliding_ttl_counts_reads_and_writes_but_not_head(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        put = await http.put("/ttl", headers={"content-type": "text/plain", "stream-ttl": "2"})
        assert put.status_code == 201
        await trio.sleep(1.5)
        assert (await http.get("/ttl", params={"offset": "now"})).status_code == 200
        await trio.sleep(1.5)
        head = await http.head("/ttl")
        assert head.status_code == 200
        assert head.headers["stream-ttl"] == "2"
        await trio.sleep(1.5)
        assert (await http.head("/ttl")).status_code == 404
        assert (
            await http.post("/ttl", content=b"x", headers={"content-type": "text/plain"})
        ).status_code == 404
        again = await http.put("/ttl", headers={"content-type": "application/json"})
        assert again.status_code == 201
    kinds = [kind for kind, _ in await session_events(store, "/ttl")]
    assert kinds == ["created", "touched", "created"]


async def test_expires_at_is_absolute(autojump_clock: trio.testing.MockClock) -> None:
    clock = a2trio.TrioClock()
    lane = durable_streams(memory(clock=clock))
    expires = datetime.fromtimestamp((clock.now_ms() + 3000) / 1000, UTC).isoformat()
    async with lane_client(lane) as http:
        headers = {"content-type": "text/plain", "stream-expires-at": expires}
        assert (await http.put("/exp", headers=headers)).status_code == 201
        assert (await http.head("/exp")).headers["stream-expires-at"] == expires
        await trio.sleep(2)
        assert (await http.get("/exp")).status_code == 200
        await trio.sleep(1)
        assert (await http.get("/exp")).status_code == 404
        bad = {"content-type": "text/plain", "stream-expires-at": "tomorrow"}
        assert (await http.put("/exp2", headers=bad)).status_code == 400
        both = {"stream-ttl": "1", "stream-expires-at": expires}
        assert (await http.put("/exp3", headers=both)).status_code == 400


async def test_long_polls_answer_data_closure_or_204_at_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lane = durable_streams(memory(clock=a2trio.TrioClock()), long_poll_s=10)
    text = {"content-type": "text/plain"}
    async with lane_client(lane) as http:
        tail = (await http.put("/lp", headers=text)).headers["stream-next-offset"]
        params = {"offset": tail, "live": "long-poll", "cursor": "1"}
        started = trio.current_time()
        timed_out = await http.get("/lp", params=params)
        assert timed_out.status_code == 204
        assert trio.current_time() - started == pytest.approx(10)
        assert timed_out.headers["stream-up-to-date"] == "true"
        assert timed_out.headers["stream-cursor"].isdigit()
        answers: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                answers.append(await http.get("/lp", params=params))

            nursery.start_soon(poll)
            await trio.sleep(1)
            await http.post("/lp", content=b"new", headers=text)
        [got] = answers
        assert got.content == b"new"
        assert got.headers["stream-cursor"].isdigit()
        after = got.headers["stream-next-offset"]
        answers.clear()
        async with trio.open_nursery() as nursery:

            async def poll_again() -> None:
                answers.append(await http.get("/lp", params={"offset": after, "live": "long-poll"}))

            nursery.start_soon(poll_again)
            await trio.sleep(1)
            await http.post("/lp", headers={"stream-closed": "true"})
        [closed] = answers
        assert closed.status_code == 204
        assert closed.headers["stream-closed"] == "true"
        at_end = await http.get("/lp", params={"offset": after, "live": "long-poll"})
        assert at_end.status_code == 204
        assert at_end.headers["stream-closed"] == "true"


# -- forks at a sub-offset, refusals ---------------------------------------------------


async def test_a_sub_offset_fork_materializes_its_prefix() -> None:
    store = memory()
    lane = durable_streams(store)
    async with lane_client(lane) as http:
        await http.put("/j", content=b"[1, 2, 3]", headers={"content-type": "application/json"})
        fork = {
            "stream-forked-from": "/j",
            "stream-fork-offset": format_offset(Offset(0, 0)),
            "stream-fork-sub-offset": "2",
        }
        assert (await http.put("/jf", headers=fork)).status_code == 201
        assert (await http.get("/jf")).json() == [1, 2]
        assert (await http.put("/jf", headers=fork)).status_code == 200
        fork["stream-fork-sub-offset"] = "4"
        assert (await http.put("/jf2", headers=fork)).status_code == 400
        missing_source = {"stream-forked-from": "/nowhere"}
        assert (await http.put("/jf3", headers=missing_source)).status_code == 404
        mismatch = {"stream-forked-from": "/j", "content-type": "text/plain"}
        assert (await http.put("/jf4", headers=mismatch)).status_code == 409
    kinds = [kind for kind, _ in await session_events(store, "/jf")]
    assert kinds == ["created", "json"]


async def test_bad_requests_answer_4xx_and_write_nothing() -> None:
    store = memory()
    lane = durable_streams(store)
    text = {"content-type": "text/plain"}
    async with lane_client(lane) as http:
        await http.put("/r", headers=text)
        cases = [
            await http.get("/r", params={"offset": "bogus"}),
            await http.get("/r?offset=-1&offset=-1"),
            await http.get("/r", params={"live": "sse"}),
            await http.get("/r", params={"offset": "-1", "live": "forever"}),
            await http.put("/r2", headers={"stream-ttl": "01"}),
            await http.put("/r2", headers={"stream-fork-sub-offset": "1"}),
            await http.put("/r2", headers={"stream-forked-from": "/r", "stream-fork-offset": "x"}),
            await http.post("/r", content=b"x"),
            await http.post("/r", headers=text),
            await http.post("/r", content=b"x", headers={**text, "producer-id": "p"}),
            await http.post("/r", content=b"x", headers=producer(0, name="")),
            await http.post("/r", content=b"x", headers={**producer(0), "producer-seq": "1e3"}),
            await http.request("PATCH", "/r"),
        ]
        assert [r.status_code for r in cases] == [400] * 12 + [405]
        assert (
            await http.post("/r", content=b"{}", headers={"content-type": "application/json"})
        ).status_code == 409
        assert (
            await http.put("/r", headers={"content-type": "application/json"})
        ).status_code == 409
        assert (await http.delete("/nothing")).status_code == 404
        assert (await http.head("/nothing")).status_code == 404
    assert [kind for kind, _ in await session_events(store, "/r")] == ["created"]
    assert await session_events(store, "/r2") == []


async def test_cors_answers_preflights_and_exposes_the_protocol_headers() -> None:
    lane = durable_streams(memory(), cors=Cors(["https://app.example"]))
    async with lane_client(lane) as http:
        preflight = await http.options(
            "/c",
            headers={"origin": "https://app.example", "access-control-request-method": "PUT"},
        )
        assert preflight.status_code == 204
        assert "if-none-match" in preflight.headers["access-control-allow-headers"]
        assert "producer-seq" in preflight.headers["access-control-allow-headers"]
        refused = await http.options("/c", headers={"origin": "https://evil.example"})
        assert refused.status_code == 403
        put = await http.put("/c", headers={"origin": "https://app.example"})
        assert put.headers["access-control-allow-origin"] == "https://app.example"
        assert "stream-next-offset" in put.headers["access-control-expose-headers"]
        assert put.headers["x-content-type-options"] == "nosniff"
    off = durable_streams(memory())
    async with lane_client(off) as http:
        assert (
            await http.options("/c", headers={"origin": "https://a.example"})
        ).status_code == 405


def test_the_module_serves_app_and_builds_lanes_only_over_its_contract(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import a2trio.transport.durable_streams as module

    monkeypatch.setenv("A2_STORE", "memory:")
    monkeypatch.delitem(module.__dict__, "app", raising=False)
    app = module.app
    assert isinstance(app, DurableStreams)
    assert module.app is app
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018
    with pytest.raises(TypeError, match="CONTRACT"):
        DurableStreams(a2trio.Server(chat, store=memory()))
    with pytest.raises(TypeError, match="sessions="):
        durable_streams(memory(), sessions=["chat"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="positive"):
        durable_streams(memory(), long_poll_s=0)
    with pytest.raises(TypeError, match="lanes"):
        mount(asgi(a2trio.Server(chat, store=memory())), {"/ds": object()})  # type: ignore[dict-item]


# -- a session followed over SSE, the mounted app served whole -------------------------


async def test_a_session_follows_over_sse_and_heads_its_tail_under_a_mount() -> None:
    store = memory()
    server = a2trio.Server(chat, store=store)
    lane = durable_streams(store, sessions=[server], limits=Limits(heartbeat_s=0.05))
    async with serving(mount(asgi(server), {"/ds": lane})) as base:  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            await server.session("room").append(chat.event("said", {"text": "a"}))
            head = await http.head("/ds/chat/room")
            assert parse_offset(head.headers["stream-next-offset"]) == Offset(0, 1)
            assert (await http.get("/ds/chat")).status_code == 404
            now = await http.get("/ds/chat/room", params={"offset": "now"})
            assert now.json() == []
            params = {"offset": "-1", "live": "sse"}
            received = b""
            async with http.stream("GET", "/ds/chat/room", params=params) as response:
                async with chunks_of(response) as chunks:
                    async for chunk in chunks:
                        received += chunk
                        if b"upToDate" in received:
                            break
                    await server.session("room").append(chat.event("said", {"text": "b"}))
                    async for chunk in chunks:
                        received += chunk
                        if b'"text":"b"' in received and received.endswith(b"\n\n"):
                            break
    frames = [f for f in received.decode().split("\n\n") if f.startswith("event: data")]
    texts = [json.loads(f.split("data:", 1)[1])[0]["payload"]["text"] for f in frames]
    assert texts == ["a", "b"]


async def test_a_stream_state_is_snapshotted_as_it_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "SNAPSHOT_EVERY", 5)
    store = memory()
    async with lane_client(durable_streams(store)) as http:
        await http.put("/big", headers={"content-type": "text/plain"})
        for n in range(6):
            await http.post("/big", content=str(n).encode(), headers=producer(n))
    read = await store.read_state(f"{CONTRACT.name}\x1f/big", REDUCER.name)
    assert read.snapshot is not None
    assert read.snapshot.index == 5  # the 5th event after the load (index 0)
    assert read.snapshot.state["producers"] == {"p": {"epoch": 0, "seq": 3}}
    # Another process starts from the snapshot and goes on where it ends.
    async with lane_client(durable_streams(store)) as http:
        assert (await http.post("/big", content=b"x", headers=producer(5))).status_code == 204
        assert (await http.post("/big", content=b"6", headers=producer(6))).status_code == 200
        assert (await http.get("/big")).content == b"0123456"


async def test_an_expired_fork_lets_go_of_its_deleted_source(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    async with lane_client(durable_streams(store)) as http:
        await http.put("/source", content=b"s", headers={"content-type": "text/plain"})
        fork = {"stream-forked-from": "/source", "stream-ttl": "1"}
        assert (await http.put("/child", headers=fork)).status_code == 201
        assert (await http.delete("/source")).status_code == 204
        assert (await http.head("/source")).status_code == 410
        await trio.sleep(2)
        assert (await http.get("/child")).status_code == 404
        assert (await http.head("/source")).status_code == 404
    kinds = [kind for kind, _ in await session_events(store, "/child")]
    assert kinds == ["created", "deleted"]


async def test_a_retry_that_reaches_the_store_after_its_twin_is_a_duplicate() -> None:
    # Lane A's cache is stale (B committed the tuple): A's commit of the same
    # deterministic id replays, and A answers as a duplicate, writing nothing.
    store = memory()
    a, b = durable_streams(store), durable_streams(store)
    async with lane_client(a) as http_a, lane_client(b) as http_b:
        await http_a.put("/twin", headers={"content-type": "text/plain"})
        assert (await http_b.post("/twin", content=b"x", headers=producer(0))).status_code == 200
        retry = await http_a.post("/twin", content=b"x", headers=producer(0))
        assert retry.status_code == 204
        assert (await http_a.get("/twin")).content == b"x"
    kinds = [kind for kind, _ in await session_events(store, "/twin")]
    assert kinds == ["created", "text"]


async def test_readers_catching_up_during_a_commit_never_make_it_commit_twice(
    tmp_path: Path,
) -> None:
    # Readers fold the cached state in place, the writer's own rows included,
    # while the store is still answering the writer (SQLite: in a thread):
    # the writer must not take its own rows for a twin's and commit again.
    lane = durable_streams(sqlite(str(tmp_path / "race.db")))
    binary = {"content-type": "application/octet-stream"}
    async with serving(lane) as base:  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            for run in range(30):
                path = f"/race-{run}"
                await http.put(path, headers=binary)
                async with trio.open_nursery() as nursery:
                    for _ in range(7):
                        nursery.start_soon(http.get, path)
                    post = functools.partial(http.post, path, content=b"\xa1", headers=binary)
                    nursery.start_soon(post)
                assert (await http.get(path)).content == b"\xa1"
