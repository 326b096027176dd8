"""The HTTP lanes' bodies: a push ``{"events"?, "presence"?}`` and the push
and history lanes' answer ``{"events": [wire events]}``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...contract import Event
from .envelope import invalid_payload
from .records import WireEvent, encoder, event_to_wire

__all__ = [
    "EventsBody",
    "PushBody",
    "PushedEventWire",
    "PushedPresenceWire",
    "decode_push_body",
    "encode_events",
]


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


_push_body = msgspec.json.Decoder(PushBody)


def encode_events(events: list[Event[Any]]) -> bytes:
    """The push and history lanes' answer: ``{"events": [wire events]}``."""
    return encoder.encode(EventsBody([event_to_wire(e) for e in events]))


def decode_push_body(data: bytes) -> PushBody:
    """Decode the push lane's body.

    Raises:
      A2Error: ``INVALID_PAYLOAD`` for bad JSON, a wrong shape, or a body with
        neither ``events`` nor ``presence`` (msgspec's path names the field).
    """
    try:
        body = _push_body.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid_payload(f"malformed push body: {exc}") from None
    if body.events is None and body.presence is None:
        raise invalid_payload('a push body needs "events" and/or "presence"')
    return body
