"""The session lanes over HTTP: push, history and the SSE stream.

A mount of a contract answers ``/{contract}/{session}`` here (the app checked
the session id once, building the :class:`~a2trio.Session` every lane uses):

=========== ==================================== ===================================
lane        request                              answer
=========== ==================================== ===================================
push        ``POST``                             ``{"events": [wire events]}``
stream      ``GET`` + ``Accept:                  SSE ``event``, ``presence``,
            text/event-stream``                  ``presence-snapshot`` frames
history     ``GET ?gte=&lte=``                   ``{"events": [...]}``
=========== ==================================== ===================================

``authorize`` is asked before anything is written, read or followed: a
:class:`~.auth.PushOperation`, a :class:`~.auth.HistoryOperation`, a
:class:`~.auth.StreamOperation`. The stream is written by
:func:`.streams.write_sse`, as the actors' is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final

import trio

from ...engine.session import Session
from ...errors import A2Error, ErrorCode
from ...push import PushedEvent, PushedPresence
from ...server import Server
from ...telemetry import encode_trace_context
from .. import sse, wire
from .access import Grants
from .auth import (
    Authorize,
    HistoryOperation,
    PushOperation,
    Request,
    StreamOperation,
    check_authorized,
)
from .http import Receive, Refusal, Send, bad_input, index_param, respond
from .limits import Limits
from .streams import PING, Heartbeat, SSESource, write_sse

__all__ = ["SSE_HEADERS", "presence_param", "serve_session_http"]

#: Headers of a session's SSE stream.
SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    # Proxies (nginx) otherwise buffer the stream and delay every frame.
    (b"x-accel-buffering", b"no"),
]
_TRUE: Final = frozenset({"1", "true"})


def presence_param(server: Server, request: Request) -> bool:
    """Whether the stream or socket asks for presence (``?presence=1``).

    Raises:
      A2Error: ``INVALID_PAYLOAD`` when it does and the contract declares no
        presence.
    """
    presence = request.query.get("presence", "") in _TRUE
    if presence and not server.contract.declares_presence:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"contract '{server.contract.name}' declares no presence: drop presence=1",
        )
    return presence


def serve_session_http(
    server: Server,
    session: Session,
    request: Request,
    receive: Receive,
    send: Send,
    *,
    body: Callable[[], Awaitable[bytes]],
    authorize: Authorize | None,
    limits: Limits,
    grants: Grants,
) -> Awaitable[None]:
    """Answer one HTTP request on a session of a contract's mount (the table
    above): the lane's coroutine, for the app to await (one frame fewer on
    every wake-up of a push).

    Args:
      body: reads the request body within the app's limits.

    Raises:
      A2Error / Refusal: the envelope the app answers with (nothing written).

    Cancellation: a push cancelled midway is atomic (all of its events or
    none), so the client's retry with the same ids replays; a stream's feed
    closes with it.
    """
    method = request.method
    if method == "POST":
        return _push(server, session, request, send, body, authorize, limits)
    if method not in ("GET", "HEAD"):
        raise Refusal(405, f"{method} is not allowed: use GET or POST")
    if "text/event-stream" in request.headers.get("accept", ""):
        return _stream(server, session, request, receive, send, authorize, limits, grants)
    return _history(server, session, request, send, authorize)


async def _push(
    server: Server,
    session: Session,
    request: Request,
    send: Send,
    body: Callable[[], Awaitable[bytes]],
    authorize: Authorize | None,
    limits: Limits,
) -> None:
    push = wire.decode_push_body(await body())
    events = push.events or []
    if len(events) > limits.max_push_events:
        raise Refusal(413, f"a push carries at most {limits.max_push_events} events")
    if not events and push.presence is None:
        raise A2Error(ErrorCode.INVALID_PAYLOAD, "a push needs at least one event or presence")
    pushed = tuple(PushedEvent(e.type, e.payload, e.id) for e in events)
    presence = None
    if push.presence is not None:
        p = push.presence
        presence = PushedPresence(p.participant, p.values, p.seen, p.at)
    if authorize is not None:
        # (Without a policy every push is allowed: no operation to build.)
        await check_authorized(
            authorize,
            request,
            PushOperation(server.contract.name, session.id, pushed, presence),
        )
    with bad_input():
        # All or nothing: every check of both halves precedes any write.
        appended = await session.push(
            pushed, presence, trace_parent=encode_trace_context(request.headers)
        )
    await respond(send, 200, wire.encode_events(appended))


async def _history(
    server: Server, session: Session, request: Request, send: Send, authorize: Authorize | None
) -> None:
    gte = index_param("gte", request.query.get("gte"))
    lte = index_param("lte", request.query.get("lte"))
    await check_authorized(
        authorize, request, HistoryOperation(server.contract.name, session.id, gte, lte)
    )
    with bad_input():
        events = await session.history(gte=gte, lte=lte)
    await respond(send, 200, wire.encode_events(events))


async def _stream(
    server: Server,
    session: Session,
    request: Request,
    receive: Receive,
    send: Send,
    authorize: Authorize | None,
    limits: Limits,
    grants: Grants,
) -> None:
    resume = request.headers.get("last-event-id")
    start_after = (
        index_param("Last-Event-ID", resume)
        if resume is not None
        else index_param("startAfter", request.query.get("startAfter"))
    ) or 0
    presence = presence_param(server, request)
    operation = StreamOperation(server.contract.name, session.id, start_after, presence)
    await check_authorized(authorize, request, operation)
    await write_sse(
        send,
        receive,
        _session_source(session, start_after, presence, limits),
        headers=SSE_HEADERS,
        grants=grants,
        authorize=authorize,
        request=request,
        operation=operation,
        reauthorize_s=limits.reauthorize_s,
    )


@asynccontextmanager
async def _session_source(
    session: Session, start_after: int, presence: bool, limits: Limits
) -> AsyncIterator[SSESource]:
    """A session stream's source: its events, and with ``presence`` its
    presence frames, after ``start_after``."""
    heartbeat = limits.heartbeat_s
    if presence:
        async with session.stream(start_after, presence=True) as feed:

            async def next_item() -> bytes:
                with trio.move_on_after(heartbeat):
                    return sse.encode_item(await feed.receive())
                return PING

            yield SSESource(next_item)
        return
    # Every stream of the session shares each event's encoding, a run of
    # ready events goes out in one write, and the heartbeat is a task of its
    # own rather than a timer around every wait.
    async with session.subscribe(start_after) as subscription:

        async def next_run() -> bytes:
            run = await subscription.receive_run()
            if not run:
                return PING
            return b"".join([entry.encoded(sse.encode_event) for entry in run])

        yield SSESource(next_run, Heartbeat(subscription.interrupt, heartbeat))
