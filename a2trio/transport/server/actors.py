"""The actor lanes of the ASGI app: calls, snapshots and live state frames.

A server whose contract is an :func:`a2trio.actor` is mounted with these
routes instead of the session lanes (its log is written only by calls and by
its own handlers and schedules, never by raw pushes):

=========== ==================================== ==========================================
lane        request                              answer
=========== ==================================== ==========================================
call        ``POST /{actor}/{id}`` with           ``{"state", "index"}`` after the call's
            ``{"event", "input", "messageId"?}``  own commit; a refusal is 409 ``CALL_REFUSED``
snapshot    ``GET /{actor}/{id}?snapshot=1``      ``{"state", "index"}``
stream      ``GET`` + ``Accept:                   SSE ``state`` frames, ``id:`` the index;
            text/event-stream``                   resumes after ``startAfter`` / ``Last-Event-ID``
socket      ``GET /{actor}/{id}/ws``              ``{"kind": "state", "state", "index"}`` frames
=========== ==================================== ==========================================

Snapshot and call answers carry ``Cache-Control: private, no-store``.
``authorize`` is asked before anything is read, written or followed: a
:class:`~.auth.CallOperation`, a :class:`~.auth.StateOperation`, a
:class:`~.auth.StreamOperation`. A mount's ``view(state, request)`` projects
the state on every lane alike (answers, snapshots, frames), so no lane shows
what another hides.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import msgspec
import trio

from ...engine.actor_calls import ActorHandle, ActorState
from ...identifiers import check_message_id
from ...server import Server
from ...telemetry import encode_trace_context
from .. import sse, wire
from ..wire import CallBody, StateFrame, decode_call_body
from .access import Grants, Withdrawal, under_review
from .auth import (
    Authorize,
    CallOperation,
    Request,
    StateOperation,
    StreamOperation,
    check_authorized,
)
from .http import (
    Receive,
    Refusal,
    Send,
    bad_input,
    index_param,
    refuse_handshake,
    report,
    watch_disconnect,
)
from .limits import Limits
from .streams import PING, SSESource, write_sse

__all__ = [
    "ANSWER_HEADERS",
    "CallBody",
    "StateFrame",
    "View",
    "decode_call_body",
    "encode_state",
    "serve_actor_http",
    "serve_actor_socket",
]

#: ``view(state, request) -> public shape``: what one mount shows of the
#: state (anything msgspec encodes). It may be async.
View = Callable[[Any, Request], Any]

#: Headers of snapshot and call answers: per user, never cached.
ANSWER_HEADERS: Final = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"private, no-store"),
]
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"private, no-store"),
    (b"x-accel-buffering", b"no"),
]
_TRUE: Final = frozenset({"1", "true"})
_POLICY: Final = 1008
_INTERNAL: Final = 1011


async def _shown(state: ActorState[Any], view: View | None, request: Request) -> Any:
    """The state as this mount shows it (JSON builtins)."""
    if view is None:
        return msgspec.to_builtins(state.state)
    shown: Any = view(state.state, request)
    if inspect.isawaitable(shown):
        shown = await shown
    return msgspec.to_builtins(shown)


async def encode_state(state: ActorState[Any], view: View | None, request: Request) -> bytes:
    """``{"state", "index"}`` with the mount's view applied."""
    return wire.encode(wire.StateBody(await _shown(state, view, request), state.index))


async def _answer(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*ANSWER_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _start_after(request: Request) -> int | None:
    resume = request.headers.get("last-event-id")
    if resume is not None:
        return index_param("Last-Event-ID", resume)
    return index_param("startAfter", request.query.get("startAfter"))


async def serve_actor_http(
    server: Server,
    actor: ActorHandle,
    request: Request,
    receive: Receive,
    send: Send,
    *,
    body: Callable[[], Awaitable[bytes]],
    authorize: Authorize | None,
    limits: Limits,
    view: View | None,
    grants: Grants,
) -> None:
    """Answer one HTTP request on an actor mount (the table above).

    Args:
      actor: the actor of the request's path (the app checked its id).
      body: reads the request body within the app's limits.

    Raises:
      A2Error / Refusal: the envelope the app answers with (nothing written).

    Cancellation: a call cancelled midway committed all or nothing; the
    client's retry with the same ``messageId`` answers the original.
    """
    name = server.contract.name
    method = request.method
    if method == "POST":
        call = decode_call_body(await body())
        if call.id is not None:
            with bad_input():
                check_message_id(call.id)
        await check_authorized(
            authorize, request, CallOperation(name, actor.id, call.event, call.input, call.id)
        )
        # The ids were checked here and by the mount's row: the call runner
        # takes them as they are.
        answer = await actor.calls.call(
            actor.id, call.event, call.input, call.id, encode_trace_context(request.headers)
        )
        await _answer(send, await encode_state(answer, view, request))
    elif method not in ("GET", "HEAD"):
        raise Refusal(405, f"{method} is not allowed: use GET or POST")
    elif "text/event-stream" in request.headers.get("accept", ""):
        await _stream(server, actor, request, receive, send, authorize, limits, view, grants)
    elif request.query.get("snapshot", "") in _TRUE:
        await check_authorized(authorize, request, StateOperation(name, actor.id))
        state = await actor.state()
        await _answer(send, await encode_state(state, view, request))
    else:
        raise Refusal(
            400,
            f"'{name}' is an actor: GET ?snapshot=1 for its state, "
            "or Accept: text/event-stream to follow it",
        )


async def _stream(
    server: Server,
    actor: ActorHandle,
    request: Request,
    receive: Receive,
    send: Send,
    authorize: Authorize | None,
    limits: Limits,
    view: View | None,
    grants: Grants,
) -> None:
    start_after = _start_after(request)
    operation = StreamOperation(server.contract.name, actor.id, start_after or 0)
    await check_authorized(authorize, request, operation)
    await write_sse(
        send,
        receive,
        _state_source(actor, start_after, view, request, limits.heartbeat_s),
        headers=_SSE_HEADERS,
        grants=grants,
        authorize=authorize,
        request=request,
        operation=operation,
        reauthorize_s=limits.reauthorize_s,
    )


@asynccontextmanager
async def _state_source(
    actor: ActorHandle,
    start_after: int | None,
    view: View | None,
    request: Request,
    heartbeat_s: float,
) -> AsyncIterator[SSESource]:
    """An actor stream's source: ``state`` frames (``id:`` the index) after ``start_after``."""
    async with actor.states(start_after) as feed:

        async def next_state() -> bytes:
            with trio.move_on_after(heartbeat_s) as idle:
                state = await feed.receive()
            if idle.cancelled_caught:
                return PING
            # Outside the heartbeat's scope: a slow view never loses a state.
            data = await encode_state(state, view, request)
            return sse.encode_frame("state", data, str(state.index))

        yield SSESource(next_state)


async def serve_actor_socket(
    server: Server,
    actor: ActorHandle,
    request: Request,
    receive: Receive,
    send: Send,
    *,
    authorize: Authorize | None,
    limits: Limits,
    view: View | None,
    grants: Grants,
) -> None:
    """Serve ``GET /{actor}/{id}/ws`` for ``actor`` (the app checked its id):
    state frames, pings every ``ping_s``.

    The handshake is authorized as a :class:`~.auth.StreamOperation`
    (``startAfter`` from the query); a refusal answers the upgrade with the
    envelope. Client frames are read and ignored (calls go over ``POST``). A
    withdrawn access closes the socket with 1008, a failed feed with 1011.

    Cancellation: cancelling closes the feed; nothing is written.
    """
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        start_after = index_param("startAfter", request.query.get("startAfter"))
        operation = StreamOperation(server.contract.name, actor.id, start_after or 0)
        await check_authorized(authorize, request, operation)
    except Exception as exc:
        await refuse_handshake(send, exc)
        return
    await send({"type": "websocket.accept"})
    failed: tuple[int, str] | None = None
    async with actor.states(start_after) as feed, trio.open_nursery() as nursery:
        withdrawn = Withdrawal(nursery.cancel_scope)
        nursery.start_soon(watch_disconnect, receive, nursery.cancel_scope)
        with under_review(
            nursery, grants, authorize, request, operation, limits.reauthorize_s, withdrawn
        ):
            try:
                while True:
                    with trio.move_on_after(limits.ping_s) as idle:
                        state = await feed.receive()
                    if idle.cancelled_caught:
                        await send({"type": "websocket.send", "text": wire.PING_FRAME.decode()})
                        continue
                    frame = StateFrame(await _shown(state, view, request), state.index)
                    await send({"type": "websocket.send", "text": wire.encode(frame).decode()})
            except Exception as exc:
                report(exc)
                failed = (_INTERNAL, wire.as_a2_error(exc).message)
                nursery.cancel_scope.cancel(reason="feed failed")
    # At most one of the two: either ends the lane before the other can.
    closing = (_POLICY, withdrawn.error.message) if withdrawn.error is not None else failed
    if closing is not None:
        code, reason = closing
        await send({"type": "websocket.close", "code": code, "reason": reason[:120]})
