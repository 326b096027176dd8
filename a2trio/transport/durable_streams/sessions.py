"""An ordinary contract's session, read through the lane (JSON mode, read-only).

``GET /{contract}/{session}`` of a server mounted with ``sessions=`` answers
as a JSON-mode stream whose messages are the session's events in the wire
format of the other lanes (``{id, type, payload, index, sessionId,
createdAt}``), so any Durable Streams client can follow a contract's session
live and resume from an offset. The offset after event ``N`` is
``0000000000000000_{N:016d}``; the session is never closed. Writes answer
405: events are pushed through the session lanes, where the contract's
schemas and ``validate_push`` apply.

Authorization asks the other lanes' operations: a catch-up read and ``HEAD``
are a ``HistoryOperation``, a long-poll or SSE stream a ``StreamOperation``.
"""

from __future__ import annotations

from typing import Any, Final

import trio

from ... import Event, Lapped, Reducer, Server
from .. import HistoryOperation, Request, wire
from .. import StreamOperation as SessionStreamOperation
from .context import LaneContext, Receive, Scope, Send, logger
from .live import ReadRequest, until_disconnect
from .protocol import (
    CONTENT_TYPE,
    STREAM_CURSOR,
    STREAM_NEXT_OFFSET,
    STREAM_UP_TO_DATE,
    Offset,
    control_frame,
    data_frame,
    format_offset,
    response_cursor,
)
from .table import Answer

__all__ = ["TAIL", "serve_session"]

#: A session's last index, as a reducer: a snapshot away, not a log read.
TAIL: Final[Reducer[int]] = Reducer("durable_streams.tail", 0, lambda _, event: event.index)
#: Events per catch-up answer.
PAGE_EVENTS: Final = 1_000
_JSON: Final = "application/json"


def _message(event: Event[Any]) -> bytes:
    """One event as a JSON message: made once per event for every reader
    of the session in the process (``FeedEntry.encoded``)."""
    return wire.encode(wire.event_to_wire(event))


def _offset(index: int) -> str:
    return format_offset(Offset(0, index))


def _body(messages: list[bytes]) -> bytes:
    return b"[" + b",".join(messages) + b"]"


async def serve_session(
    context: LaneContext,
    server: Server,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
) -> Answer | None:
    """A request for ``/{contract}/{session}`` of a mounted server."""
    if request.method not in ("GET", "HEAD"):
        return Answer(405, {"allow": "GET, HEAD"}, b"a mounted session is read-only here")
    contract = server.contract.name
    session_id = request.path.lstrip("/").split("/", 1)[1] if "/" in request.path[1:] else ""
    if not session_id:
        return Answer(404, {}, b"the path names a contract, not a session")
    session = server.session(session_id)
    read = ReadRequest(scope.get("query_string", b""))
    tail, _ = await session.state(TAIL)
    after = tail if read.now else (read.offset.after if read.offset is not None else 0)
    if request.method == "HEAD":
        await context.authorized(request, HistoryOperation(contract, session.id))
        headers = {CONTENT_TYPE: _JSON, STREAM_NEXT_OFFSET: _offset(tail)}
        return Answer(200, {**headers, "cache-control": "no-store"})
    if read.live is None:
        await context.authorized(request, HistoryOperation(contract, session.id, gte=after + 1))
    else:
        await context.authorized(request, SessionStreamOperation(contract, session.id, after))
    if read.live == "sse":
        await _sse(context, session, after, read, receive, send, extra)
        return None
    events = [] if read.now else await session.history(gte=after + 1, lte=after + PAGE_EVENTS)
    if not events and read.live == "long-poll":
        events = await until_disconnect(receive, lambda: _wait(context, session, after)) or []
    last = events[-1].index if events else max(after, tail)
    headers = {CONTENT_TYPE: _JSON, STREAM_NEXT_OFFSET: _offset(last)}
    if last >= tail:
        headers[STREAM_UP_TO_DATE] = "true"
    if read.live is not None:
        headers[STREAM_CURSOR] = response_cursor(read.cursor)
        if not events:
            return Answer(204, headers)
    headers["cache-control"] = "no-store"
    return Answer(200, headers, _body([_message(e) for e in events]))


async def _wait(context: LaneContext, session: Any, after: int) -> list[Event[Any]]:
    with trio.move_on_after(context.long_poll_s):
        async with session.subscribe(after) as subscription:
            run = await subscription.receive_run()
            while not run:
                run = await subscription.receive_run()
            return [entry.event for entry in run]
    return []


async def _sse(
    context: LaneContext,
    session: Any,
    after: int,
    read: ReadRequest,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers + extra})

    async def write(frame: bytes) -> None:
        await send({"type": "http.response.body", "body": frame, "more_body": True})

    def pair(messages: list[bytes], index: int, up_to_date: bool = True) -> bytes:
        control = control_frame(
            _offset(index), cursor=response_cursor(read.cursor), up_to_date=up_to_date, closed=False
        )
        return (data_frame(_body(messages), text=True) if messages else b"") + control

    async def stream() -> None:
        position = after
        with trio.move_on_after(context.sse_reconnect_s):
            while True:
                # Catch up in pages, each a data and control pair, then follow.
                while True:
                    events = await session.history(gte=position + 1, lte=position + PAGE_EVENTS)
                    caught_up = len(events) < PAGE_EVENTS
                    if events:
                        position = events[-1].index
                        await write(pair([_message(e) for e in events], position, caught_up))
                    elif position == after:
                        await write(pair([], position))
                    if caught_up:
                        break
                try:
                    async with session.subscribe(position) as subscription:
                        while True:
                            with trio.move_on_after(context.limits.heartbeat_s):
                                run = await subscription.receive_run()
                                if run:
                                    messages = [entry.encoded(_message) for entry in run]
                                    position = run[-1].event.index
                                    await write(pair(messages, position))
                                    continue
                            await write(pair([], position))
                except Lapped as lapped:
                    position = lapped.last_index

    try:
        await until_disconnect(receive, stream)
    except Exception:
        # The answer has started: end it; the client resumes from its offset.
        logger.exception("durable streams: an SSE stream failed")
    await send({"type": "http.response.body", "body": b"", "more_body": False})
