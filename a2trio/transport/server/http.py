"""Plumbing shared by the lanes: ASGI types, refusals, the request body,
query and path parsing."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

import trio

from ...errors import A2Error, ErrorCode
from ...identifiers import MAX_SAFE_INTEGER
from .. import wire
from .auth import Request
from .limits import Limits

__all__ = [
    "Disconnected",
    "Message",
    "Receive",
    "Refusal",
    "Scope",
    "Send",
    "bad_input",
    "failure",
    "index_param",
    "logger",
    "path_segments",
    "read_body",
    "report",
    "request_of",
    "respond",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

logger: Final = logging.getLogger("a2trio.transport")

_INDEX: Final = re.compile(r"(?:0|[1-9][0-9]{0,15})")
_MALFORMED_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


class Disconnected(Exception):
    """The client left before its request body arrived."""


class Refusal(Exception):
    """A transport-level answer (404, 405, 413, 401) with its envelope."""

    def __init__(self, status: int, message: str, code: ErrorCode = ErrorCode.INVALID_PAYLOAD):
        super().__init__(message)
        self.status = status
        self.error = A2Error(code, message)


class _BadInput:
    """:func:`bad_input`'s context manager: a class, not a generator, since
    every push and every lane's id check enters it (a third of the cost)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, TypeError | ValueError):
            raise A2Error(ErrorCode.INVALID_PAYLOAD, str(exc)) from None


_BAD_INPUT: Final = _BadInput()


def bad_input() -> AbstractContextManager[None]:
    """The server raises ``TypeError``/``ValueError`` for a bad session id, event
    id or presence stamp: from the network these are the client's fault (400)."""
    return _BAD_INPUT


def report(exc: Exception) -> None:
    """Log a failure that is not a verdict on the input (a bug, an outage)."""
    if not isinstance(exc, A2Error | Refusal):
        logger.error("unexpected failure in a request", exc_info=exc)


def failure(exc: Exception) -> tuple[int, bytes]:
    """The status and envelope for a failed request. Anything unexpected is
    logged and answers a retryable 503, never a 500 (``asA2Error``)."""
    if isinstance(exc, Refusal):
        return exc.status, wire.encode_error(exc.error)
    report(exc)
    error = wire.as_a2_error(exc)
    return wire.error_status(error.code), wire.encode_error(error)


async def read_body(request: Request, receive: Receive, limits: Limits) -> bytes:
    """The request body, refused (413) as soon as it passes ``max_body_bytes``
    and (408) when it has not arrived within ``body_timeout_s``.

    Raises:
      Refusal: 413 or 408.
      Disconnected: the client left first (nothing is answered).
    """
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    length = int(declared) if declared.isdigit() else -1
    if length > limit:
        raise Refusal(413, f"request bodies are limited to {limit} bytes")
    channel = _channel(receive)
    message = _arrived(channel) if channel is not None else None
    if message is not None and message["type"] == "http.request":
        chunk: bytes = message.get("body", b"")
        if len(chunk) <= limit and (not message.get("more_body", False) or len(chunk) == length):
            return chunk
    body = bytearray()
    with trio.move_on_after(limits.body_timeout_s):
        while True:
            if message is None:
                message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            body += message.get("body", b"")
            if len(body) > limit:
                raise Refusal(413, f"request bodies are limited to {limit} bytes")
            # On hypercorn's channel the declared length read is the whole
            # body (the server frames it by that length): its last, empty
            # message is not waited for, a wake-up fewer per push. Another
            # server's receive is read to its end: httpx's ASGITransport
            # leaves its body iterator unclosed otherwise.
            more = message.get("more_body", False)
            if not more or (channel is not None and len(body) == length):
                return bytes(body)
            message = None
    raise Refusal(408, f"the request body did not arrive within {limits.body_timeout_s:g} s")


def _channel(receive: Receive) -> trio.MemoryReceiveChannel[Message] | None:
    """hypercorn's trio worker hands the app a trio memory channel's
    ``receive``: the channel, else None (another server)."""
    channel = getattr(receive, "__self__", None)
    return channel if isinstance(channel, trio.MemoryReceiveChannel) else None


def _arrived(channel: trio.MemoryReceiveChannel[Message]) -> Message | None:
    """The request's next message if the server already holds it, else None.

    A body that came with its headers (most pushes) is then taken at once,
    without the timer and the wake-up of a wait (a tenth of the app's own
    cost of a push).
    """
    try:
        return channel.receive_nowait()
    except (trio.WouldBlock, trio.EndOfChannel):
        return None  # (awaited, the channel says the same)


def index_param(name: str, raw: str | None) -> int | None:
    """A non-negative safe integer from a query parameter or header.

    Raises:
      A2Error: ``INVALID_PAYLOAD`` naming the parameter.
    """
    if raw is None:
        return None
    if _INDEX.fullmatch(raw) is None or int(raw) > MAX_SAFE_INTEGER:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"`{name}` must be a non-negative integer, got {raw[:40]!r}",
        )
    return int(raw)


def path_segments(scope: Scope) -> list[str]:
    """The path split on ``/`` before percent-decoding, so a session id may hold ``%2F``.

    Decoding is strict: an escape that is not UTF-8 (``%FF``) is refused rather
    than replaced with U+FFFD, which would make ``%FF``, ``%FE`` and ``%EF%BF%BD``
    one session; so is a ``%`` not followed by two hex digits, which ``unquote``
    keeps literally (``%G1`` would be the session ``%25G1`` names).

    Raises:
      A2Error: ``INVALID_PAYLOAD`` for a malformed escape or a segment that is
        not UTF-8.
    """
    raw = scope.get("raw_path") or scope["path"].encode()
    path: str = raw.decode("latin-1").partition("?")[0]
    if "%" not in path:
        return path.split("/")[1:]  # nothing to decode (most paths)
    if _MALFORMED_ESCAPE.search(path) is not None:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            "the path holds a malformed percent-escape: '%' must be followed by two hex digits",
        )
    try:
        return [unquote(segment, errors="strict") for segment in path.split("/")[1:]]
    except UnicodeDecodeError:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD, "the path holds a percent-escape that is not UTF-8"
        ) from None


def request_of(scope: Scope) -> Request:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    raw_query = scope.get("query_string", b"")
    query = dict(parse_qsl(raw_query.decode("latin-1"), True)) if raw_query else {}
    client = scope.get("client")
    return Request(
        scope.get("method", "GET"),
        scope["path"],
        headers,
        query,
        (str(client[0]), int(client[1])) if client else None,
    )


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the client disconnects (HTTP or WebSocket): a
    stream's other tasks only send, so this one listens."""
    while True:
        message = await receive()
        if message["type"] in ("http.disconnect", "websocket.disconnect"):
            scope.cancel(reason="client disconnected")
            return


async def refuse_handshake(send: Send, exc: Exception) -> None:
    """Answer a WebSocket upgrade request with the error envelope and its
    status (the ASGI denial response), instead of accepting it."""
    status, body = failure(exc)
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})
