"""CORS (``asgi(..., cors=Cors(...))``) and the sockets' ``Origin`` check.

Headers and preflights are driven in-process (raw ASGI); the socket check and
the SSE stream's headers go through a real hypercorn with real clients.
Real browsers' preflights are in ``test_browser_origins.py``.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import httpx
import pytest
import trio
import trio_websocket

import a2trio
from a2trio.stores import memory
from a2trio.transport import App, Cors, Request, asgi
from a2trio.transport.server.cors import SocketOriginCheck, SocketOrigins, normalize_origin
from examples.board import board

from .test_browser_static import call
from .test_transport import serving, ws_url

APP = "https://app.example"

# Client-side leftovers of trio-websocket's refused handshakes (test_transport.py).
pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


@pytest.fixture(autouse=True)
def collect_client_garbage() -> Iterator[None]:
    yield
    gc.collect()


def app_with(cors: Cors | None, socket_origins: SocketOrigins = None) -> App:
    return asgi(a2trio.Server(board, store=memory()), cors=cors, socket_origins=socket_origins)


def preflight(origin: str, method: str = "POST") -> list[tuple[bytes, bytes]]:
    return [
        (b"origin", origin.encode()),
        (b"access-control-request-method", method.encode()),
        (b"access-control-request-headers", b"content-type"),
    ]


# -- preflights -------------------------------------------------------------------------


@pytest.mark.parametrize("path", [b"/board/s1", b"/board/s1/ws", b"/board/ws", b"/_a2/health"])
async def test_preflights_on_every_lane(path: bytes) -> None:
    app = app_with(Cors([APP], credentials=True, max_age_s=30))
    answer = await call(app, "OPTIONS", path, preflight(APP))
    assert answer.status == 204
    assert answer.body == b""
    assert answer.headers["access-control-allow-origin"] == APP
    assert answer.headers["access-control-allow-methods"] == "GET, HEAD, POST"
    assert (
        answer.headers["access-control-allow-headers"]
        == "content-type, last-event-id, authorization"
    )
    assert answer.headers["access-control-allow-credentials"] == "true"
    assert answer.headers["access-control-max-age"] == "30"
    assert "Origin" in answer.headers["vary"]


async def test_a_preflight_from_another_origin_is_403_without_cors_headers() -> None:
    answer = await call(
        app_with(Cors([APP])), "OPTIONS", b"/board/s1", preflight("https://evil.example")
    )
    assert answer.status == 403
    assert json.loads(answer.body)["error"]["code"] == "FORBIDDEN"
    assert answer.headers["vary"] == "Origin"
    assert not [h for h in answer.headers if h.startswith("access-control-")]
    missing = await call(app_with(Cors([APP])), "OPTIONS", b"/board/s1", preflight(APP)[1:])
    assert missing.status == 403


async def test_cors_is_off_by_default() -> None:
    answer = await call(app_with(None), "OPTIONS", b"/board/s1", preflight(APP))
    assert answer.status == 405
    assert not [h for h in answer.headers if h.startswith("access-control-") or h == "vary"]
    app = app_with(None)
    async with app.servers["board"]:
        history = await call(app, "GET", b"/board/s1", [(b"origin", APP.encode())])
    assert history.status == 200
    assert "access-control-allow-origin" not in history.headers


async def test_a_plain_options_is_still_405_with_cors_headers() -> None:
    answer = await call(app_with(Cors([APP])), "OPTIONS", b"/board/s1", [(b"origin", APP.encode())])
    assert answer.status == 405
    assert answer.headers["access-control-allow-origin"] == APP


# -- answers -----------------------------------------------------------------------------


async def test_answers_name_allowed_origins_and_always_vary() -> None:
    app = app_with(Cors([APP], credentials=True, expose_headers=["Last-Event-ID", "X-Trace"]))
    async with app.servers["board"]:
        allowed = await call(app, "GET", b"/board/s1", [(b"origin", APP.encode())])
        other = await call(app, "GET", b"/board/s1", [(b"origin", b"https://evil.example")])
        none = await call(app, "GET", b"/board/s1")
        # Errors too, so that a page can read the envelope.
        error = await call(app, "GET", b"/board/s1?gte=x", [(b"origin", APP.encode())])
    assert allowed.status == 200
    assert allowed.headers["access-control-allow-origin"] == APP
    assert allowed.headers["access-control-allow-credentials"] == "true"
    assert allowed.headers["access-control-expose-headers"] == "last-event-id, x-trace"
    assert allowed.headers["vary"] == "Origin"
    for refused in (other, none):
        assert refused.status == 200  # CORS hides the answer from the page; it is not an error
        assert refused.headers["vary"] == "Origin"
        assert "access-control-allow-origin" not in refused.headers
    assert error.status == 400
    assert error.headers["access-control-allow-origin"] == APP


async def test_any_origin_without_credentials() -> None:
    app = app_with(Cors("*", expose_headers=()))
    async with app.servers["board"]:
        answer = await call(app, "GET", b"/board/s1", [(b"origin", b"https://anyone.example")])
        bare = await call(app, "GET", b"/board/s1")
    assert answer.headers["access-control-allow-origin"] == "*"
    assert "vary" not in answer.headers
    assert "access-control-expose-headers" not in answer.headers
    assert "access-control-allow-origin" not in bare.headers
    ok = await call(app, "OPTIONS", b"/board/s1", preflight("https://anyone.example"))
    assert ok.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in ok.headers


async def test_a_predicate_decides_on_normalized_origins() -> None:
    seen: list[str] = []

    def allow(origin: str) -> bool:
        seen.append(origin)
        return origin.endswith(".example.com")

    cors = Cors(allow, allow_headers=())
    assert cors.allows("HTTPS://Tenant.Example.com:443")
    assert seen == ["https://tenant.example.com"]
    assert not cors.allows("https://example.org")
    assert not cors.allows("not an origin")
    assert b"access-control-allow-headers" not in dict(
        cors.preflight_headers("https://a.example.com") or []
    )
    assert cors.preflight_headers(None) is None
    assert "allow" in repr(cors)
    assert repr(Cors([APP])) == "Cors(['https://app.example'], credentials=False)"
    assert repr(Cors("*")) == "Cors('*', credentials=False)"


def test_bad_cors_options_are_refused() -> None:
    with pytest.raises(ValueError, match="list the origins"):
        Cors("*", credentials=True)
    with pytest.raises(TypeError, match="list of origins"):
        Cors(APP)
    with pytest.raises(ValueError, match="not an origin"):
        Cors(["https://app.example/path"])
    with pytest.raises(TypeError, match="list of origins"):
        app_with(None, socket_origins=APP)
    with pytest.raises(ValueError, match="not an origin"):
        app_with(None, socket_origins=["app.example"])


@pytest.mark.parametrize(
    ("origin", "normalized"),
    [
        ("HTTPS://App.Example:443", "https://app.example"),
        ("http://app.example:80/", "http://app.example"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_normalize_origin(origin: str, normalized: str) -> None:
    assert normalize_origin(origin) == normalized


@pytest.mark.parametrize(
    "bad",
    [
        "null",
        "ftp://app.example",
        "https://",
        "https://app.example?x",
        "https://u@app.example",
        "https://app.example#x",
        "https://app.example:99999",
    ],
)
def test_not_origins(bad: str) -> None:
    with pytest.raises(ValueError, match="not an origin"):
        normalize_origin(bad)


# -- the socket's Origin check ----------------------------------------------------------


def handshake(origin: str | None, host: str = "board.example:8000") -> Request:
    headers = {"host": host}
    if origin is not None:
        headers["origin"] = origin
    return Request("GET", "/board/s1/ws", headers, {})


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, "board.example:8000", True),  # not a browser
        ("http://board.example:8000", "board.example:8000", True),
        ("https://board.example:8000", "board.example:8000", True),  # behind a TLS proxy
        ("https://board.example", "board.example:443", True),
        ("http://board.example", "board.example", True),
        ("http://board.example:8001", "board.example:8000", False),  # same site, not same origin
        ("http://evil.example:8000", "board.example:8000", False),
        ("http://sub.board.example:8000", "board.example:8000", False),
        ("null", "board.example:8000", False),  # sandboxed frames, file: pages
        ("ftp://board.example:8000", "board.example:8000", False),
        ("http://board.example:x", "board.example:8000", False),
        ("http://board.example:8000", "board.example:x", False),
    ],
)
def test_same_origin_by_host(origin: str | None, host: str, allowed: bool) -> None:
    assert SocketOriginCheck(None, None).allows(handshake(origin, host)) is allowed


def test_socket_origin_policies() -> None:
    evil = handshake("http://evil.example")
    assert not SocketOriginCheck(None, None).allows(evil)
    assert not SocketOriginCheck(None, None).allows(
        Request("GET", "/", {"origin": "http://a.b"}, {})
    )
    assert SocketOriginCheck(Cors(["http://evil.example"]), None).allows(evil)
    assert SocketOriginCheck(None, "*").allows(evil)
    assert SocketOriginCheck(None, ["HTTP://EVIL.example:80"]).allows(evil)
    assert not SocketOriginCheck(None, ["http://other.example"]).allows(evil)
    assert not SocketOriginCheck(None, ["http://other.example"]).allows(handshake("bad"))
    asked: list[str | None] = []

    def decide(origin: str | None, request: Request) -> bool:
        asked.append(origin)
        return origin is None

    check = SocketOriginCheck(None, decide)
    assert not check.allows(handshake("http://board.example:8000"))  # decides alone
    assert check.allows(handshake(None))
    assert asked == ["http://board.example:8000", None]


async def test_sockets_from_other_origins_are_refused_before_the_upgrade() -> None:
    friend = "http://friend.example"
    app = app_with(Cors([friend]), socket_origins=["http://partner.example"])
    with trio.fail_after(20):
        async with serving(app) as base:
            for origin in (None, base, friend, "http://partner.example"):
                headers = [] if origin is None else [(b"origin", origin.encode())]
                async with trio_websocket.open_websocket_url(
                    ws_url(base, "/board/s1/ws?startAfter=0"), extra_headers=headers
                ) as ws:
                    await ws.send_message(json.dumps({"kind": "unknown"}))
            for path in ("/board/s1/ws", "/board/ws", "/nope/ws"):
                with pytest.raises(trio_websocket.ConnectionRejected) as refused:
                    async with trio_websocket.open_websocket_url(
                        ws_url(base, path), extra_headers=[(b"origin", b"http://evil.example")]
                    ):
                        pass
                assert refused.value.status_code == 403
                assert refused.value.body is not None
                error = json.loads(refused.value.body)["error"]
                assert error["code"] == "FORBIDDEN"
                assert "evil.example" in error["message"]


async def test_the_stream_carries_cors_headers() -> None:
    app = app_with(Cors([APP]))
    with trio.fail_after(20):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
            headers = {"accept": "text/event-stream", "origin": APP}
            async with c.stream("GET", "/board/s1?startAfter=0", headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["access-control-allow-origin"] == APP
                assert response.headers["vary"] == "Origin"
                assert response.headers["content-type"].startswith("text/event-stream")
