"""Slow and abusive clients are bounded (issue 17): a request body that never
finishes gets a 408 and its connection back, and one subscribe frame cannot
make a socket restart a lane 30,000 times."""

from __future__ import annotations

import contextlib
import json
import logging

import pytest
import trio
import trio_websocket

import a2trio
from a2trio.serve import KEEP_ALIVE_S, load_target, main
from a2trio.stores import memory
from a2trio.transport import DEFAULT_LIMITS, App, Limits, asgi
from tests.serve_kit import start_serve
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


async def _leave_at_the_deadline(base: str, timeout_s: float) -> None:
    """Slow clients that half-close around the body deadline, spread finely
    enough (0.3 ms apart) to hit the instant the 408 is answered."""
    host, port = base.removeprefix("http://").rstrip("/").split(":")

    async def slow_client(delay_s: float) -> None:
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"POST /orders/s1 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b'content-length: 100\r\n\r\n{"events"'
            )
            await trio.sleep(delay_s)
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_eof()
                await _answer(stream)

    for _ in range(6):
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(slow_client, timeout_s - 0.003 + n * 0.0003)


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


@guarded(60)
async def test_a_client_leaving_as_its_body_times_out_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 29: the 408 raced hypercorn's close of a connection whose client
    # half-closed at that instant: hypercorn logged the app's BusyResourceError
    # ("Error in ASGI Framework") with a traceback, or its own error answer's
    # ended the server.
    caplog.set_level(logging.INFO)
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, limits=Limits(body_timeout_s=0.2))) as base:
        await _leave_at_the_deadline(base, 0.2)
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [(r.name, r.getMessage(), r.exc_info) for r in noisy]


@guarded(90)
async def test_the_serve_process_outlives_clients_leaving_as_their_bodies_time_out() -> None:
    started = await start_serve(
        "tests.test_transport_timeouts:target", "--port", "0", "--body-timeout", "0.2"
    )
    process, stdout = started.process, started.process.stdout
    assert stdout is not None
    try:
        await _leave_at_the_deadline(started.url, 0.2)
        assert process.poll() is None, "the server died"
        process.terminate()
        output = started.banner.encode()
        with trio.fail_after(30):
            while chunk := await stdout.receive_some():
                output += chunk
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()
    text = output.decode()
    assert "Traceback" not in text, text[-3000:]
    assert "ERROR" not in text, text[-3000:]
    assert "stopped" in text


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
