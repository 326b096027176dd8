"""The records every lane carries: events and presence as clients see them.

``WireEvent`` is ``{id, type, payload, index, sessionId, createdAt}``, with
``createdAt`` in ISO 8601 as JavaScript's ``Date.toISOString`` writes it
(:func:`iso_ms`); presence is a patch ``{participant, values, seen, at}`` or a
snapshot ``{snapshot: {participant: {field: {value, seen, at}}}}``, every
``at`` in ISO 8601. :data:`encoder` is the one JSON encoder the wire's
modules share.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from ...contract import Event
from ...engine.presence import PresencePatch, PresenceSnapshot

__all__ = [
    "WireEvent",
    "WirePresencePatch",
    "WirePresenceSnapshot",
    "WirePresenceValue",
    "encode",
    "encoder",
    "event_to_wire",
    "iso_ms",
    "presence_patch_to_wire",
    "presence_snapshot_to_wire",
]

#: The JSON encoder of every frame and body (msgspec: build it once).
encoder: Final = msgspec.json.Encoder()


def iso_ms(moment: datetime | int) -> str:
    """ISO 8601 as ``Date.prototype.toISOString`` writes it: UTC, milliseconds, ``Z``.

    Args:
      moment: an aware datetime or epoch milliseconds.
    """
    if isinstance(moment, int):
        moment = datetime.fromtimestamp(moment / 1000, UTC)
    elif moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    # isoformat truncates to milliseconds as toISOString does; in UTC it
    # ends "+00:00", written "Z". (A fifth of strftime's cost: every event
    # on every lane.)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


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


def encode(value: Any) -> bytes:
    """JSON bytes of a frame or record (one shared encoder)."""
    return encoder.encode(value)


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
