"""The error envelope ``{"error": {code, message, details?}}`` and the one
status table, :data:`ERROR_STATUS` (``errorStatus`` in the seed's ``wire.ts``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from ...errors import A2Error, ErrorCode
from .records import encoder

__all__ = [
    "ERROR_STATUS",
    "WireError",
    "WireErrorBody",
    "as_a2_error",
    "encode_error",
    "error_from_wire",
    "error_status",
    "error_to_wire",
    "invalid_payload",
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
    ErrorCode.TRANSACTIONS_NOT_SUPPORTED: 500,
    ErrorCode.INDEX_CONFLICT: 409,
    ErrorCode.CALL_REFUSED: 409,
    # A read below a trim point: those events are gone for good (RFC 9110 Gone).
    ErrorCode.TRIMMED: 410,
}

_KNOWN_CODES: Final = frozenset(code.value for code in ERROR_STATUS)


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


_error_envelope = msgspec.json.Decoder(WireError)


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
    return encoder.encode(WireError(error_to_wire(error)))


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


def invalid_payload(message: str) -> A2Error:
    """``INVALID_PAYLOAD`` with ``message``: what an unreadable body or frame raises."""
    return A2Error(ErrorCode.INVALID_PAYLOAD, message)
