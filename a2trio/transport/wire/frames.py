"""The socket frames: one JSON text message each, tagged by ``kind``.

Down (server to client): ``event``, ``presence``, ``presence-snapshot``,
``ack``, ``subscribed``, ``unsubscribed``, ``ping``. Up: ``push``,
``presence``, ``subscribe``, ``unsubscribe``. Forward compatibility follows
``parseSocketFrame``: a frame of unknown kind is skipped, and an ``ack`` is
never dropped (the package's docstring says why).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from ...contract import Event
from ...engine.presence import PresencePatch, PresenceSnapshot
from ...errors import A2Error, ErrorCode
from .bodies import PushedEventWire
from .envelope import WireErrorBody, error_from_wire, error_to_wire, invalid_payload
from .records import (
    WireEvent,
    WirePresenceValue,
    encoder,
    event_to_wire,
    presence_patch_to_wire,
    presence_snapshot_to_wire,
)

__all__ = [
    "PING_FRAME",
    "AckFrame",
    "BadFrame",
    "DownFrame",
    "EventFrame",
    "PingFrame",
    "PresenceFrame",
    "PresenceSnapshotFrame",
    "PresenceUpFrame",
    "PushFrame",
    "SubscribeFrame",
    "SubscribeSession",
    "SubscribedFrame",
    "UnsubscribeFrame",
    "UnsubscribedFrame",
    "UpFrame",
    "decode_down_frame",
    "decode_up_frame",
    "encode_ack",
    "encode_error_ack",
    "encode_event_text",
    "encode_item_frame",
    "encode_subscribed",
    "encode_unsubscribed",
    "event_frame",
    "wire_event",
]


class _Frame(msgspec.Struct, frozen=True, tag_field="kind", rename="camel"):
    pass


class EventFrame(_Frame, frozen=True, kw_only=True, tag="event"):
    """A live event; its own ``sessionId`` routes it on a multiplexed socket.
    As in :class:`WireEvent`, an absent ``payload`` reads as ``None``."""

    id: str
    type: str
    payload: Any = None
    index: int
    session_id: str
    created_at: str


class PresenceFrame(_Frame, frozen=True, tag="presence"):
    participant: str
    values: dict[str, Any]
    seen: int
    at: str
    session_id: str | UnsetType = UNSET


class PresenceSnapshotFrame(_Frame, frozen=True, tag="presence-snapshot"):
    snapshot: dict[str, dict[str, WirePresenceValue]]
    session_id: str | UnsetType = UNSET


class AckFrame(_Frame, frozen=True, tag="ack"):
    """The answer to a ``push`` frame: its events, or an error (never both)."""

    req: int
    events: list[WireEvent] | UnsetType = UNSET
    error: WireErrorBody | UnsetType = UNSET
    session_id: str | UnsetType = UNSET


class SubscribedFrame(_Frame, frozen=True, tag="subscribed"):
    session_id: str


class UnsubscribedFrame(_Frame, frozen=True, tag="unsubscribed"):
    """A lane ended: cleanly without a ``reason``; refused or lost with one."""

    session_id: str
    reason: str | UnsetType = UNSET
    error: WireErrorBody | UnsetType = UNSET


class PingFrame(_Frame, frozen=True, tag="ping"):
    pass


DownFrame = (
    EventFrame
    | PresenceFrame
    | PresenceSnapshotFrame
    | AckFrame
    | SubscribedFrame
    | UnsubscribedFrame
    | PingFrame
)


class PushFrame(_Frame, frozen=True, tag="push"):
    """Append events; ``req`` is the client's opaque ack correlator.

    ``traceparent`` / ``tracestate`` (an a2trio addition: a frame has no
    headers) are the W3C Trace Context the push continues, as an HTTP push's
    headers are."""

    req: int
    events: list[PushedEventWire]
    session_id: str | UnsetType = UNSET
    traceparent: str | UnsetType = UNSET
    tracestate: str | UnsetType = UNSET

    def trace_headers(self) -> dict[str, str]:
        """The frame's trace fields, as the headers an HTTP push would carry."""
        fields = (("traceparent", self.traceparent), ("tracestate", self.tracestate))
        return {name: value for name, value in fields if isinstance(value, str)}


class PresenceUpFrame(_Frame, frozen=True, tag="presence"):
    participant: str
    values: dict[str, Any]
    seen: int | UnsetType = UNSET
    at: int | UnsetType = UNSET
    session_id: str | UnsetType = UNSET


class SubscribeSession(msgspec.Struct, frozen=True):
    """One lane to open: ``index`` is its exclusive resume frontier."""

    id: str
    index: int = 0


class SubscribeFrame(_Frame, frozen=True, tag="subscribe"):
    sessions: list[SubscribeSession]


class UnsubscribeFrame(_Frame, frozen=True, tag="unsubscribe"):
    sessions: list[str]


UpFrame = PushFrame | PresenceUpFrame | SubscribeFrame | UnsubscribeFrame


class BadFrame(msgspec.Struct, frozen=True):
    """An up-frame that could not be read. With ``req`` it is answered by an
    error ack; without one the socket closes with ``error.message``."""

    error: A2Error
    req: int | None = None


class _Probe(msgspec.Struct, frozen=True):
    """The fields read before a frame's full shape: its kind and correlator."""

    kind: Any = None
    req: Any = None


_probe = msgspec.json.Decoder(_Probe)
_up = msgspec.json.Decoder(UpFrame)
_down = msgspec.json.Decoder(DownFrame)
_UP_KINDS: Final = frozenset({"push", "presence", "subscribe", "unsubscribe"})
_DOWN_KINDS: Final = frozenset(
    {"event", "presence", "presence-snapshot", "ack", "subscribed", "unsubscribed", "ping"}
)

#: The heartbeat frame of a socket, encoded once (``SOCKET_PING_FRAME``).
PING_FRAME: Final[bytes] = encoder.encode(PingFrame())


def event_frame(event: WireEvent) -> EventFrame:
    """The socket frame of a wire event (the same fields, tagged ``event``)."""
    return EventFrame(
        id=event.id,
        type=event.type,
        payload=event.payload,
        index=event.index,
        session_id=event.session_id,
        created_at=event.created_at,
    )


def wire_event(frame: EventFrame) -> WireEvent:
    """The wire event a socket frame carries (:func:`event_frame` undone)."""
    return WireEvent(
        id=frame.id,
        type=frame.type,
        payload=frame.payload,
        index=frame.index,
        session_id=frame.session_id,
        created_at=frame.created_at,
    )


def encode_item_frame(
    item: Event[Any] | PresencePatch | PresenceSnapshot, session_id: str | None = None
) -> bytes:
    """``socketFrameFor``: one feed item as a socket frame. On a multiplexed
    socket presence frames carry ``sessionId``; events carry theirs already."""
    tag: str | UnsetType = UNSET if session_id is None else session_id
    frame: DownFrame
    match item:
        case PresenceSnapshot():
            frame = PresenceSnapshotFrame(presence_snapshot_to_wire(item).snapshot, tag)
        case PresencePatch():
            wire = presence_patch_to_wire(item)
            frame = PresenceFrame(wire.participant, wire.values, wire.seen, wire.at, tag)
        case _:
            frame = event_frame(event_to_wire(item))
    return encoder.encode(frame)


def encode_event_text(event: Event[Any]) -> str:
    """An event's socket frame as text: what :meth:`~a2trio.FeedEntry.encoded`
    caches, so every socket lane of the session shares one encoding of each
    event (its ``sessionId`` routes it on a multiplexed socket too)."""
    return encoder.encode(event_frame(event_to_wire(event))).decode()


def encode_ack(req: int, events: list[Event[Any]], session_id: str | None = None) -> bytes:
    """``socketAckFor``."""
    tag: str | UnsetType = UNSET if session_id is None else session_id
    return encoder.encode(AckFrame(req, [event_to_wire(e) for e in events], session_id=tag))


def encode_error_ack(req: int, error: BaseException, session_id: str | None = None) -> bytes:
    """``socketErrorAckFor``."""
    tag: str | UnsetType = UNSET if session_id is None else session_id
    return encoder.encode(AckFrame(req, error=error_to_wire(error), session_id=tag))


def encode_subscribed(session_id: str) -> bytes:
    return encoder.encode(SubscribedFrame(session_id))


def encode_unsubscribed(
    session_id: str, reason: str | None = None, error: BaseException | None = None
) -> bytes:
    """``socketUnsubscribedFor``: without ``reason`` the lane ended cleanly."""
    return encoder.encode(
        UnsubscribedFrame(
            session_id,
            UNSET if reason is None else reason,
            UNSET if error is None else error_to_wire(error),
        )
    )


def decode_up_frame(data: bytes | str) -> UpFrame | BadFrame | None:
    """Decode one client frame (``parsePushBody``'s socket twin).

    Returns:
      The frame; ``None`` for a well-formed frame of a kind this server does not
      know (skipped: forward compatibility); :class:`BadFrame` for anything
      else, with the frame's ``req`` when it has a usable one, so the client's
      waiter gets an error ack instead of hanging.
    """
    try:
        probe = _probe.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        return BadFrame(invalid_payload(f"malformed frame: {exc}"))
    req = probe.req if type(probe.req) is int else None
    if not isinstance(probe.kind, str):
        return BadFrame(invalid_payload('a frame needs a string "kind"'), req)
    if probe.kind not in _UP_KINDS:
        return None
    try:
        frame: UpFrame = _up.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        return BadFrame(invalid_payload(f"malformed {probe.kind!r} frame: {exc}"), req)
    return frame


def decode_down_frame(data: bytes | str) -> DownFrame | None:
    """Decode one server frame, client side (``parseSocketFrame``).

    Returns ``None`` for unknown kinds and unreadable frames, except acks: an ack
    with a numeric ``req`` always comes back, degraded to a ``STORE_UNAVAILABLE``
    error ack when its outcome cannot be read. An ``unsubscribed`` notice with an
    unreadable error degrades the same way.
    """
    try:
        probe = _probe.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    if probe.kind not in _DOWN_KINDS:
        return None
    try:
        frame: DownFrame = _down.decode(data)
    except (msgspec.DecodeError, RecursionError):
        frame_or_none = _degraded(probe, data)
        return frame_or_none
    match frame:
        case AckFrame(error=WireErrorBody() as body) if error_from_wire(body) is None:
            return msgspec.structs.replace(frame, error=_unintelligible("unintelligible ack"))
        case AckFrame(events=UnsetType(), error=UnsetType()):
            return msgspec.structs.replace(frame, error=_unintelligible("unintelligible ack"))
        case UnsubscribedFrame(error=WireErrorBody() as body) if error_from_wire(body) is None:
            return msgspec.structs.replace(
                frame, error=_unintelligible("unintelligible subscription error")
            )
    return frame


class _LooseTagged(msgspec.Struct, frozen=True, rename="camel"):
    session_id: Any = None
    reason: Any = None


_loose = msgspec.json.Decoder(_LooseTagged)


def _unintelligible(message: str) -> WireErrorBody:
    return WireErrorBody(ErrorCode.STORE_UNAVAILABLE.value, message)


def _degraded(probe: _Probe, data: bytes | str) -> DownFrame | None:
    try:
        loose = _loose.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    session_id = loose.session_id if isinstance(loose.session_id, str) else UNSET
    if probe.kind == "ack" and type(probe.req) is int:
        return AckFrame(
            probe.req, error=_unintelligible("unintelligible ack"), session_id=session_id
        )
    if probe.kind == "unsubscribed" and isinstance(session_id, str):
        reason = loose.reason if isinstance(loose.reason, str) else UNSET
        return UnsubscribedFrame(
            session_id, reason, _unintelligible("unintelligible subscription error")
        )
    return None
