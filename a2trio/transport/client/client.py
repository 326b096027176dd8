"""A Trio client of the multiplexed socket that reconnects, resumes and retries.

::

    async with open_client("ws://localhost:8000/orders/ws") as client:
        [event] = await client.push("s1", {"type": "ordered", "payload": {...}})
        async with client.subscribe("s1", start_after=0) as lane:
            async for frame in lane:          # EventFrame | PresenceFrame | PresenceSnapshotFrame
                ...

Theory of operation. The client owns one socket at a time, opened on first
use and reopened on demand after it is lost; its reader task routes acks to
their waiting :meth:`Client.push` by ``req`` and frames to their lane, and
treats a silence longer than ``watchdog_s`` (the server pings every
``ping_s``) as a lost socket. Each :class:`~a2trio.transport.client.lane.Lane` runs
its own task that subscribes from its index, so after a lost socket every lane
resubscribes where it was, and after a lost *lane* (the server ended or
refused it) only that lane does, on the same socket. Pushes carry client ids
and are retried on ``STORE_UNAVAILABLE`` and lost sockets (three attempts), so
a retry after a lost ack replays instead of duplicating.

Every task (reader, lanes, socket) lives in the nursery of :func:`open_client`;
leaving the block closes the socket and cancels them. Errors reach the caller
as themselves, never as exception groups (the policy of trio-websocket's
``open_websocket``). Set timeouts with ``trio.fail_after`` around any call.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec
import trio
import trio_websocket
from msgspec import UNSET

from ...errors import A2Error, ErrorCode
from ...ids import random_id
from .. import wire
from .connection import (
    DEFAULT_RECONNECT,
    Closed,
    ReconnectPolicy,
    logger,
    retrying,
    trace_headers,
)
from .lane import LANE_BUFFER, Fold, Lane, LaneFrame

if TYPE_CHECKING:
    from ...contract import Contract, Reducer
    from ...telemetry import Telemetry

__all__ = ["CONNECT_TIMEOUT_S", "Client", "open_client", "with_ids"]

#: How long opening a socket (TCP and handshake) may take by default.
CONNECT_TIMEOUT_S: Final = 10.0

S = TypeVar("S")
_Routed = LaneFrame | wire.SubscribedFrame


def _lost(why: str) -> A2Error:
    return A2Error(ErrorCode.STORE_UNAVAILABLE, f"socket lost: {why}")


def _closed(reason: Any) -> str:
    """A close as a person reads it: ``1011 internal error`` (trio-websocket's
    ``CloseReason``; its ``str`` is a repr)."""
    if reason is None:
        return "closed"
    return f"{reason.code} {reason.reason or reason.name}"


def _refused(exc: Exception, connect_timeout_s: float) -> A2Error:
    """A failed connect as the error a caller can act on."""
    if isinstance(exc, trio_websocket.ConnectionRejected):
        error = wire.error_from_wire(exc.body or b"")
        return error or A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"socket refused with HTTP {exc.status_code}"
        )
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        why = f"no handshake within {connect_timeout_s} s"
    else:
        why = str(exc.__cause__ or exc)
    return A2Error(ErrorCode.STORE_UNAVAILABLE, f"cannot connect: {why}")


def with_ids(events: tuple[Mapping[str, Any], ...]) -> list[wire.PushedEventWire]:
    """The events of a push as wire records, each with a client id (a fresh
    random one when it has none), so that retrying the push replays instead
    of duplicating. Keys other than ``type``, ``payload`` and ``id`` are not
    sent (the server reads no others); a missing ``type`` goes as ``null``,
    for the server to refuse as it refuses any bad event."""
    return [_with_id(e) for e in events]


def _with_id(event: Mapping[str, Any]) -> wire.PushedEventWire:
    kind: Any = event.get("type")  # not checked here: the server refuses a bad one
    return wire.PushedEventWire(kind, event.get("payload"), event.get("id") or random_id())


class _Subscription:
    """One try of one lane on one socket: the frames the reader routes to it."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[_Routed](LANE_BUFFER)
        self.error: A2Error | None = None

    def end(self, error: A2Error | None) -> None:
        self.error = error
        self.send.close()


class _Socket:
    """One open socket: its pending acks and its lanes' subscriptions."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.acks: dict[int, tuple[trio.Event, list[wire.AckFrame]]] = {}
        self.subscriptions: dict[str, _Subscription] = {}
        self.lost: A2Error | None = None

    async def send(self, frame: wire.UpFrame) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            await self.ws.send_message(wire.encode(frame).decode())
        except trio_websocket.ConnectionClosed as exc:
            raise _lost(_closed(exc.reason)) from None

    async def read(self, watchdog_s: float) -> None:
        """Route frames until the socket closes or goes silent; never raises."""
        why = "closed"
        try:
            while True:
                with trio.move_on_after(watchdog_s) as silence:
                    message = await self.ws.get_message()
                if silence.cancelled_caught:
                    why = f"no frame for {watchdog_s} s"
                    with trio.move_on_after(1):
                        await self.ws.aclose(code=1001, reason="watchdog")
                    return
                await self._route(wire.decode_down_frame(message))
        except trio_websocket.ConnectionClosed as exc:
            why = _closed(exc.reason)
        finally:
            self._fail_all(_lost(why))

    async def _route(self, frame: wire.DownFrame | None) -> None:
        match frame:
            case wire.AckFrame(req=req) if req in self.acks:
                arrived, slot = self.acks[req]
                slot.append(frame)
                arrived.set()
            case wire.UnsubscribedFrame(session_id=sid) if sid in self.subscriptions:
                error = None
                if isinstance(frame.error, wire.WireErrorBody):
                    error = wire.error_from_wire(frame.error) or _lost("unintelligible error")
                elif isinstance(frame.reason, str):
                    error = _lost(frame.reason)
                self.subscriptions.pop(sid).end(error)
            case (
                wire.SubscribedFrame(session_id=str(sid))
                | wire.EventFrame(session_id=str(sid))
                | wire.PresenceFrame(session_id=str(sid))
                | wire.PresenceSnapshotFrame(session_id=str(sid))
            ) if sid in self.subscriptions:
                try:
                    await self.subscriptions[sid].send.send(frame)
                except trio.BrokenResourceError:
                    pass  # that try was abandoned (reconnect()); its lane resubscribes

    def _fail_all(self, error: A2Error) -> None:
        self.lost = error
        for arrived, _ in self.acks.values():
            arrived.set()
        for subscription in self.subscriptions.values():
            subscription.end(error)
        self.subscriptions.clear()


class Client:
    """The handle :func:`open_client` yields."""

    def __init__(
        self,
        url: str,
        nursery: trio.Nursery,
        policy: ReconnectPolicy,
        watchdog_s: float,
        connect_timeout_s: float,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.url = url
        self._telemetry = telemetry
        self._nursery = nursery
        self._policy = policy
        self._watchdog_s = watchdog_s
        self._connect_timeout_s = connect_timeout_s
        self._socket: _Socket | None = None
        self._connecting = trio.Lock()
        self._reqs = itertools.count(1)
        self._lanes: dict[str, Lane] = {}

    async def _current(self) -> _Socket:
        """The open socket, opened (once, for every waiter) if there is none."""
        async with self._connecting:
            if self._socket is None or self._socket.lost is not None:
                self._socket = await self._nursery.start(self._serve_socket)
            return self._socket

    async def _serve_socket(self, *, task_status: trio.TaskStatus[_Socket]) -> None:
        started = False
        try:
            async with trio_websocket.open_websocket_url(
                self.url, max_message_size=2**24, connect_timeout=self._connect_timeout_s
            ) as ws:
                socket = _Socket(ws)
                task_status.started(socket)
                started = True
                await socket.read(self._watchdog_s)
        except (OSError, trio_websocket.HandshakeError, trio_websocket.ConnectionClosed) as exc:
            if not started:
                raise _refused(exc, self._connect_timeout_s) from exc
            logger.debug("socket closed: %r", exc)

    # -- pushes ------------------------------------------------------------------

    async def push(self, session_id: str, *events: Mapping[str, Any]) -> list[wire.WireEvent]:
        """Append events (``{type, payload, id?}``) to a session; wait for the ack.

        Events without an ``id`` get a client-generated one. A lost socket or a
        ``STORE_UNAVAILABLE`` answer is retried (``PUSH_ATTEMPTS`` tries in all,
        reopening the socket), and the retry replays by id: a push whose ack was
        lost is stored once. A paused lane stays paused.

        Returns:
          The stored events, in order (the original ones on a replay).

        Raises:
          A2Error: the server's refusal with its code, at once; or
            ``STORE_UNAVAILABLE`` once the attempts are spent (the push may
            have committed: push the same events again to learn).

        Cancellation: a cancelled push may still commit on the server; retry
        with the same ids to learn its outcome.
        """
        trace = trace_headers(self._telemetry)
        frame = wire.PushFrame(
            req=0,
            events=with_ids(events),
            session_id=session_id,
            traceparent=trace.get("traceparent", UNSET),
            tracestate=trace.get("tracestate", UNSET),
        )
        return await retrying(lambda: self._push_once(frame))

    async def _push_once(self, frame: wire.PushFrame) -> list[wire.WireEvent]:
        socket = await self._current()
        req = next(self._reqs)
        arrived = trio.Event()
        slot: list[wire.AckFrame] = []
        socket.acks[req] = (arrived, slot)
        try:
            await socket.send(msgspec.structs.replace(frame, req=req))
            await arrived.wait()
        finally:
            del socket.acks[req]
        if not slot:
            assert socket.lost is not None
            raise socket.lost
        ack = slot[0]
        if isinstance(ack.error, wire.WireErrorBody):
            raise wire.error_from_wire(ack.error) or _lost("unintelligible ack")
        assert isinstance(ack.events, list)
        return ack.events

    async def set_presence(
        self,
        session_id: str,
        participant: str,
        values: Mapping[str, Any],
        *,
        seen: int | None = None,
        at_ms: int | None = None,
    ) -> None:
        """Send a presence patch. There is no ack: a refused patch is dropped.

        Raises:
          A2Error: ``STORE_UNAVAILABLE`` when no socket could be opened or it
            was lost while sending (sending it again is harmless).

        Cancellation: the patch was sent or not; sending it again is harmless.
        """
        frame = wire.PresenceUpFrame(
            participant,
            dict(values),
            UNSET if seen is None else seen,
            UNSET if at_ms is None else at_ms,
            session_id,
        )
        await (await self._current()).send(frame)

    # -- lanes -------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(self, session_id: str, start_after: int = 0) -> AsyncIterator[Lane]:
        """Follow a session from ``start_after`` (exclusive) for the block.

        The lane connects in the background (state ``Connecting``); await
        ``lane.wait_live()`` to know it is subscribed. Refusals and losses go
        to the reconnect policy (the lane's ``connection`` carries the error).

        Raises:
          RuntimeError: this client already follows the session.

        Cancellation: leaving the block unsubscribes and closes the lane.
        """
        if session_id in self._lanes:
            raise RuntimeError(f"this client already follows {session_id!r}")
        lane = self._lanes[session_id] = Lane(session_id, start_after, self._policy)
        scope = trio.CancelScope()
        try:
            await self._nursery.start(self._run_lane, lane, scope)
            yield lane
        finally:
            scope.cancel(reason="unsubscribed")
            lane.connection.set(Closed())
            del self._lanes[session_id]
            await self._unsubscribe(session_id)

    async def _run_lane(
        self, lane: Lane, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        with scope:

            async def attach(
                start_after: int,
                live: Callable[[], None],
                deliver: Callable[[LaneFrame], Awaitable[None]],
            ) -> None:
                await self._attach(lane.session_id, start_after, live, deliver)

            await lane.run(attach, task_status=task_status)

    async def _attach(
        self,
        session_id: str,
        start_after: int,
        live: Callable[[], None],
        deliver: Callable[[LaneFrame], Awaitable[None]],
    ) -> None:
        socket = await self._current()
        subscription = socket.subscriptions[session_id] = _Subscription()
        try:
            entry = wire.SubscribeSession(session_id, start_after)
            await socket.send(wire.SubscribeFrame([entry]))
            async for frame in subscription.receive:
                if isinstance(frame, wire.SubscribedFrame):
                    live()
                else:
                    await deliver(frame)
        finally:
            subscription.receive.close()
            if socket.subscriptions.get(session_id) is subscription:
                del socket.subscriptions[session_id]
        if subscription.error is not None:
            raise subscription.error

    async def _unsubscribe(self, session_id: str) -> None:
        socket = self._socket
        if socket is None or socket.lost is not None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                await socket.send(wire.UnsubscribeFrame([session_id]))
            except A2Error:
                pass

    @asynccontextmanager
    async def follow(
        self,
        session_id: str,
        reducer: Reducer[S],
        *,
        contract: Contract | None = None,
        start_after: int = 0,
        state: S | None = None,
    ) -> AsyncIterator[Fold[S]]:
        """Follow a session folded locally by ``reducer``: iterate the
        :class:`~a2trio.transport.client.lane.Fold` for ``(state, index)`` updates.

        ``state`` is the state at ``start_after`` (the reducer's fresh state by
        default, right for ``start_after=0``); ``contract`` types the payloads.
        """
        async with self.subscribe(session_id, start_after) as lane:
            yield Fold(lane, reducer, contract, state)

    def reconnect(self, session_id: str | None = None) -> None:
        """Restart one lane (or every lane) from its index now: see
        :meth:`Lane.reconnect`. Other lanes of the socket keep running."""
        for sid, lane in list(self._lanes.items()):
            if session_id is None or sid == session_id:
                lane.reconnect()

    async def _aclose(self) -> None:
        socket = self._socket
        if socket is not None and socket.lost is None:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await socket.ws.aclose()


@asynccontextmanager
async def open_client(
    url: str,
    *,
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    watchdog_s: float = 45.0,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[Client]:
    """A client of a multiplexed socket, ``ws://host:port/{contract}/ws``.

    Connects on first use and reconnects by itself (see the module docstring).

    Args:
      url: the socket's URL (add ``?presence=1`` for presence frames).
      reconnect: the reconnect policy, ``(session_id, error, attempt) ->
        delay_s | False`` (:data:`~a2trio.transport.DEFAULT_RECONNECT`).
      watchdog_s: silence after which the socket counts as lost; three of the
        server's default 15 s pings.
      connect_timeout_s: how long opening a socket may take. A connection
        closed during the handshake (a proxy whose upstream is down) is only
        noticed at this deadline: trio-websocket does not wake on it.
      telemetry: with one (``a2trio.otel.OpenTelemetry()``), each push
        carries the caller's current span as its trace context (the frame's
        ``traceparent``), so the append and its handlers on the server
        continue the caller's trace.

    Cancellation: leaving the block (or being cancelled) closes the socket and
    every lane; pushes not yet acknowledged may have committed.
    """
    try:
        async with trio.open_nursery() as nursery:
            client = Client(url, nursery, reconnect, watchdog_s, connect_timeout_s, telemetry)
            try:
                yield client
            finally:
                await client._aclose()
                nursery.cancel_scope.cancel(reason="client closed")
    except BaseExceptionGroup as group:
        # The client's tasks never raise, so a group holds the caller's own error.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
