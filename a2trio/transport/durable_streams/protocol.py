"""The Durable Streams protocol's vocabulary, sans I/O: headers, offsets,
cursors, content types, JSON mode and SSE frames.

Everything here is a pure function over strings and bytes, so the lane's
HTTP code (:mod:`.app`, :mod:`.live`) stays a thin shell, as ``wire.py`` is
for the session lanes. Section numbers cite the protocol's ``PROTOCOL.md``
(durable-streams/durable-streams).
"""

from __future__ import annotations

import base64
import random
import re
import time
from typing import Any, Final, NamedTuple

import msgspec

__all__ = [
    "CURSOR_EPOCH_S",
    "CURSOR_INTERVAL_S",
    "START",
    "Offset",
    "control_frame",
    "data_frame",
    "format_offset",
    "is_json",
    "is_text",
    "json_body",
    "json_messages",
    "media_type",
    "parse_offset",
    "response_cursor",
]

# Request and response headers (Sections 5.1-5.8), lower-cased as ASGI hands them.
CONTENT_TYPE: Final = "content-type"
STREAM_NEXT_OFFSET: Final = "stream-next-offset"
STREAM_CURSOR: Final = "stream-cursor"
STREAM_UP_TO_DATE: Final = "stream-up-to-date"
STREAM_CLOSED: Final = "stream-closed"
STREAM_SEQ: Final = "stream-seq"
STREAM_TTL: Final = "stream-ttl"
STREAM_EXPIRES_AT: Final = "stream-expires-at"
STREAM_FORKED_FROM: Final = "stream-forked-from"
STREAM_FORK_OFFSET: Final = "stream-fork-offset"
STREAM_FORK_SUB_OFFSET: Final = "stream-fork-sub-offset"
PRODUCER_ID: Final = "producer-id"
PRODUCER_EPOCH: Final = "producer-epoch"
PRODUCER_SEQ: Final = "producer-seq"
PRODUCER_EXPECTED_SEQ: Final = "producer-expected-seq"
PRODUCER_RECEIVED_SEQ: Final = "producer-received-seq"
SSE_DATA_ENCODING: Final = "stream-sse-data-encoding"

#: The headers a page may send and read (CORS), beyond the safelisted ones.
REQUEST_HEADERS: Final = (
    "content-type, authorization, if-none-match, stream-seq, stream-ttl, "
    "stream-expires-at, stream-closed, producer-id, producer-epoch, producer-seq, "
    "stream-forked-from, stream-fork-offset, stream-fork-sub-offset"
)
RESPONSE_HEADERS: Final = (
    "stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, "
    "stream-ttl, stream-expires-at, stream-sse-data-encoding, producer-epoch, "
    "producer-seq, producer-expected-seq, producer-received-seq, etag, location"
)

#: A decimal without leading zeros, sign, point or exponent (Section 5.1's
#: rule for ``Stream-TTL``; the producer headers and the fork sub-offset
#: follow it too).
DECIMAL: Final = re.compile(r"(?:0|[1-9][0-9]*)\Z")
#: JavaScript's safe integers: the producer epoch and sequence (Section 5.2.1).
MAX_SAFE_INTEGER: Final = 2**53 - 1

_OFFSET: Final = re.compile(r"([0-9]{16})_([0-9]{16})\Z")


class Offset(NamedTuple):
    """A position: the fork depth of the stream that wrote it, and ``after``,
    the index (in that stream's session) of the last event before it.

    Offsets are formatted ``{depth:016d}_{index:016d}``, so their
    lexicographic order is their order in a stream: a fork's own events
    (depth ``d + 1``) sort after everything it inherits from its source
    (depth ``d``), as Section 8 requires of forks sharing their source's
    offset space.
    """

    depth: int
    after: int


#: The offset before everything: a stream's start, at any depth.
START: Final = Offset(0, 0)


def format_offset(offset: Offset) -> str:
    """``Offset(1, 42)`` -> ``0000000000000001_0000000000000042``."""
    return f"{offset.depth:016d}_{offset.after:016d}"


def parse_offset(text: str) -> Offset | None:
    """The offset ``text`` spells, or None when it is not one of ours (the
    sentinels ``-1`` and ``now`` are the caller's to recognise)."""
    match = _OFFSET.match(text)
    if match is None:
        return None
    return Offset(int(match.group(1)), int(match.group(2)))


def media_type(content_type: str | None) -> str:
    """The media type of a ``Content-Type``, lower-cased, parameters dropped
    (``Application/JSON; charset=utf-8`` -> ``application/json``)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    """JSON mode (Section 9.1): ``application/json``, with any parameters."""
    return media_type(content_type) == "application/json"


def is_text(content_type: str) -> bool:
    """SSE carries these as UTF-8 text; every other type goes base64 (5.8)."""
    kind = media_type(content_type)
    return kind.startswith("text/") or kind == "application/json"


_json_decoder: Final = msgspec.json.Decoder()
_json_encoder: Final = msgspec.json.Encoder()


def json_messages(body: bytes, *, allow_empty: bool) -> list[Any]:
    """The messages a JSON-mode body appends: one level of an array
    flattened, any other value one message (Section 9.1.2).

    Raises:
      ValueError: not JSON, or an empty array when ``allow_empty`` is false
        (a POST of ``[]`` is refused; a PUT of ``[]`` creates an empty stream).
    """
    try:
        value = _json_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the body is not valid JSON: {exc}") from None
    if isinstance(value, list):
        if not value and not allow_empty:
            raise ValueError("a JSON append of an empty array appends nothing: send messages")
        return value
    return [value]


def json_body(messages: list[Any]) -> bytes:
    """A JSON-mode read's body: the messages as one array (Section 9.1.5)."""
    return _json_encoder.encode(messages)


# -- cursors (Section 10.1) ------------------------------------------------------

#: Cursor intervals count from 2024-10-09T00:00:00Z, 20 s each: the
#: protocol's defaults, so a CDN sees the same cursors from every server.
CURSOR_EPOCH_S: Final = 1_728_432_000
CURSOR_INTERVAL_S: Final = 20


def response_cursor(client_cursor: str | None, *, now_s: float | None = None) -> str:
    """The cursor for a live answer: the current interval, or, when the
    client's cursor is not behind it, the client's plus a random jitter of
    1-3600 s, so cursors never repeat and a CDN cannot loop on a cached answer.
    """
    now_s = time.time() if now_s is None else now_s
    current = int((now_s - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client_cursor is None or not client_cursor.isdigit():
        return str(current)
    client = int(client_cursor)
    if client < current:
        return str(current)
    jitter_s = random.randint(1, 3600)
    return str(client + max(1, -(-jitter_s // CURSOR_INTERVAL_S)))


# -- SSE frames (Section 5.8) ----------------------------------------------------

_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")


def _event(kind: str, text: str) -> bytes:
    # Every line break of the payload starts a new `data:` line, so a payload
    # cannot end the event early or forge one (CR alone included). No space
    # after the colon: a reader strips one, which would eat a leading space.
    lines = _LINE_BREAK.split(text)
    return (f"event: {kind}\n" + "".join(f"data:{line}\n" for line in lines) + "\n").encode()


def data_frame(payload: bytes, *, text: bool) -> bytes:
    """One ``data`` event: the bytes as UTF-8 text, or base64 (one line)."""
    if text:
        return _event("data", payload.decode("utf-8", "replace"))
    return _event("data", base64.b64encode(payload).decode("ascii"))


def control_frame(next_offset: str, *, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    """One ``control`` event: the next offset, then the cursor and
    ``upToDate`` while the stream is open, or ``streamClosed`` at its end."""
    control: dict[str, Any] = {"streamNextOffset": next_offset}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        if cursor is not None:
            control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    return _event("control", _json_encoder.encode(control).decode())
