"""What a session id, an event id and a presence participant may be: one
rule, checked at the surface, the same on every store.

Identifiers reach the engine from the network and are authorized as the client
wrote them, so a store must keep them exactly. PostgreSQL ends text at the
first NUL: ``victim\\x00mine`` would be authorized as itself and stored as
``victim`` (issue 17). So identifiers are refused, before anything else looks
at them, when they hold a control character (U+0000-U+001F, U+007F-U+009F: NUL,
the key separator U+001F, line breaks an operator's log would split on), a lone
surrogate (not encodable as UTF-8), or more than :data:`MAX_ID_LENGTH`
characters (Postgres' NOTIFY payload, 8,000 bytes, carries a session's key:
1,024 characters of at most 4 bytes each fit with room for the contract name).
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_SAFE_INTEGER",
    "check_cron_name",
    "check_event_id",
    "check_message_id",
    "check_participant",
    "check_session_id",
]

#: The longest session or event id, in characters.
MAX_ID_LENGTH = 1_024
#: The largest index a client can name: JavaScript's safe integers (the wire's
#: clients are browsers), within every store's integer columns.
MAX_SAFE_INTEGER = 2**53 - 1

_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _check(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty string, got {value!r:.80}")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
    bad = _FORBIDDEN.search(value)
    if bad is not None:
        raise ValueError(
            f"{what} {value!r:.80} contains U+{ord(bad.group()):04X}: ids may hold no "
            "control character and no lone surrogate"
        )
    return value


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a valid session id.

    Raises:
      TypeError: not a non-empty string.
      ValueError: too long, or holds a control character or a lone surrogate.
    """
    return _check("session id", session_id)


def check_event_id(event_id: object) -> str:
    """``event_id`` if it is a valid client-supplied event id.

    Raises:
      TypeError: not a non-empty string.
      ValueError: too long, or holds a control character or a lone surrogate.
    """
    return _check("event id", event_id)


def check_message_id(message_id: object) -> str:
    """``message_id`` if it is a valid actor call ``messageId`` (the same rule:
    it reaches the store inside the call's event ids).

    Raises:
      TypeError: not a non-empty string.
      ValueError: too long, or holds a control character or a lone surrogate.
    """
    return _check("message id", message_id)


def check_cron_name(name: object) -> str:
    """``name`` if it is a valid :func:`a2trio.cron` name (the same rule: it
    reaches the store inside the cron's event ids).

    Raises:
      TypeError: not a non-empty string.
      ValueError: too long, or holds a control character or a lone surrogate.
    """
    return _check("cron name", name)


def check_participant(participant: object) -> str:
    """``participant`` if it is a valid presence participant (``validate_push``
    authorizes it as written, so it obeys the same rule).

    Raises:
      TypeError: not a non-empty string.
      ValueError: too long, or holds a control character or a lone surrogate.
    """
    return _check("presence participant", participant)
