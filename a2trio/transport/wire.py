"""The wire format: msgspec frames byte-compatible with the seed's ``wire.ts``.

Sans-I/O: every function here maps Python objects to bytes or bytes to
Python objects, and nothing here touches a socket (the shape of h11).

* Events travel as ``{id, type, payload, index, sessionId, createdAt}`` with
  ``createdAt`` in ISO 8601 as JavaScript's ``Date.toISOString`` writes it
  (millisecond precision, ``Z``).
* Presence travels as a patch ``{participant, values, seen, at}`` and a
  snapshot ``{snapshot: {participant: {field: {value, seen, at}}}}``, every
  ``at`` in ISO 8601.
* Errors travel in the envelope ``{"error": {code, message, details?}}`` with
  the HTTP status from :data:`ERROR_STATUS`, the one status table.
* Socket frames are one JSON text message each, tagged by ``kind``. Down
  (server to client): ``event``, ``presence``, ``presence-snapshot``, ``ack``,
  ``subscribed``, ``unsubscribed``, ``ping``. Up: ``push``, ``presence``,
  ``subscribe``, ``unsubscribe``.
* The actor lanes (an a2trio addition) take a :class:`CallBody` and answer
  ``{state, index}`` (:class:`StateBody`); their socket writes ``state``
  frames (:class:`StateFrame`).

Every frame and body is a struct here, and both sides encode through them, so
field order and omitted optionals are the struct's: fields in the order of the
seed's types, an absent optional omitted (``UNSET``, or ``omit_defaults``
where the seed leaves a key out rather than writing ``null``).

Forward compatibility follows ``parseSocketFrame``: a frame of unknown kind is
skipped, and an ``ack`` is never dropped, because its waiter would hang behind a
healthy socket: an ack whose outcome cannot be read degrades to a retryable
``STORE_UNAVAILABLE`` ack (client ids make the retry idempotent).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from ..contract import Event
from ..engine.presence import PresencePatch, PresenceSnapshot
from ..errors import A2Error, ErrorCode

__all__ = [
    "ERROR_STATUS",
    "PING_FRAME",
    "AckFrame",
    "BadFrame",
    "CallBody",
    "DownFrame",
    "EventFrame",
    "EventsBody",
    "PingFrame",
    "PresenceFrame",
    "PresenceSnapshotFrame",
    "PresenceUpFrame",
    "PushBody",
    "PushFrame",
    "PushedEventWire",
    "PushedPresenceWire",
    "StateBody",
    "StateFrame",
    "SubscribeFrame",
    "SubscribeSession",
    "SubscribedFrame",
    "UnsubscribeFrame",
    "UnsubscribedFrame",
    "UpFrame",
    "WireError",
    "WireErrorBody",
    "WireEvent",
    "WirePresencePatch",
    "WirePresenceSnapshot",
    "WirePresenceValue",
    "as_a2_error",
    "decode_call_body",
    "decode_down_frame",
    "decode_push_body",
    "decode_up_frame",
    "encode",
    "encode_ack",
    "encode_error",
    "encode_error_ack",
    "encode_event_text",
    "encode_events",
    "encode_item_frame",
    "encode_subscribed",
    "encode_unsubscribed",
    "error_from_wire",
    "error_status",
    "error_to_wire",
    "event_frame",
    "event_to_wire",
    "iso_ms",
    "presence_patch_to_wire",
    "presence_snapshot_to_wire",
    "wire_event",
]

#: ``errorStatus`` in wire.ts: the HTTP status of each error code. A code this
#: table does not know answers as ``STORE_UNAVAILABLE`` (retryable once).
ERROR_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode.INVALID_PAYLOAD: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNKNOWN_EVENT_TYPE: 400,
    ErrorCode.PARTIAL_DUPLICATE_BATCH: 400,
    ErrorCode.SUPERSEDED_ATTEMPT: 409,
    ErrorCode.CLAIM_EXPIRED: 409,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.STORE_NOT_CONFIGURED: 500,
    ErrorCode.UNKNOWN_PRESENCE_FIELD: 400,
    ErrorCode.PRESENCE_NOT_SUPPORTED: 500,
    ErrorCode.INDEX_CONFLICT: 409,
    ErrorCode.CALL_REFUSED: 409,
}

_KNOWN_CODES: Final = frozenset(code.value for code in ERROR_STATUS)


def iso_ms(moment: datetime | int) -> str:
    """ISO 8601 as ``Date.prototype.toISOString`` writes it: UTC, milliseconds, ``Z``.

    Args:
      moment: an aware datetime or epoch milliseconds.
    """
    if isinstance(moment, int):
        moment = datetime.fromtimestamp(moment / 1000, UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# -- payload records -----------------------------------------------------------


class WireEvent(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``WireEvent``: one stored event as clients see it.

    ``payload`` may be absent on the wire (``isWireEvent`` does not ask for
    it); it reads as ``None``."""

    id: str
    type: str
    payload: Any = None
    index: int
    session_id: str
    created_at: str


class WirePresencePatch(msgspec.Struct, frozen=True):
    """``WirePresencePatch``: the ``presence`` SSE frame body."""

    participant: str
    values: dict[str, Any]
    seen: int
    at: str


class WirePresenceValue(msgspec.Struct, frozen=True):
    value: Any
    seen: int
    at: str


class WirePresenceSnapshot(msgspec.Struct, frozen=True):
    """``WirePresenceSnapshot``: the ``presence-snapshot`` SSE frame body."""

    snapshot: dict[str, dict[str, WirePresenceValue]]


class WireErrorBody(msgspec.Struct, frozen=True):
    """``{code, message, details?}``; a ``message`` that is absent or ``null``
    reads as ``None``, and :func:`error_from_wire` uses the code instead, as
    ``errorFromWire`` does."""

    code: str
    message: str | None = None
    details: Any | UnsetType = UNSET


class WireError(msgspec.Struct, frozen=True):
    """``WireError``: the error envelope ``{"error": {code, message, details?}}``."""

    error: WireErrorBody


class PushedEventWire(msgspec.Struct, frozen=True):
    """One event of a push: ``{type, payload, id?}``. The clients always
    write ``id`` (a client id makes a retry replay), and ``payload`` even
    when it is ``null``, as the seed's type asks."""

    type: str
    payload: Any = None
    id: str | None = None


class PushedPresenceWire(msgspec.Struct, frozen=True, omit_defaults=True):
    """The presence half of a push: ``{participant, values, seen?, at?}`` (``at`` in epoch ms)."""

    participant: str
    values: dict[str, Any]
    seen: int | None = None
    at: int | None = None


class PushBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """The push lane's body: ``{"events": [...]}`` and/or ``{"presence": {...}}``."""

    events: list[PushedEventWire] | None = None
    presence: PushedPresenceWire | None = None


class EventsBody(msgspec.Struct, frozen=True):
    """The push and history lanes' answer: ``{"events": [wire events]}``."""

    events: list[WireEvent]


class CallBody(msgspec.Struct, frozen=True, rename="camel"):
    """The actor call lane's body: ``{"event", "input", "messageId"?}``.

    ``input`` is always written (``null`` for none) and may be absent on the
    way in; ``messageId`` is written only when there is one, and an absent or
    ``null`` one reads as none (:attr:`id`)."""

    event: str
    input: Any = None
    message_id: str | UnsetType | None = UNSET

    @property
    def id(self) -> str | None:
        """The call's ``messageId``, or ``None`` without one."""
        return self.message_id if isinstance(self.message_id, str) else None


class StateBody(msgspec.Struct, frozen=True):
    """An actor's state as an answer or an SSE ``state`` frame: ``{"state", "index"}``."""

    state: Any
    index: int


class StateFrame(msgspec.Struct, frozen=True, tag_field="kind", tag="state"):
    """The actor socket's frame of one state: ``{"kind": "state", "state", "index"}``."""

    state: Any
    index: int


# -- socket frames ---------------------------------------------------------------


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


_encoder = msgspec.json.Encoder()
_probe = msgspec.json.Decoder(_Probe)
_up = msgspec.json.Decoder(UpFrame)
_down = msgspec.json.Decoder(DownFrame)
_push_body = msgspec.json.Decoder(PushBody)
_error_envelope = msgspec.json.Decoder(WireError)
_call_body = msgspec.json.Decoder(CallBody)
_UP_KINDS: Final = frozenset({"push", "presence", "subscribe", "unsubscribe"})
_DOWN_KINDS: Final = frozenset(
    {"event", "presence", "presence-snapshot", "ack", "subscribed", "unsubscribed", "ping"}
)

#: The heartbeat frame of a socket, encoded once (``SOCKET_PING_FRAME``).
PING_FRAME: Final[bytes] = _encoder.encode(PingFrame())


def encode(value: Any) -> bytes:
    """JSON bytes of a frame or record (one shared encoder)."""
    return _encoder.encode(value)


# -- conversions -------------------------------------------------------------------


def event_to_wire(event: Event[Any]) -> WireEvent:
    """``eventToWire``: the typed payload becomes JSON builtins."""
    return WireEvent(
        id=event.id,
        type=event.type,
        payload=msgspec.to_builtins(event.payload),
        index=event.index,
        session_id=event.session_id,
        created_at=iso_ms(event.created_at),
    )


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


def presence_patch_to_wire(patch: PresencePatch) -> WirePresencePatch:
    return WirePresencePatch(
        patch.participant, msgspec.to_builtins(patch.values), patch.seen, iso_ms(patch.at_ms)
    )


def presence_snapshot_to_wire(snapshot: PresenceSnapshot) -> WirePresenceSnapshot:
    return WirePresenceSnapshot(
        {
            participant: {
                field: WirePresenceValue(
                    msgspec.to_builtins(entry.value), entry.seen, iso_ms(entry.at_ms)
                )
                for field, entry in fields.items()
            }
            for participant, fields in snapshot.snapshot.items()
        }
    )


def as_a2_error(error: BaseException) -> A2Error:
    """``asA2Error``: an ``A2Error`` passes through; anything else is a retryable
    ``STORE_UNAVAILABLE`` whose text does not leak the internal failure."""
    if isinstance(error, A2Error):
        return error
    return A2Error(ErrorCode.STORE_UNAVAILABLE, "internal error")


def error_status(code: ErrorCode | str) -> int:
    """``errorStatus``: the HTTP status of ``code`` (503 for a code it does not know)."""
    if code in _KNOWN_CODES:
        return ERROR_STATUS[ErrorCode(code)]
    return ERROR_STATUS[ErrorCode.STORE_UNAVAILABLE]


def error_to_wire(error: BaseException) -> WireErrorBody:
    failure = as_a2_error(error)
    details = UNSET if failure.details is None else failure.details
    return WireErrorBody(failure.code.value, failure.message, details)


def encode_error(error: BaseException) -> bytes:
    """The error envelope as bytes: ``{"error": {code, message, details?}}``."""
    return _encoder.encode(WireError(error_to_wire(error)))


def error_from_wire(body: WireErrorBody | bytes) -> A2Error | None:
    """``errorFromWire``: rebuild an ``A2Error``; ``None`` when the body is not an
    envelope or names a code this version does not know."""
    if isinstance(body, bytes):
        try:
            body = _error_envelope.decode(body).error
        except (msgspec.DecodeError, RecursionError):
            return None
    if body.code not in _KNOWN_CODES:
        return None
    details = None if body.details is UNSET else body.details
    return A2Error(body.code, body.code if body.message is None else body.message, details)


def encode_events(events: list[Event[Any]]) -> bytes:
    """The push and history lanes' answer: ``{"events": [wire events]}``."""
    return _encoder.encode(EventsBody([event_to_wire(e) for e in events]))


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
    return _encoder.encode(frame)


def encode_event_text(event: Event[Any]) -> str:
    """An event's socket frame as text: what :meth:`~a2trio.FeedEntry.encoded`
    caches, so every socket lane of the session shares one encoding of each
    event (its ``sessionId`` routes it on a multiplexed socket too)."""
    return _encoder.encode(event_frame(event_to_wire(event))).decode()


def encode_ack(req: int, events: list[Event[Any]], session_id: str | None = None) -> bytes:
    """``socketAckFor``."""
    tag: str | UnsetType = UNSET if session_id is None else session_id
    return _encoder.encode(AckFrame(req, [event_to_wire(e) for e in events], session_id=tag))


def encode_error_ack(req: int, error: BaseException, session_id: str | None = None) -> bytes:
    """``socketErrorAckFor``."""
    tag: str | UnsetType = UNSET if session_id is None else session_id
    return _encoder.encode(AckFrame(req, error=error_to_wire(error), session_id=tag))


def encode_subscribed(session_id: str) -> bytes:
    return _encoder.encode(SubscribedFrame(session_id))


def encode_unsubscribed(
    session_id: str, reason: str | None = None, error: BaseException | None = None
) -> bytes:
    """``socketUnsubscribedFor``: without ``reason`` the lane ended cleanly."""
    return _encoder.encode(
        UnsubscribedFrame(
            session_id,
            UNSET if reason is None else reason,
            UNSET if error is None else error_to_wire(error),
        )
    )


# -- decoding untrusted bytes ----------------------------------------------------------


def _invalid(message: str) -> A2Error:
    return A2Error(ErrorCode.INVALID_PAYLOAD, message)


def decode_push_body(data: bytes) -> PushBody:
    """Decode the push lane's body.

    Raises:
      A2Error: ``INVALID_PAYLOAD`` for bad JSON, a wrong shape, or a body with
        neither ``events`` nor ``presence`` (msgspec's path names the field).
    """
    try:
        body = _push_body.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid(f"malformed push body: {exc}") from None
    if body.events is None and body.presence is None:
        raise _invalid('a push body needs "events" and/or "presence"')
    return body


def decode_call_body(data: bytes) -> CallBody:
    """Decode the actor call lane's body.

    Raises:
      A2Error: ``INVALID_PAYLOAD`` for bad JSON or a wrong shape (the path
        names the field).
    """
    try:
        return _call_body.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid(f"malformed call body: {exc}") from None


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
        return BadFrame(_invalid(f"malformed frame: {exc}"))
    req = probe.req if type(probe.req) is int else None
    if not isinstance(probe.kind, str):
        return BadFrame(_invalid('a frame needs a string "kind"'), req)
    if probe.kind not in _UP_KINDS:
        return None
    try:
        frame: UpFrame = _up.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        return BadFrame(_invalid(f"malformed {probe.kind!r} frame: {exc}"), req)
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
