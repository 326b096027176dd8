"""A Trio client for the multiplexed socket: push, presence, and live lanes.

::

    async with open_client("ws://localhost:8000/orders/ws") as client:
        [event] = await client.push("s1", {"type": "ordered", "payload": {...}, "id": "c-1"})
        async with client.subscribe("s1", start_after=0) as lane:
            async for frame in lane:          # EventFrame | PresenceFrame | PresenceSnapshotFrame
                ...

The client owns one reader task, in the nursery of :func:`open_client`. The
reader routes acks to their waiting :meth:`Client.push` by ``req`` and frames to
their lane, and treats a silence longer than ``watchdog_s`` (the server pings
every ``ping_s``) as a lost socket. When the socket is lost, every waiting push
and every lane fails with ``STORE_UNAVAILABLE``: retry with the same ids, which
replays. Errors reach the caller as themselves, never as exception groups (the
policy of trio-websocket's ``open_websocket``). Set timeouts with
``trio.fail_after`` around any call.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import trio
import trio_websocket

from ..errors import A2Error, ErrorCode
from . import wire

__all__ = ["LANE_BUFFER", "Client", "Lane", "LaneFrame", "open_client"]

#: Frames buffered per lane. A lane whose reader stalls past this holds up the
#: socket's reader, and with it every lane: read lanes promptly.
LANE_BUFFER: Final = 256

LaneFrame = wire.EventFrame | wire.PresenceFrame | wire.PresenceSnapshotFrame


def _lost(why: str) -> A2Error:
    return A2Error(ErrorCode.STORE_UNAVAILABLE, f"socket lost: {why}")


def _closed(reason: Any) -> str:
    """A close as a person reads it: ``1011 internal error`` (trio-websocket's
    ``CloseReason``; its ``str`` is a repr)."""
    if reason is None:
        return "closed"
    return f"{reason.code} {reason.reason or reason.name}"


class Lane:
    """One followed session: ``async for frame in lane``.

    Iteration ends when the server ends the lane cleanly; it raises the
    lane's error when the server refused or lost it, or the socket was lost.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._send, self._receive = trio.open_memory_channel[LaneFrame](LANE_BUFFER)
        self.subscribed = trio.Event()
        self._error: A2Error | None = None

    async def receive(self) -> LaneFrame:
        """The next frame. Raises ``StopAsyncIteration`` at a clean end, or the error."""
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    def __aiter__(self) -> Lane:
        return self

    async def __anext__(self) -> LaneFrame:
        return await self.receive()

    def _end(self, error: A2Error | None) -> None:
        self._error = error
        self.subscribed.set()
        self._send.close()


class Client:
    """The handle :func:`open_client` yields."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self._reqs = itertools.count(1)
        self._acks: dict[int, tuple[trio.Event, list[wire.AckFrame]]] = {}
        self._lanes: dict[str, Lane] = {}
        self._lost: A2Error | None = None

    async def push(self, session_id: str, *events: Mapping[str, Any]) -> list[wire.WireEvent]:
        """Append events (``{type, payload, id?}``) to a session; wait for the ack.

        Returns:
          The stored events, in order (the original ones on a replay).

        Raises:
          A2Error: the server's refusal, or ``STORE_UNAVAILABLE`` when the socket
            is lost before the ack (the push may have committed: retry with
            the same ids).

        Cancellation: a cancelled push may still commit on the server; retry
        with the same ids to learn its outcome.
        """
        if self._lost is not None:
            raise self._lost
        req = next(self._reqs)
        arrived = trio.Event()
        slot: list[wire.AckFrame] = []
        self._acks[req] = (arrived, slot)
        frame = {"kind": "push", "req": req, "events": list(events), "sessionId": session_id}
        try:
            await self._ws.send_message(wire.encode(frame).decode())
            await arrived.wait()
        except trio_websocket.ConnectionClosed as exc:
            raise _lost(_closed(exc.reason)) from None
        finally:
            del self._acks[req]
        if not slot:
            assert self._lost is not None
            raise self._lost
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

        Cancellation: the patch was sent or not; sending it again is harmless.
        """
        frame: dict[str, Any] = {
            "kind": "presence",
            "participant": participant,
            "values": dict(values),
            "sessionId": session_id,
        }
        if seen is not None:
            frame["seen"] = seen
        if at_ms is not None:
            frame["at"] = at_ms
        try:
            await self._ws.send_message(wire.encode(frame).decode())
        except trio_websocket.ConnectionClosed as exc:
            raise _lost(_closed(exc.reason)) from None

    @asynccontextmanager
    async def subscribe(self, session_id: str, start_after: int = 0) -> AsyncIterator[Lane]:
        """Follow a session from ``start_after`` (exclusive) for the block.

        Raises:
          RuntimeError: this client already follows the session.
          A2Error: the server refused the lane (``FORBIDDEN``, ...), or the
            socket was lost.

        Cancellation: leaving the block unsubscribes; a cancelled subscribe
        leaves no lane behind.
        """
        if self._lost is not None:
            raise self._lost
        if session_id in self._lanes:
            raise RuntimeError(f"this client already follows {session_id!r}")
        lane = self._lanes[session_id] = Lane(session_id)
        try:
            frame = {"kind": "subscribe", "sessions": [{"id": session_id, "index": start_after}]}
            await self._ws.send_message(wire.encode(frame).decode())
            await lane.subscribed.wait()
            if lane._error is not None:
                raise lane._error
            yield lane
        except trio_websocket.ConnectionClosed as exc:
            raise _lost(_closed(exc.reason)) from None
        finally:
            if self._lanes.get(session_id) is lane:
                del self._lanes[session_id]
                if self._lost is None:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        unsubscribe = {"kind": "unsubscribe", "sessions": [session_id]}
                        try:
                            await self._ws.send_message(wire.encode(unsubscribe).decode())
                        except trio_websocket.ConnectionClosed:
                            pass

    async def _read(self, watchdog_s: float) -> None:
        """Route frames until the socket closes or goes silent; never raises."""
        why = "closed"
        try:
            while True:
                with trio.move_on_after(watchdog_s) as silence:
                    message = await self._ws.get_message()
                if silence.cancelled_caught:
                    why = f"no frame for {watchdog_s} s"
                    await self._ws.aclose(code=1001, reason="watchdog")
                    return
                frame = wire.decode_down_frame(message)
                await self._route(frame)
        except trio_websocket.ConnectionClosed as exc:
            why = _closed(exc.reason)
        finally:
            self._fail_all(_lost(why))

    async def _route(self, frame: wire.DownFrame | None) -> None:
        match frame:
            case wire.AckFrame(req=req) if req in self._acks:
                arrived, slot = self._acks[req]
                slot.append(frame)
                arrived.set()
            case wire.SubscribedFrame(session_id=sid) if sid in self._lanes:
                self._lanes[sid].subscribed.set()
            case wire.UnsubscribedFrame(session_id=sid) if sid in self._lanes:
                error = None
                if isinstance(frame.error, wire.WireErrorBody):
                    error = wire.error_from_wire(frame.error) or _lost("unintelligible error")
                elif isinstance(frame.reason, str):
                    error = _lost(frame.reason)
                self._lanes.pop(sid)._end(error)
            case wire.EventFrame(session_id=sid) if sid in self._lanes:
                await self._lanes[sid]._send.send(frame)
            case (
                wire.PresenceFrame(session_id=str(sid))
                | wire.PresenceSnapshotFrame(session_id=str(sid))
            ) if sid in self._lanes:
                await self._lanes[sid]._send.send(frame)

    def _fail_all(self, error: A2Error) -> None:
        self._lost = error
        for arrived, _ in self._acks.values():
            arrived.set()
        for lane in self._lanes.values():
            lane._end(error)


@asynccontextmanager
async def open_client(url: str, *, watchdog_s: float = 45.0) -> AsyncIterator[Client]:
    """Connect to a multiplexed socket, ``ws://host:port/{contract}/ws``.

    Args:
      url: the socket's URL (add ``?presence=1`` for presence frames).
      watchdog_s: silence after which the socket counts as lost; three of the
        server's default 15 s pings.

    Raises:
      trio_websocket.HandshakeError: the server refused the connection.

    Cancellation: leaving the block (or being cancelled) closes the socket and
    stops the reader; pushes not yet acknowledged may have committed.
    """
    async with trio_websocket.open_websocket_url(url, max_message_size=2**24) as ws:
        client = Client(ws)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._read, watchdog_s)
                try:
                    yield client
                finally:
                    nursery.cancel_scope.cancel(reason="client closed")
        except BaseExceptionGroup as group:
            # The reader never raises, so a group holds the caller's own error.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
