"""Property: no input to any lane produces a 5xx or a write.

Hypothesis throws malformed bodies, queries and frames at a real hypercorn. Every
answer must be a 4xx error envelope (or, on a socket, a 4xx error ack, a skip,
or a close with a reason); the log must be unchanged afterwards. Inputs that
would be *valid* pushes are filtered out by an oracle (they would rightly write).
One hypercorn serves every example from its own thread and Trio run (pytest-trio
runs each example in a fresh Trio run); since nothing may be written, examples
cannot disturb each other, and the empty log is checked after each.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import a2trio
from a2trio.stores import memory
from a2trio.transport import Limits, asgi, wire
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    orders,
    serving,
    ws_url,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
LIMITS = Limits(max_body_bytes=2_000, max_push_events=4, max_frame_bytes=2_000)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
event_like = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["ordered", "note", "zap", ""]), json_values)},
    optional={
        "payload": st.one_of(
            json_values, st.fixed_dictionaries({"item": json_values}), st.just({"text": 1})
        ),
        "id": st.one_of(json_values, st.just("")),
    },
)
shaped = st.fixed_dictionaries(
    {},
    optional={
        "events": st.one_of(json_values, st.lists(event_like, max_size=6)),
        "presence": json_values,
    },
)
bodies = st.one_of(
    st.binary(max_size=120),
    json_values.map(msgspec.json.encode),
    shaped.map(msgspec.json.encode),
    st.integers(2_001, 3_000).map(lambda n: b'{"events": [' + b" " * n + b"]}"),
)
frames = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=80).map(str.encode),
    st.fixed_dictionaries(
        {"kind": st.one_of(st.sampled_from(["push", "presence", "subscribe", "zz"]), json_values)},
        optional={
            "req": st.one_of(st.integers(-5, 5), json_values),
            "events": st.one_of(json_values, st.lists(event_like, max_size=5)),
            "sessions": st.one_of(json_values, st.lists(json_values, max_size=3)),
            "sessionId": st.one_of(st.just("s1"), json_values),
            "participant": json_values,
            "values": json_values,
        },
    ).map(msgspec.json.encode),
    st.integers(2_001, 2_500).map(lambda n: b"x" * n),
)
queries = st.dictionaries(
    st.sampled_from(["startAfter", "gte", "lte", "presence"]),
    st.one_of(st.text(max_size=12), st.integers(-5, 2**60).map(str)),
    max_size=3,
)


def would_write(events: Any) -> bool:
    """The oracle: whether a push of ``events`` to ``orders`` would succeed."""
    if not isinstance(events, list) or not 0 < len(events) <= LIMITS.max_push_events:
        return False
    ids = []
    for event in events:
        if not isinstance(event, dict) or "type" not in event:
            return False
        if "id" in event and event["id"] is not None:
            if not isinstance(event["id"], str) or not event["id"]:
                return False
            ids.append(event["id"])
        try:
            orders.validate(event["type"], event.get("payload"))
        except (a2trio.A2Error, TypeError):
            return False
    return len(ids) == len(set(ids))


def body_would_write(body: bytes) -> bool:
    if len(body) > LIMITS.max_body_bytes:
        return False
    try:
        decoded = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(decoded, dict)
        and decoded.get("presence") is None
        and would_write(decoded.get("events"))
    )


def frame_would_write(frame: bytes) -> bool:
    try:
        decoded = json.loads(frame)
    except ValueError:
        return False
    return (
        isinstance(decoded, dict)
        and decoded.get("kind") == "push"
        and type(decoded.get("req")) is int
        and would_write(decoded.get("events"))
    )


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """A real server on a loopback port, run by a thread of its own."""
    started: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.Event]] = queue.Queue()

    async def serve() -> None:
        server = a2trio.Server(orders, store=memory())
        stop = trio.Event()
        async with serving(asgi(server, limits=LIMITS)) as url:
            started.put((url, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    url, token, stop = started.get(timeout=30)
    yield url
    trio.from_thread.run_sync(stop.set, trio_token=token)
    thread.join(timeout=30)


def assert_envelope(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = wire.error_from_wire(response.content)
    assert error is not None, response.text


async def assert_log_empty(c: httpx.AsyncClient) -> None:
    for session in ("s1", "s2"):
        response = await c.get(f"/orders/{session}")
        assert response.json() == {"events": []}


@given(body=bodies)
@FUZZ
async def test_push_lane_refuses_bad_bodies(base: str, body: bytes) -> None:
    assume(not body_would_write(body))
    with trio.fail_after(20):
        async with httpx.AsyncClient(base_url=base) as c:
            assert_envelope(await c.post("/orders/s1", content=body))
            await assert_log_empty(c)


@given(query=queries, stream=st.booleans())
@FUZZ
async def test_read_lanes_never_fail_on_bad_queries(
    base: str, query: dict[str, str], stream: bool
) -> None:
    headers = {"accept": "text/event-stream"} if stream else {}
    with trio.fail_after(20):
        async with httpx.AsyncClient(base_url=base) as c:
            async with c.stream("GET", "/orders/s1", params=query, headers=headers) as r:
                if r.status_code != 200:
                    await r.aread()
                    assert_envelope(r)
            await assert_log_empty(c)


@given(sent=st.lists(frames, min_size=1, max_size=4), multiplexed=st.booleans())
@FUZZ
async def test_socket_lanes_answer_bad_frames_with_errors(
    base: str, sent: list[bytes], multiplexed: bool
) -> None:
    assume(not any(frame_would_write(f) for f in sent))
    path = "/orders/ws" if multiplexed else "/orders/s1/ws"
    with trio.fail_after(20):
        async with trio_websocket.open_websocket_url(ws_url(base, path)) as ws:
            closed = await exchange(ws, sent)
        if closed is not None:
            assert closed.code in (1007, 1009), closed
        async with httpx.AsyncClient(base_url=base) as c:
            await assert_log_empty(c)


async def exchange(
    ws: trio_websocket.WebSocketConnection, sent: list[bytes]
) -> trio_websocket.CloseReason | None:
    """Send the frames and a sentinel push, which is always answered by an error
    ack unless the server closed the socket; check every answer on the way."""
    sentinel = {"kind": "push", "req": 99, "events": [{"type": "zap"}], "sessionId": "s1"}
    try:
        for data in sent:
            await ws.send_message(data.decode("utf-8", "replace"))
        await ws.send_message(json.dumps(sentinel))
        while True:
            frame = json.loads(await ws.get_message())
            assert frame["kind"] in ("ack", "subscribed", "unsubscribed", "ping")
            if "error" in frame:
                assert wire.error_status(frame["error"]["code"]) < 500, frame
            if frame["kind"] == "ack":
                assert "events" not in frame, frame
                if frame["req"] == 99:
                    return None
    except trio_websocket.ConnectionClosed as exc:
        return exc.reason
