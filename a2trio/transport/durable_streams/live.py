"""``GET``: catch-up reads, long-polls and SSE streams of a stream.

A catch-up read answers the appends after the offset (Section 5.6). A
long-poll at the tail waits for the next append (5.7); an SSE stream sends
the catch-up as ``data`` + ``control`` pairs, then follows (5.8). Both
follow through ``session.subscribe``: in one process every reader of a
stream shares one store feed (``a2trio.fanout``) and an append wakes them
all at once; other processes' appends arrive through the store's own
notifications (polling, on SQLite). A fork follows its own session only, so
its source's later appends never wake it (5.7, on forked streams).

Every live answer carries a cursor (Section 10.1). A reader of a stream
with a sliding TTL keeps it alive: the read is recorded (``touched``) when
half the TTL has passed since the last access, at the start of a read and
at each heartbeat of a live one.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

import trio

from ... import Event, Lapped
from .. import Request
from .context import LaneContext, Receive, Scope, Send, StreamOperation, logger
from .forks import reap
from .model import APPEND_TYPES, Nothing, StreamState
from .protocol import (
    CONTENT_TYPE,
    SSE_DATA_ENCODING,
    STREAM_CLOSED,
    STREAM_CURSOR,
    STREAM_NEXT_OFFSET,
    STREAM_UP_TO_DATE,
    Offset,
    control_frame,
    data_frame,
    is_json,
    is_text,
    parse_offset,
    response_cursor,
)
from .reads import Chunk, item_of, read_chunk
from .table import Answer, Streams
from .writes import gone, missing

__all__ = ["ReadRequest", "read_request", "serve_read", "touch"]

_LIVE: Final = frozenset({"long-poll", "sse"})
T = TypeVar("T")


class ReadRequest:
    """A ``GET``'s query: the offset (None: the start; ``now``: the tail),
    the live mode and the client's cursor."""

    __slots__ = ("cursor", "live", "now", "offset", "offset_text")

    def __init__(self, query_string: bytes) -> None:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
        offsets = [value for key, value in pairs if key == "offset"]
        if len(offsets) > 1:
            raise ValueError("give one offset")
        self.offset_text = offsets[0] if offsets else None
        values = dict(pairs)
        self.live = values.get("live")
        self.cursor = values.get("cursor")
        if self.live is not None and self.live not in _LIVE:
            raise ValueError("live must be long-poll or sse")
        if self.live is not None and self.offset_text is None:
            raise ValueError(f"live={self.live} needs an offset (-1 for the start)")
        self.now = self.offset_text == "now"
        self.offset: Offset | None = None
        if self.offset_text not in (None, "-1", "now"):
            assert self.offset_text is not None
            self.offset = parse_offset(self.offset_text)
            if self.offset is None:
                raise ValueError("the offset is not one this server gave out")


def read_request(scope: Scope) -> ReadRequest:
    return ReadRequest(scope.get("query_string", b""))


async def touch(streams: Streams, path: str, state: StreamState) -> None:
    """Record a read of a stream with a sliding TTL, at most once per half TTL."""
    if state.ttl_s is None:
        return
    if streams.now_ms - state.last_access_ms >= state.ttl_s * 500:
        await streams.append_now(path, "touched", Nothing())


def _base_headers(state: StreamState) -> dict[str, str]:
    return {CONTENT_TYPE: state.content_type}


def _closed_at(state: StreamState, chunk: Chunk) -> bool:
    return state.closed and chunk.up_to_date and chunk.next_offset == state.tail_offset


async def until_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` until it returns or the client leaves (None). Its
    exception propagates as itself, not wrapped in an exception group."""
    outcome: list[T] = []
    failure: list[Exception] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    nursery.cancel_scope.cancel(reason="the client left")
                    return

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:
                failure.append(exc)
            finally:
                nursery.cancel_scope.cancel(reason="the answer is complete")

        nursery.start_soon(watch)
        nursery.start_soon(run)
    if failure:
        raise failure[0]
    return outcome[0] if outcome else None


async def serve_read(
    context: LaneContext,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
) -> Answer | None:
    """A ``GET`` of a stream; None once an SSE stream was written."""
    read = read_request(scope)
    path = request.path
    await context.authorized(request, StreamOperation("read", path, live=read.live))
    streams = context.streams
    state = await streams.state(path)
    status = state.status(streams.now_ms)
    if status != "live":
        await reap(streams, path, state)
        return missing(path) if status == "missing" else gone(path)
    await touch(streams, path, state)
    state = streams.cached(path) or state
    after = parse_offset(state.tail_offset) if read.now else read.offset
    if read.live == "sse":
        await _sse(context, path, state, after, read, receive, send, extra)
        return None
    if read.now and read.live is None:
        headers = _base_headers(state)
        headers.update({STREAM_NEXT_OFFSET: state.tail_offset, STREAM_UP_TO_DATE: "true"})
        headers["cache-control"] = "no-store"
        if state.closed:
            headers[STREAM_CLOSED] = "true"
        return Answer(200, headers, b"[]" if is_json(state.content_type) else b"")
    chunk = await read_chunk(streams, path, state, after, max_bytes=context.chunk_bytes)
    if read.live == "long-poll" and not chunk.items:
        return await _long_poll(context, path, state, read, receive)
    headers = _base_headers(state)
    headers[STREAM_NEXT_OFFSET] = chunk.next_offset
    if chunk.up_to_date:
        headers[STREAM_UP_TO_DATE] = "true"
    closed = _closed_at(state, chunk)
    if closed:
        headers[STREAM_CLOSED] = "true"
    if read.live == "long-poll":
        headers[STREAM_CURSOR] = response_cursor(read.cursor)
    start = read.offset_text if read.offset_text is not None else "-1"
    tag = base64.urlsafe_b64encode(f"{path}\x1f{state.start}".encode()).decode()
    etag = f'"{tag}:{start}:{chunk.next_offset}{":c" if closed else ""}"'
    headers["etag"] = etag
    if request.headers.get("if-none-match") == etag:
        return Answer(304, {"etag": etag})
    if chunk.items:
        scope_word = "private" if context.authorize is not None else "public"
        headers["cache-control"] = f"{scope_word}, max-age=60, stale-while-revalidate=300"
    else:
        headers["cache-control"] = "no-store"
    return Answer(200, headers, chunk.body(state.content_type))


def _new_appends(state: StreamState, events: list[Event[Any]]) -> list[Event[Any]]:
    return [e for e in events if e.type in APPEND_TYPES and e.index > state.start]


async def _long_poll(
    context: LaneContext, path: str, state: StreamState, read: ReadRequest, receive: Receive
) -> Answer:
    """Wait at the tail for the next append, the stream's closure, or the timeout."""
    streams = context.streams
    timed_out = Answer(
        204,
        {
            STREAM_NEXT_OFFSET: state.tail_offset,
            STREAM_UP_TO_DATE: "true",
            STREAM_CURSOR: response_cursor(read.cursor),
        },
    )
    if state.closed:
        return Answer(
            204,
            {
                STREAM_NEXT_OFFSET: state.tail_offset,
                STREAM_UP_TO_DATE: "true",
                STREAM_CLOSED: "true",
            },
        )
    start = state.start
    session = streams.server.session(path)

    async def wait() -> Answer:
        with trio.move_on_after(context.long_poll_s):
            try:
                async with session.subscribe(state.index) as subscription:
                    while True:
                        run = [entry.event for entry in await subscription.receive_run()]
                        current = streams.advance(path, run) or await streams.state(path)
                        if current.start != start or not current.exists:
                            return timed_out
                        appends = _new_appends(current, run)
                        if appends:
                            return _appended_answer(current, appends, read)
                        if current.closed:
                            headers = dict(timed_out.headers)
                            headers[STREAM_NEXT_OFFSET] = current.tail_offset
                            headers[STREAM_CLOSED] = "true"
                            return Answer(204, headers)
            except Lapped:
                current = await streams.state(path)
                after = parse_offset(state.tail_offset)
                chunk = await read_chunk(
                    streams, path, current, after, max_bytes=context.chunk_bytes
                )
                return _chunk_answer(current, chunk, read)
        final = streams.cached(path) or state
        if final.closed:
            timed_out.headers[STREAM_CLOSED] = "true"
        return timed_out

    return await until_disconnect(receive, wait) or timed_out


def _chunk_answer(state: StreamState, chunk: Chunk, read: ReadRequest) -> Answer:
    headers = _base_headers(state)
    headers[STREAM_NEXT_OFFSET] = chunk.next_offset
    headers[STREAM_CURSOR] = response_cursor(read.cursor)
    if chunk.up_to_date:
        headers[STREAM_UP_TO_DATE] = "true"
    if _closed_at(state, chunk):
        headers[STREAM_CLOSED] = "true"
    return Answer(200, headers, chunk.body(state.content_type))


def _appended_answer(state: StreamState, appends: list[Event[Any]], read: ReadRequest) -> Answer:
    items = [item_of(e, state.depth) for e in appends]
    chunk = Chunk(items, items[-1].offset, True)
    return _chunk_answer(state, chunk, read)


def _data(state: StreamState, chunk: Chunk) -> bytes:
    return data_frame(chunk.body(state.content_type), text=is_text(state.content_type))


async def _sse(
    context: LaneContext,
    path: str,
    state: StreamState,
    after: Offset | None,
    read: ReadRequest,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
) -> None:
    """Write an SSE stream: the catch-up in chunks, then each new append,
    each ``data`` event followed by its ``control`` event."""
    streams = context.streams
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    if not is_text(state.content_type):
        headers.append((SSE_DATA_ENCODING.encode(), b"base64"))
    await send({"type": "http.response.start", "status": 200, "headers": headers + extra})

    async def write(frame: bytes) -> None:
        await send({"type": "http.response.body", "body": frame, "more_body": True})

    def control(next_offset: str, up_to_date: bool, closed: bool) -> bytes:
        cursor = None if closed else response_cursor(read.cursor)
        return control_frame(next_offset, cursor=cursor, up_to_date=up_to_date, closed=closed)

    start = state.start

    async def stream() -> None:
        nonlocal state
        with trio.move_on_after(context.sse_reconnect_s):
            position = after
            while True:
                # Catch up (again, after a lapse) in chunks, each one pair.
                while True:
                    chunk = await read_chunk(
                        streams, path, state, position, max_bytes=context.chunk_bytes
                    )
                    closed = _closed_at(state, chunk)
                    frame = control(chunk.next_offset, chunk.up_to_date, closed)
                    await write((_data(state, chunk) if chunk.items else b"") + frame)
                    if closed:
                        return
                    position = parse_offset(chunk.next_offset)
                    if chunk.up_to_date:
                        break
                try:
                    await _follow(context, path, state, start, write, control)
                    return
                except Lapped:
                    state = await streams.state(path)

    try:
        await until_disconnect(receive, stream)
    except Exception:
        # The answer has started: end it; the client resumes from its offset.
        logger.exception("durable streams: an SSE stream failed")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _follow(
    context: LaneContext,
    path: str,
    state: StreamState,
    start: int,
    write: Any,
    control: Any,
) -> None:
    streams = context.streams
    session = streams.server.session(path)
    async with session.subscribe(state.index) as subscription:
        while True:
            run: list[Event[Any]] = []
            with trio.move_on_after(context.limits.heartbeat_s):
                run = [entry.event for entry in await subscription.receive_run()]
            current = streams.advance(path, run) if run else streams.cached(path)
            if current is None:
                current = await streams.state(path)
            if current.start != start or not current.exists:
                return
            if not run:
                await touch(streams, path, current)
                await write(control(current.tail_offset, True, False))
                continue
            appends = _new_appends(current, run)
            if appends:
                items = [item_of(e, current.depth) for e in appends]
                chunk = Chunk(items, items[-1].offset, True)
                closed = _closed_at(current, chunk)
                await write(_data(current, chunk) + control(chunk.next_offset, True, closed))
                if closed:
                    return
            elif current.closed:
                await write(control(current.tail_offset, True, True))
                return
