"""The actor lanes' frames and bodies (an a2trio addition): a call
``{"event", "input", "messageId"?}`` (:class:`CallBody`), answered with
``{"state", "index"}`` (:class:`StateBody`, also the SSE ``state`` frame's
data); the actor socket writes ``state`` frames (:class:`StateFrame`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from .envelope import invalid_payload

__all__ = ["CallBody", "StateBody", "StateFrame", "decode_call_body"]


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


_call_body = msgspec.json.Decoder(CallBody)


def decode_call_body(data: bytes) -> CallBody:
    """Decode the actor call lane's body.

    Raises:
      A2Error: ``INVALID_PAYLOAD`` for bad JSON or a wrong shape (the path
        names the field).
    """
    try:
        return _call_body.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid_payload(f"malformed call body: {exc}") from None
