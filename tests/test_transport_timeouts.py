"""Slow and abusive clients are bounded (issue 17): a request body that never
finishes gets a 408 and its connection back, and one subscribe frame cannot
make a socket restart a lane 30,000 times."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

import a2trio
from a2trio.serve import KEEP_ALIVE_S, load_target, main
from a2trio.stores import memory
from a2trio.transport import DEFAULT_LIMITS, App, Limits, asgi
from tests.test_transport import (
    collect_client_garbage,
    frame,
    guarded,
    orders,
    pytestmark,
    serving,
    ws_url,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


@guarded(20)
async def test_a_body_that_never_finishes_gets_a_408() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, limits=Limits(body_timeout_s=0.2))) as base:
        host, port = base.removeprefix("http://").split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b'POST /orders/s1 HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"events"'
            )
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
                if b"\r\n\r\n" in answer and answer.endswith(b"}}"):
                    break
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        error = json.loads(body)["error"]
        assert error == {
            "code": "INVALID_PAYLOAD",
            "message": "the request body did not arrive within 0.2 s",
        }


async def _answer(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    while chunk := await stream.receive_some():
        answer += chunk
    return answer


@guarded(20)
async def test_content_length_with_chunked_encoding_is_refused_at_once() -> None:
    # Issue 29: the request was held until the body timeout (hypercorn's h11
    # frames it as chunked); framing a request two ways is how requests are
    # smuggled past a proxy, so it is refused before its body is read.
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, limits=Limits(body_timeout_s=600))) as base:
        host, port = base.removeprefix("http://").split(":")
        for path, extra in ((b"/orders/s1", b""), (b"/orders/s1", b'5\r\n{"eve\r\n'), (b"/x", b"")):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(
                    b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 13\r\ntransfer-encoding: chunked\r\n\r\n" + extra
                )
                with trio.fail_after(5):  # well inside the 600 s body timeout
                    answer = await _answer(stream)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), answer
            assert b"connection: close" in head.lower()
            error = json.loads(body)["error"]
            assert error["code"] == "INVALID_PAYLOAD"
            assert "Content-Length and Transfer-Encoding" in error["message"]


@guarded(20)
async def test_duplicate_subscriptions_in_one_frame_collapse_and_too_many_close() -> None:
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=Limits(max_frame_sessions=3))
    async with serving(app) as base:
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as ws:
            entries = [{"id": "s1", "index": n % 5} for n in range(30_000)]
            await ws.send_message(json.dumps({"kind": "subscribe", "sessions": entries}))
            assert await frame(ws) == {"kind": "subscribed", "sessionId": "s1"}
            await ws.send_message(json.dumps({"kind": "unsubscribe", "sessions": ["s1"]}))
            # One lane was opened, so one is closed: no notice per duplicate.
            assert await frame(ws) == {"kind": "unsubscribed", "sessionId": "s1"}
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as ws:
            entries = [{"id": f"s{n}"} for n in range(4)]
            await ws.send_message(json.dumps({"kind": "subscribe", "sessions": entries}))
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await frame(ws)
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1008


target = a2trio.Server(orders, store=memory())


def test_serve_passes_its_timeouts_and_refuses_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    app = load_target("tests.test_transport_timeouts:target", limits=Limits(body_timeout_s=7))
    assert isinstance(app, App)
    assert app.limits.body_timeout_s == 7
    assert DEFAULT_LIMITS.body_timeout_s == 30
    assert KEEP_ALIVE_S == 5
    for flag in ("--body-timeout", "--keep-alive-timeout"):
        with pytest.raises(SystemExit):
            main(["tests.test_transport_timeouts:target", flag, "0"])
        assert f"{flag} must be positive seconds, got 0.0" in capsys.readouterr().err
