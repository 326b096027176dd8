"""The lane's ASGI app: every stream path under it, over one a2trio store.

=============== =============================================================
request         answer
=============== =============================================================
``PUT``         create (or fork: ``Stream-Forked-From``): 201, or 200 / 409
``POST``        append, close (``Stream-Closed: true``), or both: 204 / 200
``GET``         catch-up (``?offset=``), long-poll or SSE (``&live=``): 200
``HEAD``        the tail offset, content type, TTL, expiry, closure: 200
``DELETE``      204 (soft while forks read it)
``OPTIONS``     a CORS preflight (with ``cors=``)
``*/__ds/...``  subscriptions and their keys (:mod:`.subscription_routes`)
=============== =============================================================

Every stream of the lane is a session of the built-in contract
(:mod:`.model`), so the lane serves whatever store its server has: memory,
SQLite, Postgres or Redis. A mounted server's sessions
(``sessions=[orders_server]``) are readable at ``/{contract}/{session}``
in JSON mode (:mod:`.sessions`). Every answer carries the browser security
headers of Section 12.7; errors are short ``text/plain`` bodies with the
protocol's status codes; nothing is written on any error.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl

import trio

from ... import A2Error, ErrorCode, Server
from .. import Authorize, Cors, Limits, Request
from .context import LaneContext, Receive, Refusal, Scope, Send, StreamOperation, logger
from .forks import create_fork, delete_stream, reap, resolve_fork
from .live import serve_read
from .model import CONTRACT, Fork, Producer, StreamState
from .protocol import (
    CONTENT_TYPE,
    DECIMAL,
    MAX_SAFE_INTEGER,
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    REQUEST_HEADERS,
    RESPONSE_HEADERS,
    STREAM_CLOSED,
    STREAM_EXPIRES_AT,
    STREAM_FORK_OFFSET,
    STREAM_FORK_SUB_OFFSET,
    STREAM_FORKED_FROM,
    STREAM_NEXT_OFFSET,
    STREAM_SEQ,
    STREAM_TTL,
    Offset,
    parse_offset,
)
from .sessions import serve_session
from .subscription_model import CONTRACT as SUBSCRIPTIONS_CONTRACT
from .subscription_routes import control_path, serve_control
from .subscriptions import WEBHOOK_TIMEOUT_S, Subscriptions
from .table import Answer, Streams
from .writes import AppendRequest, CreateRequest, decide_append, decide_create, gone, missing

__all__ = ["DEFAULT_LIMITS", "DurableStreams", "StreamOperation"]

#: The lane's limits: bodies up to 8 MiB (an append is one event, one row),
#: arriving within 30 s.
DEFAULT_LIMITS: Final = Limits(max_body_bytes=8 * 1024 * 1024)
#: How much of a body over the cap is read (and dropped) to answer 413 in
#: order: past it the connection is closed under the client.
DRAIN_BYTES: Final = 64 * 1024 * 1024
#: How long a long-poll waits for data before answering 204.
LONG_POLL_S: Final = 10.0
#: How long one SSE response lasts before the server ends it (clients
#: reconnect from the last control event's offset): Section 10.2's minute,
#: which lets a CDN collapse readers.
SSE_RECONNECT_S: Final = 60.0
#: About how many bytes one catch-up response (or SSE catch-up frame)
#: carries, past it by at most one append. The protocol lets the server
#: choose; an answer is built in memory, so each catch-up read in flight
#: holds a few times this (its appends, then the joined body or frame).
#: 8 MiB, the largest append: 32 MB catch up in 4 reads, not 32 (1 MiB).
CHUNK_BYTES: Final = 8 * 1024 * 1024

_SECURITY: Final = [
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
]
#: A ``type/subtype`` at the start of ``Content-Type``; anything else is
#: ignored (and a new stream defaults to ``application/octet-stream``).
_CONTENT_TYPE: Final = re.compile(r"[\w.+-]+/[\w.+-]+")


class _Disconnected(Exception):
    """The client left before its body arrived."""


def _header_list(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


class DurableStreams:
    """The Durable Streams lane: an ASGI 3 app. Build it with
    :func:`~a2trio.transport.durable_streams.durable_streams`."""

    def __init__(
        self,
        server: Server,
        *,
        sessions: Sequence[Server] = (),
        authorize: Authorize | None = None,
        limits: Limits = DEFAULT_LIMITS,
        cors: Cors | None = None,
        long_poll_s: float = LONG_POLL_S,
        sse_reconnect_s: float = SSE_RECONNECT_S,
        chunk_bytes: int = CHUNK_BYTES,
        signing_key: bytes | None = None,
        local_webhooks: bool = False,
        webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
    ) -> None:
        if server.contract is not CONTRACT:
            raise TypeError("the lane's server must implement durable_streams.CONTRACT")
        mounted: dict[str, Server] = {}
        for other in sessions:
            if not isinstance(other, Server):
                raise TypeError(f"sessions= takes a2trio.Server objects, got {other!r}")
            mounted[other.contract.name] = other
        if not long_poll_s > 0 or not sse_reconnect_s > 0 or chunk_bytes <= 0:
            raise ValueError("long_poll_s, sse_reconnect_s and chunk_bytes must be positive")
        if not webhook_timeout_s > 0:
            raise ValueError("webhook_timeout_s must be positive")
        self.server = server
        self.sessions: Mapping[str, Server] = mounted
        self.authorize = authorize
        self.limits = limits
        self.cors = cors
        self.long_poll_s = long_poll_s
        self.sse_reconnect_s = sse_reconnect_s
        self.chunk_bytes = chunk_bytes
        self.streams = Streams(server)
        # The subscriptions' session is of a contract of its own, on the same store.
        self.subscriptions_server = Server(
            SUBSCRIPTIONS_CONTRACT,
            store=server.store,
            clock=server.clock,
            run_handlers=False,
            sweep=False,
        )
        self.subscriptions = Subscriptions(
            self.streams,
            self.subscriptions_server,
            signing_key=signing_key,
            local_webhooks=local_webhooks,
            webhook_timeout_s=webhook_timeout_s,
        )
        self.context = LaneContext(
            self.streams,
            authorize=authorize,
            limits=limits,
            long_poll_s=long_poll_s,
            sse_reconnect_s=sse_reconnect_s,
            chunk_bytes=chunk_bytes,
        )

    def __repr__(self) -> str:
        return f"DurableStreams(store={self.server.store!r})"

    @asynccontextmanager
    async def opened(self, *, sessions: bool = True) -> AsyncIterator[DurableStreams]:
        """Open the lane's server (and, with ``sessions``, the mounted
        session servers) and run its subscriptions' tasks for the block: what
        the lifespan does."""
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.server)
            await stack.enter_async_context(self.subscriptions_server)
            await stack.enter_async_context(self.subscriptions.running())
            if sessions:
                for other in self.sessions.values():
                    await stack.enter_async_context(other)
            yield self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point (``lifespan`` and ``http`` scopes).

        Cancellation: a cancelled append committed all of it or nothing; a
        client's retry with the same producer tuple is deduplicated.
        """
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self.handle(scope, receive, send, scope["path"])

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Open the lane's server for the app's lifetime, in the lifespan task."""
        await receive()  # lifespan.startup
        async with AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.opened())
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    # -- one request ---------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Serve one HTTP request for the stream (or session) at ``path``."""
        request = _request_of(scope, path)
        extra = self._cors_headers(request)
        try:
            if request.method == "OPTIONS":
                await self._preflight(request, send, extra)
                return
            answer = await self._route(scope, request, receive, send, extra)
        except _Disconnected:
            return
        except Refusal as refusal:
            answer = refusal.answer
        except A2Error as exc:
            answer = _error_answer(exc)
        except ValueError as exc:
            answer = Answer(400, {}, str(exc).encode())
        except Exception:
            # Never a 500, never the internal text: logged, and retryable.
            logger.exception("durable streams: %s %s failed", request.method, path[:200])
            answer = Answer(503, {"retry-after": "1"}, b"internal error")
        if answer is not None:
            await _respond(send, answer, extra, head=request.method == "HEAD")

    def _cors_headers(self, request: Request) -> list[tuple[bytes, bytes]]:
        headers = list(_SECURITY)
        cors = self.cors
        origin = request.headers.get("origin")
        if cors is None or origin is None:
            return headers
        if cors.any_origin:
            headers.append((b"access-control-allow-origin", b"*"))
        elif cors.allows(origin):
            headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
            headers.append((b"vary", b"origin"))
            if cors.credentials:
                headers.append((b"access-control-allow-credentials", b"true"))
        else:
            return headers
        exposed = ", ".join(h for h in (RESPONSE_HEADERS, cors.expose_headers) if h)
        headers.append((b"access-control-expose-headers", exposed.encode()))
        return headers

    async def _preflight(
        self, request: Request, send: Send, extra: list[tuple[bytes, bytes]]
    ) -> None:
        cors = self.cors
        if cors is None:
            await _respond(send, Answer(405, {"allow": "GET, HEAD, POST, PUT, DELETE"}), extra)
            return
        origin = request.headers.get("origin", "")
        if not (cors.any_origin or cors.allows(origin)):
            await _respond(send, Answer(403, {}, b"this origin may not use the lane"), extra)
            return
        allowed = ", ".join(h for h in (REQUEST_HEADERS, cors.allow_headers) if h)
        headers = {
            "access-control-allow-methods": "GET, HEAD, POST, PUT, DELETE, OPTIONS",
            "access-control-allow-headers": allowed,
            "access-control-max-age": str(cors.max_age_s),
        }
        await _respond(send, Answer(204, headers), extra)

    async def _route(
        self,
        scope: Scope,
        request: Request,
        receive: Receive,
        send: Send,
        extra: list[tuple[bytes, bytes]],
    ) -> Answer | None:
        path = request.path
        control = control_path(path)
        if control is not None:
            root, rest = control
            return await serve_control(
                self.subscriptions, self.context, self.body, scope, request, receive, root, rest
            )
        first = path.lstrip("/").split("/", 1)[0]
        mounted = self.sessions.get(first)
        if mounted is not None:
            return await serve_session(self.context, mounted, scope, request, receive, send, extra)
        method = request.method
        if method in ("PUT", "POST", "DELETE"):
            if method == "PUT":
                answer = await self._create(scope, request, receive)
            elif method == "POST":
                answer = await self._append(request, receive)
            else:
                await self.context.authorized(request, StreamOperation("delete", path))
                answer = await delete_stream(self.streams, path)
            if answer.status < 300:
                self.subscriptions.changed(path)
            return answer
        if method == "HEAD":
            await self.context.authorized(request, StreamOperation("head", path))
            return await self._head(path)
        if method == "GET":
            return await serve_read(self.context, scope, request, receive, send, extra)
        return Answer(405, {"allow": "GET, HEAD, POST, PUT, DELETE, OPTIONS"}, b"not allowed")

    async def body(self, request: Request, receive: Receive) -> bytes:
        """The request body: 413 past ``max_body_bytes``, 408 when it does
        not arrive within ``body_timeout_s``. A body refused for its size is
        still read through (and dropped, up to :data:`DRAIN_BYTES`), so the
        client, which is still sending it, gets the 413 rather than a reset."""
        limit = self.limits.max_body_bytes
        body = bytearray()
        size = 0
        with trio.move_on_after(self.limits.body_timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                if size <= limit:
                    body += chunk
                elif size > DRAIN_BYTES:
                    break
                if not message.get("more_body", False):
                    if size > limit:
                        break
                    return bytes(body)
            raise Refusal(413, f"request bodies are limited to {limit} bytes")
        raise Refusal(408, f"the body did not arrive within {self.limits.body_timeout_s:g} s")

    async def _create(self, scope: Scope, request: Request, receive: Receive) -> Answer:
        headers = request.headers
        path = request.path
        forked_from = headers.get(STREAM_FORKED_FROM)
        content_type = headers.get(CONTENT_TYPE, "").strip()
        if not _valid_content_type(content_type):
            content_type = ""
        ttl = headers.get(STREAM_TTL)
        expires_at = headers.get(STREAM_EXPIRES_AT)
        if ttl is not None and expires_at is not None:
            raise Refusal(400, "send Stream-TTL or Stream-Expires-At, not both")
        ttl_s = None
        if ttl is not None:
            if not DECIMAL.match(ttl):
                raise Refusal(400, "Stream-TTL must be whole seconds, without sign or zeros")
            ttl_s = int(ttl)
        expires_at_ms = None
        if expires_at is not None:
            expires_at_ms = _expiry_ms(expires_at)
        fork_offset_text = headers.get(STREAM_FORK_OFFSET)
        sub_offset_text = headers.get(STREAM_FORK_SUB_OFFSET)
        fork_offset: Offset | None = None
        if fork_offset_text is not None:
            fork_offset = parse_offset(fork_offset_text)
            if fork_offset is None:
                raise Refusal(400, "Stream-Fork-Offset is not an offset of this server")
        sub_offset = 0
        if sub_offset_text is not None:
            if forked_from is None:
                raise Refusal(400, "Stream-Fork-Sub-Offset needs Stream-Forked-From")
            if not DECIMAL.match(sub_offset_text):
                raise Refusal(400, "Stream-Fork-Sub-Offset must be a non-negative integer")
            sub_offset = int(sub_offset_text)
        closed = headers.get(STREAM_CLOSED, "").lower() == "true"
        await self.context.authorized(
            request, StreamOperation("create", path, closed, forked_from=forked_from)
        )
        body = await self.body(request, receive)
        location = _location(scope, request)
        await reap(self.streams, path, await self.streams.state(path))
        if forked_from is None:
            create = CreateRequest(
                content_type or "application/octet-stream",
                ttl_s,
                expires_at,
                expires_at_ms,
                closed,
                None,
                body,
            )
            return await self.streams.write(
                path, decide_create(path, create, self.streams.now_ms, location)
            )
        await self.context.authorized(request, StreamOperation("read", forked_from))
        resolved = await resolve_fork(
            self.streams, forked_from, fork_offset, sub_offset, content_type or None
        )
        if isinstance(resolved, Answer):
            return resolved
        source, offset_text, prefix = resolved
        if ttl_s is None and expires_at is None:
            ttl_s, expires_at, expires_at_ms = (
                source.ttl_s,
                source.expires_at,
                source.expires_at_ms,
            )
        fork = Fork(forked_from, source.start, offset_text, sub_offset, source.depth + 1)
        create = CreateRequest(
            source.content_type,
            ttl_s,
            expires_at,
            expires_at_ms,
            closed,
            fork,
            body,
            prefix,
            fork_offset_text is not None,
        )
        return await create_fork(self.streams, path, create, location)

    async def _append(self, request: Request, receive: Receive) -> Answer:
        headers = request.headers
        path = request.path
        close = headers.get(STREAM_CLOSED, "").lower() == "true"
        producer = _producer(headers)
        await self.context.authorized(request, StreamOperation("append", path, close))
        body = await self.body(request, receive)
        content_type = headers.get(CONTENT_TYPE)
        if body and not content_type:
            raise Refusal(400, "an append with a body needs a Content-Type")
        if not body and not close:
            raise Refusal(400, "an empty append: send data, or Stream-Closed: true")
        append = AppendRequest(body, content_type, headers.get(STREAM_SEQ), close, producer)
        return await self.streams.write(path, decide_append(path, append, self.streams.now_ms))

    async def _head(self, path: str) -> Answer:
        state = await self.streams.state(path)
        status = state.status(self.streams.now_ms)
        if status != "live":
            await reap(self.streams, path, state)
            return missing(path) if status == "missing" else gone(path)
        return Answer(200, head_headers(state), b"")


def head_headers(state: StreamState) -> dict[str, str]:
    """``HEAD``'s metadata (Section 5.5), never cached."""
    headers = {
        CONTENT_TYPE: state.content_type,
        STREAM_NEXT_OFFSET: state.tail_offset,
        "cache-control": "no-store",
    }
    if state.closed:
        headers[STREAM_CLOSED] = "true"
    if state.ttl_s is not None:
        headers[STREAM_TTL] = str(state.ttl_s)
    if state.expires_at is not None:
        headers[STREAM_EXPIRES_AT] = state.expires_at
    return headers


def _valid_content_type(content_type: str) -> bool:
    return _CONTENT_TYPE.match(content_type) is not None


def _expiry_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refusal(400, "Stream-Expires-At must be an RFC 3339 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _producer(headers: Mapping[str, str]) -> Producer | None:
    given = [headers.get(h) for h in (PRODUCER_ID, PRODUCER_EPOCH, PRODUCER_SEQ)]
    if all(v is None for v in given):
        return None
    producer_id, epoch, seq = given
    if producer_id is None or epoch is None or seq is None:
        raise Refusal(400, "send Producer-Id, Producer-Epoch and Producer-Seq together")
    if not producer_id:
        raise Refusal(400, "Producer-Id must not be empty")
    numbers = []
    for name, text in ((PRODUCER_EPOCH, epoch), (PRODUCER_SEQ, seq)):
        if not text.isdigit() or not text.isascii() or int(text) > MAX_SAFE_INTEGER:
            raise Refusal(400, f"{name} must be an integer from 0 to 2^53-1")
        numbers.append(int(text))
    return Producer(producer_id, numbers[0], numbers[1])


def _request_of(scope: Scope, path: str) -> Request:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), True))
    client = scope.get("client")
    return Request(
        scope.get("method", "GET"),
        path,
        headers,
        query,
        (str(client[0]), int(client[1])) if client else None,
    )


def _location(scope: Scope, request: Request) -> str:
    host = request.headers.get("host", "localhost")
    scheme = scope.get("scheme", "http")
    return f"{scheme}://{host}{scope.get('root_path', '')}{request.path}"


def _error_answer(exc: A2Error) -> Answer:
    if exc.code is ErrorCode.FORBIDDEN:
        return Answer(403, {}, exc.message.encode())
    if exc.code in (ErrorCode.INVALID_PAYLOAD, ErrorCode.PARTIAL_DUPLICATE_BATCH):
        return Answer(400, {}, exc.message.encode())
    if exc.code is ErrorCode.STORE_UNAVAILABLE:
        logger.warning("store unavailable: %s", exc.message)
        return Answer(503, {"retry-after": "1"}, exc.message.encode())
    return Answer(409, {}, exc.message.encode())


async def _respond(
    send: Send, answer: Answer, extra: list[tuple[bytes, bytes]], *, head: bool = False
) -> None:
    headers = _header_list(answer.headers)
    if answer.body and CONTENT_TYPE not in answer.headers:
        headers.append((b"content-type", b"text/plain; charset=utf-8"))
    if not head or answer.status != 200:
        headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": b"" if head else answer.body})
