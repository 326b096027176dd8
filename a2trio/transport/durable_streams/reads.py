"""Reading a stream: its appends after an offset, stitched across forks.

A fork's log holds only its own appends; what it inherits stays in its
source's session (and its source's, up a chain). A read from offset ``X``
is a list of *segments*, each a range of one session's indexes: the
source's appends after ``X`` up to the fork offset (recursively), then the
fork's own. Offsets carry the depth of the stream that wrote them
(:class:`~.protocol.Offset`), so a resumed read knows which segment it is in.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from ... import Event
from .model import APPEND_TYPES, StreamState
from .protocol import Offset, format_offset, is_json, json_body, json_messages, parse_offset
from .table import Streams

__all__ = ["PAGE_EVENTS", "Chunk", "Item", "append_bytes", "read_chunk", "segments"]

#: The most events read from the store per page while filling a chunk.
PAGE_EVENTS: Final = 256
#: Events in a chunk's first page, before the appends' size is known.
FIRST_PAGE_EVENTS: Final = 16


class Item(NamedTuple):
    """One append: its offset and its bytes (JSON mode: its messages,
    encoded and comma-joined, so a chunk's array is a join away)."""

    offset: str
    data: bytes
    json: bool

    def messages(self) -> list[Any]:
        """A JSON-mode append's messages, decoded."""
        return json_messages(b"[" + self.data + b"]", allow_empty=True)


class Chunk(NamedTuple):
    """A read's answer: its appends, the offset after them, and whether
    they reach the stream's tail."""

    items: list[Item]
    next_offset: str
    up_to_date: bool

    def body(self, content_type: str) -> bytes:
        """The response body: bytes concatenated, or one JSON array."""
        if is_json(content_type):
            return b"[" + b",".join(item.data for item in self.items if item.data) + b"]"
        return b"".join(item.data for item in self.items)


class Segment(NamedTuple):
    path: str
    depth: int
    after: int
    through: int


def append_bytes(event: Event[Any]) -> bytes:
    """The bytes an append stored (JSON mode: its messages, comma-joined)."""
    payload = event.payload
    if event.type == "bytes":
        data: bytes = payload.data
        return data
    if event.type == "text":
        text: str = payload.text
        return text.encode()
    return json_body(payload.messages)[1:-1]


def item_of(event: Event[Any], depth: int) -> Item:
    return Item(
        format_offset(Offset(depth, event.index)), append_bytes(event), event.type == "json"
    )


async def segments(
    streams: Streams, path: str, state: StreamState, after: Offset | None, cap: Offset | None
) -> list[Segment]:
    """The session ranges holding ``path``'s appends after ``after`` (None:
    from the start) up to ``cap`` (None: its tail), in order."""
    found: list[Segment] = []
    fork = state.fork
    if fork is not None:
        fork_offset = parse_offset(fork.offset)
        assert fork_offset is not None
        if after is None or after < fork_offset:
            source = await streams.state(fork.source)
            if source.exists and source.start == fork.source_start:
                inner_cap = fork_offset if cap is None or fork_offset < cap else cap
                found += await segments(streams, fork.source, source, after, inner_cap)
    depth = state.depth
    if after is None or after.depth < depth:
        first = state.start
    elif after.depth == depth:
        first = max(after.after, state.start)
    else:
        return found
    if cap is None:
        last = state.tail
    elif cap.depth == depth:
        last = min(cap.after, state.tail) if state.tail else state.start
    elif cap.depth < depth:
        return found
    else:
        last = state.tail
    if last > first:
        found.append(Segment(path, depth, first, last))
    return found


def _page(size: int, count: int, max_bytes: int) -> int:
    """How many events the next page reads: enough to pass ``max_bytes`` at
    the mean size of the ``count`` appends so far (``size`` bytes; a few to
    start). A fixed page of large appends decoded far past the chunk's end
    (16 KiB appends: four times what a 1 MiB chunk answered)."""
    if not count:
        return FIRST_PAGE_EVENTS
    left = max(0, max_bytes - size)
    return max(1, min(PAGE_EVENTS, left * count // max(1, size) + 1))


async def read_chunk(
    streams: Streams,
    path: str,
    state: StreamState,
    after: Offset | None,
    *,
    max_bytes: int,
) -> Chunk:
    """``path``'s appends after ``after`` (None: from its start), at least
    one and then up to about ``max_bytes``.

    Raises:
      A2Error: ``STORE_UNAVAILABLE``.
    """
    items: list[Item] = []
    size = 0
    for segment in await segments(streams, path, state, after, None):
        session = streams.server.session(segment.path)
        first = segment.after
        while first < segment.through:
            last = min(segment.through, first + _page(size, len(items), max_bytes))
            for event in await session.history(gte=first + 1, lte=last):
                if event.type not in APPEND_TYPES:
                    continue
                if items and size >= max_bytes:
                    return Chunk(items, items[-1].offset, False)
                item = item_of(event, segment.depth)
                items.append(item)
                size += len(item.data)
            first = last
    return Chunk(items, items[-1].offset if items else state.tail_offset, True)
