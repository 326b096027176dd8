"""The signed scheduler route's names, kept at their first path
(``docs/schedules.md``): :mod:`a2trio.transport.server.scheduler`."""

from __future__ import annotations

from .server.scheduler import (
    MAX_SKEW_S,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    deliver_signed,
    sign_task,
    verify_signature,
)

__all__ = [
    "MAX_SKEW_S",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "deliver_signed",
    "sign_task",
    "verify_signature",
]
