"""Server-sent events, sans-I/O: an encoder of frames and an incremental decoder.

The stream lane writes three named frames, each one JSON ``data:`` line:
``event`` (a wire event, its ``id:`` the log index, so a browser's
``EventSource`` resumes with ``Last-Event-ID``), ``presence`` and
``presence-snapshot``; heartbeats are ``:`` comments, which every reader
ignores. A store failure mid-stream ends the stream after one ``error`` frame
carrying the error envelope (unknown names are skipped by clients).

The decoder follows the WHATWG "event stream interpretation" closely enough for
our own frames and for tests: fields ``event``, ``data``, ``id``; lines end in
LF, CRLF or CR; a blank line dispatches.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from ..contract import Event
from ..engine.presence import PresencePatch, PresenceSnapshot
from . import wire

__all__ = [
    "MAX_SSE_LINE_BYTES",
    "SSEDecoder",
    "SSEEvent",
    "encode_comment",
    "encode_error_frame",
    "encode_event",
    "encode_frame",
    "encode_item",
]

#: The decoder refuses a line longer than this (1 MiB plus framing): a frame
#: carries at most one pushed batch's events, bounded by the push body limit.
MAX_SSE_LINE_BYTES: Final = 1024 * 1024 + 64


class SSEEvent(msgspec.Struct, frozen=True):
    """One dispatched frame: its name (``message`` when unnamed), data and last id."""

    event: str
    data: str
    id: str | None = None


def encode_frame(event: str, data: bytes, id: str | None = None) -> bytes:
    """One named frame. ``data`` must hold no newline (compact JSON holds none)."""
    head = b"" if id is None else b"id: " + id.encode() + b"\n"
    return head + b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


def encode_comment(text: str = "") -> bytes:
    """A comment line: the heartbeat. Readers ignore it; proxies see traffic."""
    return b": " + text.encode() + b"\n\n"


def encode_event(event: Event[Any]) -> bytes:
    """An event's frame: what :meth:`~a2trio.FeedEntry.encoded` caches, so
    every stream of the session shares one encoding of each event."""
    return encode_frame("event", wire.encode(wire.event_to_wire(event)), str(event.index))


def encode_item(item: Event[Any] | PresencePatch | PresenceSnapshot) -> bytes:
    """One feed item as its frame."""
    match item:
        case PresenceSnapshot():
            return encode_frame(
                "presence-snapshot", wire.encode(wire.presence_snapshot_to_wire(item))
            )
        case PresencePatch():
            return encode_frame("presence", wire.encode(wire.presence_patch_to_wire(item)))
        case _:
            return encode_event(item)


def encode_error_frame(error: BaseException) -> bytes:
    """The last frame of a stream that its source failed."""
    return encode_frame("error", wire.encode_error(error))


class SSEDecoder:
    """Incremental parser: feed bytes in any chunking, get whole frames out.

    Memory: at most one partial line (``MAX_SSE_LINE_BYTES``) plus one frame's data.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk``; return the frames it completed.

        Raises:
          ValueError: a line longer than ``MAX_SSE_LINE_BYTES``.
        """
        self._buffer += chunk
        frames: list[SSEEvent] = []
        while True:
            cut = self._line_end()
            if cut is None:
                if len(self._buffer) > MAX_SSE_LINE_BYTES:
                    raise ValueError(f"SSE line exceeds {MAX_SSE_LINE_BYTES} bytes")
                return frames
            end, width = cut
            line = self._buffer[:end].decode("utf-8", "replace")
            del self._buffer[: end + width]
            frame = self._line(line)
            if frame is not None:
                frames.append(frame)

    def _line_end(self) -> tuple[int, int] | None:
        lf = self._buffer.find(b"\n")
        cr = self._buffer.find(b"\r", 0, None if lf < 0 else lf)
        if cr < 0:
            return None if lf < 0 else (lf, 1)
        if cr + 1 == len(self._buffer):
            return None  # a CR at the end may be half of a CRLF
        return cr, 2 if self._buffer[cr + 1] == 0x0A else 1

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            frame = SSEEvent(self._event or "message", "\n".join(self._data), self._last_id)
            self._event, self._data = "", []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self._last_id = value
        return None
