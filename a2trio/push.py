"""What arrives over the wire, as ``validate_push`` sees it, and the limits on
presence input that every push path shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

__all__ = [
    "MAX_DATE_MS",
    "RESERVED_PARTICIPANTS",
    "PushValidation",
    "PushedEvent",
    "PushedPresence",
    "ValidatePush",
]

#: Largest epoch ms a JavaScript Date holds; the wire's clients are browsers.
MAX_DATE_MS = 8_640_000_000_000_000
#: Participant names a JavaScript client would take for object internals.
RESERVED_PARTICIPANTS = frozenset({"__proto__", "constructor", "prototype"})


class PushedEvent(msgspec.Struct, frozen=True):
    """An event that arrived over the wire: ``validate_push`` sees it before its
    schema does."""

    type: str
    payload: Any
    id: str | None = None


class PushedPresence(msgspec.Struct, frozen=True):
    """A presence patch that arrived over the wire (frozen: the hook cannot
    rewrite it)."""

    participant: str
    values: dict[str, Any]
    seen: int | None = None
    at: int | None = None


class PushValidation(msgspec.Struct, frozen=True):
    """What ``validate_push`` is asked about: the pushed events or the presence
    patch for a session. Allow by returning ``True``; anything else refuses
    (``FORBIDDEN``), as does raising ``A2Error``: the hook fails closed."""

    session_id: str
    events: tuple[PushedEvent, ...] = ()
    presence: PushedPresence | None = None


#: ``validate_push(validation) -> bool`` (or awaitable): only ``True`` allows.
ValidatePush = Callable[[PushValidation], "bool | Awaitable[bool]"]

PushedEvent.__module__ = "a2trio"
PushedPresence.__module__ = "a2trio"
PushValidation.__module__ = "a2trio"
