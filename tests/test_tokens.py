"""Signed short-lived tokens: ``issue_token``, ``verify_token``, ``token_authorize``.

Claims and signatures are checked directly; the ready ``authorize`` runs in an
app (in-process ASGI) for every lane, including a token that expires under an
open stream. Tokens never reach a log line. Real browsers use them in
``test_browser_tokens.py``.
"""

from __future__ import annotations

import base64
import gc
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import httpx
import msgspec
import pytest
import trio
import trio.testing
import trio_websocket

import a2trio
from a2trio.push import PushedPresence
from a2trio.stores import memory
from a2trio.transport import (
    CallOperation,
    HistoryOperation,
    InspectOperation,
    Limits,
    PushOperation,
    RedriveOperation,
    Request,
    StateOperation,
    StreamOperation,
    SubscribeOperation,
    TokenClaims,
    asgi,
    issue_token,
    token_authorize,
    verify_token,
)
from a2trio.transport.server.tokens import token_of
from examples.board import board
from tests.browser_kit import ROOT, serve

from .test_browser_static import call
from .test_transport import serving, ws_url

# Client-side leftovers of trio-websocket's refused handshakes (test_transport.py).
pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


@pytest.fixture(autouse=True)
def collect_client_garbage() -> Iterator[None]:
    yield
    gc.collect()


SECRET = "s3cret-for-tests"
NOW = 1_800_000_000.0


def token(**overrides: object) -> str:
    options: dict[str, object] = {
        "contract": "board",
        "session_id": "s1",
        "operations": ("stream", "push"),
        "now": NOW,
    }
    options.update(overrides)
    return issue_token(SECRET, **options)  # type: ignore[arg-type]


def claims_of(text: str) -> dict[str, object]:
    payload = text.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(payload + "=="))
    return decoded


def test_a_token_carries_its_scope_and_expiry() -> None:
    text = token(ttl_s=60, subject="ann")
    assert text.startswith("v1.")
    claims = verify_token(SECRET, text, now=NOW + 59)
    assert claims.contract == "board"
    assert claims.session == "s1"
    assert claims.ops == ("stream", "push")
    assert claims.exp == NOW + 60
    assert claims.sub == "ann"
    assert claims.nonce
    assert token() != token()  # the nonce
    assert claims_of(text)["exp"] == NOW + 60


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "malformed"),
        ("v1.abc", "malformed"),
        ("v2.abc.def", "malformed"),
        ("v1..sig", "malformed"),
    ],
)
def test_malformed_tokens_are_forbidden(text: str, message: str) -> None:
    with pytest.raises(a2trio.A2Error, match=message) as refused:
        verify_token(SECRET, text, now=NOW)
    assert refused.value.code is a2trio.ErrorCode.FORBIDDEN


def test_forged_expired_and_rotated_tokens() -> None:
    text = token(ttl_s=60)
    version, payload, signature = text.split(".")
    widened = json.loads(base64.urlsafe_b64decode(payload + "=="))
    widened["ops"] = ["stream", "push", "inspect"]
    forged_payload = base64.urlsafe_b64encode(json.dumps(widened).encode()).rstrip(b"=").decode()
    for forged in (
        f"{version}.{forged_payload}.{signature}",
        f"{version}.{payload}.{signature[:-2]}AA",
        issue_token("another secret", contract="board", session_id="s1", now=NOW),
    ):
        with pytest.raises(a2trio.A2Error, match="signature is not valid"):
            verify_token(SECRET, forged, now=NOW)
        assert text not in str(forged)
    with pytest.raises(a2trio.A2Error, match="has expired"):
        verify_token(SECRET, text, now=NOW + 60)
    # Rotation: the old secret still verifies while its tokens live.
    assert verify_token(["new secret", SECRET], text, now=NOW).session == "s1"
    # A validly signed payload that is not claims.
    junk = "v1." + base64.urlsafe_b64encode(b"[1,2]").rstrip(b"=").decode()
    signed = junk + "." + token_signature(junk)
    with pytest.raises(a2trio.A2Error, match="malformed"):
        verify_token(SECRET, signed, now=NOW)


def token_signature(signed: str) -> str:
    import hashlib
    import hmac

    digest = hmac.new(SECRET.encode(), signed.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_bad_issues_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        issue_token("", contract="board", session_id="s1")
    with pytest.raises(ValueError, match="operations are some of"):
        issue_token(SECRET, contract="board", session_id="s1", operations=["delete"])
    with pytest.raises(ValueError, match="operations are some of"):
        issue_token(SECRET, contract="board", session_id="s1", operations=[])
    with pytest.raises(ValueError, match="must be positive"):
        issue_token(SECRET, contract="board", session_id="s1", ttl_s=0)
    with pytest.raises(ValueError, match="must not be empty"):
        token_authorize([SECRET, b""])


def presence(participant: str) -> PushedPresence:
    return PushedPresence(participant, {"viewing": "board"})


@pytest.mark.parametrize(
    ("claims", "operation", "allowed"),
    [
        (TokenClaims("board", "s1", ("stream",), NOW), StreamOperation("board", "s1", 0), True),
        (TokenClaims("board", "s1", ("stream",), NOW), StreamOperation("board", "s2", 0), False),
        (TokenClaims("board", None, ("stream",), NOW), StreamOperation("board", "s2", 0), True),
        (TokenClaims("board", None, ("stream",), NOW), StreamOperation("orders", "s2", 0), False),
        (TokenClaims("board", "s1", ("stream",), NOW), HistoryOperation("board", "s1"), False),
        (TokenClaims("board", "s1", ("history",), NOW), HistoryOperation("board", "s1"), True),
        (
            TokenClaims("board", None, ("subscribe",), NOW),
            SubscribeOperation("board", "x", 0),
            True,
        ),
        (TokenClaims("board", None, ("inspect",), NOW), InspectOperation("board"), True),
        (TokenClaims("board", "s1", ("inspect",), NOW), InspectOperation("board"), False),
        (TokenClaims("board", "s1", ("inspect",), NOW), InspectOperation("board", "s1"), True),
        (TokenClaims("board", "s1", ("push",), NOW), PushOperation("board", "s1"), True),
        (TokenClaims("vault", "v1", ("state",), NOW), StateOperation("vault", "v1"), True),
        (TokenClaims("vault", "v1", ("state",), NOW), CallOperation("vault", "v1", "put"), False),
        (TokenClaims("vault", "v1", ("call",), NOW), CallOperation("vault", "v1", "put"), True),
        (
            TokenClaims("board", "s1", ("inspect",), NOW),
            RedriveOperation("board", "s1", 3, "ann", "fixed"),
            False,
        ),
        (
            TokenClaims("board", "s1", ("push",), NOW, "ann"),
            PushOperation("board", "s1", (), presence("ann")),
            True,
        ),
        (
            TokenClaims("board", "s1", ("push",), NOW, "ann"),
            PushOperation("board", "s1", (), presence("bob")),
            False,
        ),
        (
            TokenClaims("board", "s1", ("push",), NOW),
            PushOperation("board", "s1", (), presence("bob")),
            True,
        ),
    ],
)
def test_claims_permit_exactly_their_scope(
    claims: TokenClaims, operation: a2trio.transport.Operation, allowed: bool
) -> None:
    assert claims.permits(operation) is allowed


def test_where_a_request_carries_its_token() -> None:
    def request(headers: dict[str, str], query: dict[str, str]) -> Request:
        return Request("GET", "/board/s1", headers, query)

    assert token_of(request({}, {"token": "q"})) == "q"
    assert token_of(request({"authorization": "Bearer  h "}, {})) == "h"
    assert token_of(request({"authorization": "Basic x"}, {})) is None
    cookies = {"cookie": "theme=dark; a2_token=c; other=1"}
    assert token_of(request(cookies, {}), cookie="a2_token") == "c"
    assert token_of(request(cookies, {})) is None
    assert token_of(request({"cookie": "a2_token="}, {}), cookie="a2_token") is None
    assert token_of(request({}, {"t": "x"}), param="t") == "x"


def test_a_requests_repr_hides_credentials() -> None:
    secret = token()
    request = Request(
        "GET",
        "/board/s1",
        {"authorization": f"Bearer {secret}", "cookie": f"a2_token={secret}", "accept": "*/*"},
        {"token": secret, "startAfter": "3"},
        ("127.0.0.1", 5),
    )
    shown = repr(request)
    assert secret not in shown
    assert "<hidden>" in shown
    assert "'startAfter': '3'" in shown
    assert "'accept': '*/*'" in shown


async def test_the_ready_authorize_on_every_lane() -> None:
    app = asgi(a2trio.Server(board, store=memory()), authorize=token_authorize(SECRET))
    granted = issue_token(SECRET, contract="board", session_id="s1", operations=["push", "history"])
    other = issue_token(SECRET, contract="board", session_id="s2", operations=["push", "history"])
    body = json.dumps(
        {"events": [{"type": "task_added", "payload": {"task_id": "t", "title": "T"}}]}
    ).encode()
    async with app.servers["board"]:
        assert (await call(app, "GET", b"/board/s1")).status == 403
        assert (await call(app, "GET", f"/board/s1?token={granted}".encode())).status == 200
        assert (await call(app, "GET", f"/board/s1?token={other}".encode())).status == 403
        bearer = [(b"authorization", f"Bearer {granted}".encode())]
        assert (await call(app, "GET", b"/board/s1", bearer)).status == 200
        refused = await call(app, "GET", b"/board/s1?token=v1.x.y")
        assert refused.status == 403
        assert json.loads(refused.body)["error"]["message"] == "the token's signature is not valid"
        assert granted not in refused.body.decode()
    app = asgi(a2trio.Server(board, store=memory()), authorize=token_authorize(SECRET))
    with trio.fail_after(20):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
            pushed = await c.post(f"/board/s1?token={granted}", content=body)
            assert pushed.status_code == 200
            assert (await c.post(f"/board/s2?token={granted}", content=body)).status_code == 403


async def test_a_stream_ends_soon_after_its_token_expires(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Open streams ask ``authorize`` again every ``reauthorize_s``: on the
    mock clock, a token that lapses ends its stream with ``the token has
    expired`` (resumable: the page fetches a new token and reconnects)."""
    clock = autojump_clock
    start = NOW

    def now() -> float:
        return start + clock.current_time()

    app = asgi(
        a2trio.Server(board, store=memory()),
        authorize=token_authorize(SECRET, clock=now),
        limits=Limits(reauthorize_s=10, heartbeat_s=1000),
    )
    short = issue_token(SECRET, contract="board", session_id="s1", ttl_s=25, now=start)
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: object) -> None:
        sent.append(dict(message))  # type: ignore[call-overload]

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/board/s1",
        "headers": [(b"accept", b"text/event-stream")],
        "query_string": f"token={short}".encode(),
    }
    async with app.servers["board"]:
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    frames = b"".join(m.get("body", b"") for m in sent[1:])  # type: ignore[misc]
    assert b"event: error" in frames
    assert b"the token has expired" in frames
    assert 25 <= clock.current_time() <= 30


async def test_tokens_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = asgi(a2trio.Server(board, store=memory()), authorize=token_authorize(SECRET))
    secret = issue_token(SECRET, contract="board", session_id="s1", operations=["history"])
    expired = issue_token(SECRET, contract="board", session_id="s1", ttl_s=1, now=NOW)
    with trio.fail_after(20):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
            for text in (secret, expired, secret + "x"):
                await c.get(f"/board/s1?token={text}")
                await c.get("/board/s1", headers={"authorization": f"Bearer {text}"})
                with pytest.raises(trio_websocket.ConnectionRejected):
                    async with trio_websocket.open_websocket_url(
                        ws_url(base, f"/board/s1/ws?token={text}"),
                        extra_headers=[(b"origin", b"http://evil.example")],
                    ):
                        pass
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("a2trio", "hypercorn")]
    assert ours
    for record in ours:
        line = record.getMessage() + repr(record.args)
        assert secret not in line
        assert expired not in line


def test_the_serve_command_logs_no_token() -> None:
    """``python -m a2trio.serve`` at debug level, with a socket refused for its
    origin and requests refused for their token: no token in its output."""
    code = """
import json, socket, sys, time, urllib.request, urllib.error
base = sys.argv[1]
for path in ("/board/s1?token=TOKEN-IN-QUERY", "/board/s1?token=v1.e30.TOKEN-SIGNED"):
    try:
        urllib.request.urlopen(base + path, timeout=5)
    except urllib.error.HTTPError as error:
        assert error.code in (200, 403), error.code
host, port = base.split("//")[1].split(":")
with socket.create_connection((host, int(port))) as s:
    s.sendall(b"GET /board/s1/ws?token=TOKEN-IN-SOCKET HTTP/1.1\\r\\nHost: x\\r\\n"
              b"Upgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
              b"Origin: http://evil.example\\r\\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\n"
              b"Sec-WebSocket-Version: 13\\r\\n\\r\\n")
    assert b" 403 " in s.recv(4096)
"""
    output: list[str] = []
    with serve("examples.board:server", "--log-level", "debug", output=output) as url:
        subprocess.run([sys.executable, "-c", code, url], check=True, cwd=ROOT, timeout=60)
    printed = "\n".join(output)
    assert "socket refused: origin 'http://evil.example'" in printed
    assert "stopped" in printed
    assert "TOKEN-" not in printed


def test_claims_round_trip_through_msgspec() -> None:
    claims = TokenClaims("board", None, ("stream",), NOW, None, "n")
    assert msgspec.json.decode(msgspec.json.encode(claims), type=TokenClaims) == claims
