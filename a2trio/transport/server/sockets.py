"""The socket lanes: one session per socket, or many sessions multiplexed on one.

Theory of operation. Each accepted socket owns one nursery holding:

* the **reader** (the handler's own task): decodes client frames one at a
  time and answers pushes with acks, in order. A disconnect cancels the
  nursery at once, which closes every feed and releases its store listener.
* the **writer**: the only task that calls ASGI ``send``. Everything else puts
  encoded frames into a bounded channel (:data:`OUTBOX_FRAMES`). Cancelling a
  lane therefore never interrupts a half-written frame, and a slow client
  pushes back through the channel onto the feeds.
* the **pinger**: a ``{"kind": "ping"}`` frame every ``ping_s``.
* **lanes**: one task per followed session, each in its own cancel scope,
  forwarding the session's feed. A single-session socket has one lane for the
  whole connection; a multiplexed socket opens and closes lanes with
  ``subscribe`` / ``unsubscribe`` frames and reports each with ``subscribed``
  and ``unsubscribed`` notices (a ``reason`` and the error envelope when a lane
  is refused or lost; a lost lane never disturbs its siblings).

Bad frames: an unreadable frame with a numeric ``req`` gets an error ack; one
without a correlator closes the socket with 1007 and the reason; a message
over ``max_frame_bytes`` closes it with 1009. Unknown kinds are skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import trio

from ...engine.fanout import Lapped
from ...errors import A2Error, ErrorCode
from ...identifiers import MAX_SAFE_INTEGER
from ...push import PushedEvent, PushedPresence
from ...server import Server
from ...stores.feed import own_tasks
from ...telemetry import encode_trace_context
from .. import wire
from .access import Grants, Withdrawal, under_review
from .auth import (
    Authorize,
    Operation,
    PushOperation,
    Request,
    StreamOperation,
    SubscribeOperation,
    check_authorized,
)
from .http import (
    Message,
    Receive,
    Send,
    bad_input,
    failure,
    logger,
    refuse_handshake,
    report,
)
from .limits import Limits

if TYPE_CHECKING:
    from ...engine.session import Session

__all__ = ["CLOSE_GRACE_S", "OUTBOX_FRAMES", "serve_multiplexed_socket", "serve_session_socket"]

#: Frames queued for the writer. Bounds a slow client's backlog to this many
#: frames (each at most one push's worth of events) per socket.
OUTBOX_FRAMES: Final = 64

#: How long a socket we close waits for the client's closing handshake.
CLOSE_GRACE_S: Final = 5.0

_GOING_AWAY: Final = 1001
_INVALID_DATA: Final = 1007
_POLICY: Final = 1008
_TOO_BIG: Final = 1009
_INTERNAL: Final = 1011
_TRY_AGAIN: Final = 1013


class _Socket:
    """One accepted socket: its outbox, its writer and pinger, its lanes."""

    def __init__(
        self,
        server: Server,
        request: Request,
        receive: Receive,
        authorize: Authorize | None,
        limits: Limits,
        presence: bool,
        session: Session | None,
        grants: Grants,
    ) -> None:
        self.server = server
        self.grants = grants
        self.request = request
        self.receive = receive
        self.authorize = authorize
        self.limits = limits
        self.presence = presence
        # A single-session socket is bound to one session; a multiplexed one is not.
        self.session = session
        self.multiplexed = session is None
        self.outbox, self._outbox_receive = trio.open_memory_channel[Message](OUTBOX_FRAMES)
        self.lanes: dict[str, trio.CancelScope] = {}
        self.closing = False

    async def put(self, frame: bytes) -> None:
        await self.outbox.send({"type": "websocket.send", "text": frame.decode()})

    async def put_text(self, text: str) -> None:
        await self.outbox.send({"type": "websocket.send", "text": text})

    async def close(self, code: int, reason: str) -> None:
        """Queue the close frame after whatever is queued; the writer ends the socket."""
        self.closing = True
        await self.outbox.send({"type": "websocket.close", "code": code, "reason": reason[:120]})

    async def run(self, send: Send, first_lane: tuple[Session, int] | None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, send, nursery.cancel_scope)
            nursery.start_soon(self._ping)
            if first_lane is not None:
                await nursery.start(self._lane, *first_lane)
            await self._read()
            if not self.closing:
                nursery.cancel_scope.cancel(reason="client disconnected")
        if self.closing:
            # Read until the client answers our close: closing the TCP connection
            # with its frames unread would reset it and lose the close frame.
            with trio.move_on_after(CLOSE_GRACE_S):
                while (await self.receive())["type"] != "websocket.disconnect":
                    pass

    async def _write(self, send: Send, scope: trio.CancelScope) -> None:
        async for message in self._outbox_receive:
            await send(message)
            if message["type"] == "websocket.close":
                scope.cancel(reason="socket closed by the server")
                return

    async def _ping(self) -> None:
        while True:
            await trio.sleep(self.limits.ping_s)
            await self.outbox.send({"type": "websocket.send", "text": wire.PING_FRAME.decode()})

    # -- lanes -------------------------------------------------------------------

    async def _lane(
        self,
        session: Session,
        start_after: int,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        session_id = session.id
        tag = session_id if self.multiplexed else None
        contract = self.server.contract.name
        operation: Operation = (
            SubscribeOperation(contract, session_id, start_after)
            if self.multiplexed
            else StreamOperation(contract, session_id, start_after, self.presence)
        )
        with trio.CancelScope() as scope:
            withdrawn = Withdrawal(scope)
            self.lanes[session_id] = scope
            task_status.started()
            try:
                async with own_tasks() as nursery:
                    with under_review(
                        nursery,
                        self.grants,
                        self.authorize,
                        self.request,
                        operation,
                        self.limits.reauthorize_s,
                        withdrawn,
                    ):
                        await self._follow(session, start_after, tag)
            except Lapped as exc:
                # The resumable end of a lane too slow for its session.
                logger.info("dropped a lagging socket lane: %s", exc)
                if self.multiplexed:
                    await self.put(wire.encode_unsubscribed(session_id, "overflow", exc))
                else:
                    await self.close(_TRY_AGAIN, f"overflow: resume after index {exc.last_index}")
            except Exception as exc:
                status, _ = failure(exc)
                if self.multiplexed:
                    await self.put(wire.encode_unsubscribed(session_id, "stream failed", exc))
                else:
                    await self.close(_INTERNAL, f"stream failed ({status})")
            finally:
                if self.lanes.get(session_id) is scope:
                    del self.lanes[session_id]
        if withdrawn.error is not None:
            # The resumable end (transport/server/access.py).
            if self.multiplexed:
                await self.put(wire.encode_unsubscribed(session_id, "forbidden", withdrawn.error))
            else:
                await self.close(_POLICY, f"forbidden: {withdrawn.error.message}")

    async def _follow(self, session: Session, start_after: int, tag: str | None) -> None:
        session_id = session.id
        if self.presence:
            async with session.stream(start_after, presence=True) as feed:
                if self.multiplexed:
                    await self.put(wire.encode_subscribed(session_id))
                async for item in feed:
                    await self.put(wire.encode_item_frame(item, tag))
        else:
            # Every lane of the session shares each event's encoded frame.
            async with session.subscribe(start_after) as subscription:
                if self.multiplexed:
                    await self.put(wire.encode_subscribed(session_id))
                while True:
                    try:
                        run = await subscription.receive_run()
                    except StopAsyncIteration:
                        break
                    for entry in run:
                        await self.put_text(entry.encoded(wire.encode_event_text))
        if self.multiplexed:
            await self.put(wire.encode_unsubscribed(session_id))
        else:
            await self.close(_GOING_AWAY, "stream ended")

    async def _subscribe(self, nursery: trio.Nursery, frame: wire.SubscribeFrame) -> bool:
        """Open the frame's lanes; False if the frame closed the socket."""
        # Duplicates collapse (the last entry for a session wins), so naming one
        # session 30,000 times is one subscription, not 30,000 restarts.
        entries = {entry.id: entry for entry in frame.sessions}
        if len(entries) > self.limits.max_frame_sessions:
            await self.close(
                _POLICY,
                f"a subscribe frame names at most {self.limits.max_frame_sessions} sessions",
            )
            return False
        for entry in entries.values():
            old = self.lanes.pop(entry.id, None)
            if old is not None:
                # The old lane stops before its replacement is authorized.
                old.cancel(reason="resubscribed")
            try:
                start_after = entry.index
                if start_after < 0 or start_after > MAX_SAFE_INTEGER:
                    raise A2Error(
                        ErrorCode.INVALID_PAYLOAD,
                        f"subscribe index must be a non-negative integer, got {start_after}",
                    )
                with bad_input():
                    session = self.server.session(entry.id)
                if len(self.lanes) >= self.limits.max_socket_sessions:
                    raise A2Error(
                        ErrorCode.INVALID_PAYLOAD,
                        f"a socket follows at most {self.limits.max_socket_sessions} sessions",
                    )
                await check_authorized(
                    self.authorize,
                    self.request,
                    SubscribeOperation(self.server.contract.name, entry.id, start_after),
                )
            except Exception as exc:
                reason = "forbidden" if _code(exc) is ErrorCode.FORBIDDEN else "refused"
                report(exc)
                await self.put(wire.encode_unsubscribed(entry.id, reason, exc))
                continue
            await nursery.start(self._lane, session, start_after)
        return True

    async def _unsubscribe(self, frame: wire.UnsubscribeFrame) -> None:
        for session_id in frame.sessions:
            scope = self.lanes.pop(session_id, None)
            if scope is not None:
                scope.cancel(reason="unsubscribed")
                await self.put(wire.encode_unsubscribed(session_id))

    # -- the reader --------------------------------------------------------------

    async def _next_frame(self) -> bytes | None:
        """The next client message; ``None`` once the socket is closing."""
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                return None
            if message["type"] != "websocket.receive":
                continue
            text = message.get("text")
            data: bytes = text.encode() if text is not None else bytes(message.get("bytes") or b"")
            if len(data) > self.limits.max_frame_bytes:
                await self.close(_TOO_BIG, f"frames are limited to {self.limits.max_frame_bytes} B")
                return None
            return data

    async def _read(self) -> None:
        async with trio.open_nursery() as lanes:
            await self._read_frames(lanes)
            lanes.cancel_scope.cancel(reason="socket closed")

    async def _read_frames(self, lanes: trio.Nursery) -> None:
        while (data := await self._next_frame()) is not None:
            frame = wire.decode_up_frame(data)
            match frame:
                case wire.BadFrame(req=None):
                    await self.close(_INVALID_DATA, frame.error.message)
                    return
                case wire.BadFrame(req=int(req)):
                    await self.put(wire.encode_error_ack(req, frame.error))
                case wire.PushFrame():
                    await self._push(frame)
                case wire.PresenceUpFrame():
                    await self._presence(frame)
                case wire.SubscribeFrame() if self.multiplexed:
                    if not await self._subscribe(lanes, frame):
                        return
                case wire.UnsubscribeFrame() if self.multiplexed:
                    await self._unsubscribe(frame)

    def _target(self, tagged: str | Any) -> Session:
        """The session a push or presence frame addresses (its id checked once, here)."""
        if self.multiplexed:
            if not isinstance(tagged, str):
                raise A2Error(
                    ErrorCode.INVALID_PAYLOAD, "frames on a multiplexed socket need a sessionId"
                )
            with bad_input():
                return self.server.session(tagged)
        single = self.session
        assert single is not None
        if isinstance(tagged, str) and tagged != single.id:
            raise A2Error(
                ErrorCode.INVALID_PAYLOAD,
                f"this socket follows {single.id!r}, not {tagged!r}",
            )
        return single

    async def _push(self, frame: wire.PushFrame) -> None:
        tag = frame.session_id if isinstance(frame.session_id, str) else None
        try:
            session = self._target(frame.session_id)
            if not frame.events:
                raise A2Error(ErrorCode.INVALID_PAYLOAD, "a push frame needs at least one event")
            if len(frame.events) > self.limits.max_push_events:
                raise A2Error(
                    ErrorCode.INVALID_PAYLOAD,
                    f"a push carries at most {self.limits.max_push_events} events",
                )
            pushed = tuple(PushedEvent(e.type, e.payload, e.id) for e in frame.events)
            await check_authorized(
                self.authorize,
                self.request,
                PushOperation(self.server.contract.name, session.id, pushed),
            )
            with bad_input():
                events = await session.push(
                    pushed, trace_parent=encode_trace_context(frame.trace_headers())
                )
        except Exception as exc:
            report(exc)
            await self.put(wire.encode_error_ack(frame.req, exc, tag))
            return
        await self.put(wire.encode_ack(frame.req, events, tag))

    async def _presence(self, frame: wire.PresenceUpFrame) -> None:
        """Presence has no correlator: a refused patch is dropped, as in the seed."""
        try:
            session = self._target(frame.session_id)
            pushed = PushedPresence(
                frame.participant,
                frame.values,
                frame.seen if isinstance(frame.seen, int) else None,
                frame.at if isinstance(frame.at, int) else None,
            )
            await check_authorized(
                self.authorize,
                self.request,
                PushOperation(self.server.contract.name, session.id, presence=pushed),
            )
            with bad_input():
                await session.set_presence(pushed, {})
        except Exception as exc:
            report(exc)
            logger.debug("presence frame dropped: %r", exc)


def _code(exc: Exception) -> ErrorCode | None:
    return exc.code if isinstance(exc, A2Error) else None


async def _accept(receive: Receive) -> bool:
    message = await receive()
    return bool(message["type"] == "websocket.connect")


async def serve_session_socket(
    server: Server,
    session: Session,
    request: Request,
    receive: Receive,
    send: Send,
    *,
    authorize: Authorize | None,
    limits: Limits,
    start_after: int,
    presence: bool,
    grants: Grants,
) -> None:
    """Serve ``GET /{contract}/{session}/ws`` for ``session`` (the app
    checked its id) until the client leaves.

    The handshake is authorized as a :class:`~.auth.StreamOperation`;
    a refusal answers the upgrade with the envelope (403).

    Cancellation: cancelling closes the feed and releases its listener; a push
    being appended when cancelled is atomic (all or nothing), and the client's
    retry with the same ids replays.
    """
    if not await _accept(receive):
        return
    try:
        await check_authorized(
            authorize,
            request,
            StreamOperation(server.contract.name, session.id, start_after, presence),
        )
    except Exception as exc:
        await refuse_handshake(send, exc)
        return
    await send({"type": "websocket.accept"})
    socket = _Socket(server, request, receive, authorize, limits, presence, session, grants)
    await socket.run(send, (session, start_after))


async def serve_multiplexed_socket(
    server: Server,
    request: Request,
    receive: Receive,
    send: Send,
    *,
    authorize: Authorize | None,
    limits: Limits,
    presence: bool,
    grants: Grants,
) -> None:
    """Serve ``GET /{contract}/ws``: lanes open and close with ``subscribe`` /
    ``unsubscribe`` frames; each is authorized as a
    :class:`~.auth.SubscribeOperation`.

    Cancellation: as :func:`serve_session_socket`, for every lane.
    """
    if not await _accept(receive):
        return
    await send({"type": "websocket.accept"})
    socket = _Socket(server, request, receive, authorize, limits, presence, None, grants)
    await socket.run(send, None)
