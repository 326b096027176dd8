"""A stream as an a2trio session: the built-in contract and the state it folds to.

Every stream path is one session of the contract ``durable_streams``, and
every operation on it is an event, so the log is the whole truth and any
process reading it agrees:

======================= ============= =========================================
operation               event type    payload
======================= ============= =========================================
``PUT`` (create, fork)  ``created``   content type, TTL or expiry, closed, fork
``POST`` bytes          ``bytes``     the body, exactly (base64 in the store)
``POST`` UTF-8 text     ``text``      the body as a string (``text/*`` types)
``POST`` JSON mode      ``json``      the flattened messages, as JSON values
``POST`` close-only     ``closed``    the producer that closed, if any
``DELETE``              ``deleted``   nothing
a read of a TTL stream  ``touched``   nothing (at most one per half TTL)
a fork of this stream   ``forked``    the fork's path and generation
that fork deleted       ``unforked``  the same
======================= ============= =========================================

An append carries its producer tuple, its ``Stream-Seq`` and whether it
closes the stream, so the producer state, the writer sequence and closure
are folded from the appends themselves. A later ``created`` starts a new
*generation* at the same path (a stream deleted, or expired, and created
again): reads and offsets begin at its index, so the old data is never seen.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

import msgspec

from ... import Event, Reducer, contract
from .protocol import Offset, format_offset

__all__ = [
    "APPEND_TYPES",
    "CONTRACT",
    "REDUCER",
    "Closed",
    "Created",
    "Fork",
    "ForkRef",
    "Producer",
    "ProducerState",
    "StreamState",
    "fold",
]


class Producer(msgspec.Struct, frozen=True):
    """An idempotent producer's tuple (Section 5.2.1)."""

    id: str
    epoch: int
    seq: int


class Fork(msgspec.Struct, frozen=True):
    """Where a fork inherits from: its source's path and generation (the
    index of the source's ``created``), the fork offset in the source's
    space, the requested sub-offset (kept to match an idempotent re-create),
    and the fork's depth (its source's plus one)."""

    source: str
    source_start: int
    offset: str
    sub_offset: int = 0
    depth: int = 1


class Created(msgspec.Struct, frozen=True):
    content_type: str
    ttl_s: int | None = None
    expires_at: str | None = None
    expires_at_ms: int | None = None
    closed: bool = False
    fork: Fork | None = None


class BytesAppended(msgspec.Struct, frozen=True):
    data: bytes
    producer: Producer | None = None
    seq: str | None = None
    close: bool = False


class TextAppended(msgspec.Struct, frozen=True):
    text: str
    producer: Producer | None = None
    seq: str | None = None
    close: bool = False


class JsonAppended(msgspec.Struct, frozen=True):
    messages: list[Any]
    producer: Producer | None = None
    seq: str | None = None
    close: bool = False


class Closed(msgspec.Struct, frozen=True):
    producer: Producer | None = None


class Nothing(msgspec.Struct, frozen=True):
    """The payload of ``deleted`` and ``touched``."""


class ForkRef(msgspec.Struct, frozen=True):
    """A fork of this stream: its path and the index of its ``created``."""

    path: str
    start: int


#: The event types that carry a stream's data.
APPEND_TYPES: Final = frozenset({"bytes", "text", "json"})

#: The built-in contract every stream is a session of.
CONTRACT: Final = contract(
    "durable_streams",
    events={
        "created": Created,
        "bytes": BytesAppended,
        "text": TextAppended,
        "json": JsonAppended,
        "closed": Closed,
        "deleted": Nothing,
        "touched": Nothing,
        "forked": ForkRef,
        "unforked": ForkRef,
    },
)


class ProducerState(msgspec.Struct):
    epoch: int
    seq: int


Status = Literal["live", "gone", "missing"]


class StreamState(msgspec.Struct):
    """One path's current generation, folded from its session.

    ``index`` is the last event folded; ``tail`` the index of the
    generation's last append (0: none of its own yet). A stream deleted while
    forks still read it is ``soft_deleted`` (410) until its last fork goes.
    """

    index: int = 0
    exists: bool = False
    start: int = 0
    content_type: str = ""
    ttl_s: int | None = None
    expires_at: str | None = None
    expires_at_ms: int | None = None
    closed: bool = False
    closed_by: Producer | None = None
    fork: Fork | None = None
    tail: int = 0
    producers: dict[str, ProducerState] = msgspec.field(default_factory=dict)
    stream_seq: str | None = None
    forks: list[ForkRef] = msgspec.field(default_factory=list)
    soft_deleted: bool = False
    last_access_ms: int = 0

    @property
    def depth(self) -> int:
        return self.fork.depth if self.fork is not None else 0

    def own_offset(self, index: int) -> str:
        return format_offset(Offset(self.depth, index))

    @property
    def tail_offset(self) -> str:
        """Where the next append goes: after the last one, the fork point
        for a fork with none of its own, or the generation's start."""
        if self.tail:
            return self.own_offset(self.tail)
        if self.fork is not None:
            return self.fork.offset
        return self.own_offset(self.start)

    def expired(self, now_ms: int) -> bool:
        if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
            return True
        return self.ttl_s is not None and now_ms >= self.last_access_ms + self.ttl_s * 1000

    def status(self, now_ms: int) -> Status:
        """``live``; ``gone`` (deleted or expired, kept for its forks: 410);
        or ``missing`` (404)."""
        if not self.exists:
            return "missing"
        if self.soft_deleted or self.expired(now_ms):
            return "gone" if self.forks else "missing"
        return "live"


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _appended(state: StreamState, event: Event[Any]) -> None:
    payload = event.payload
    state.tail = event.index
    producer = payload.producer
    if producer is not None:
        state.producers[producer.id] = ProducerState(producer.epoch, producer.seq)
    if payload.seq is not None:
        state.stream_seq = payload.seq
    if payload.close:
        state.closed = True
        state.closed_by = producer


def fold(state: StreamState, event: Event[Any]) -> StreamState:
    """Fold one event of the path's session into its state (in place)."""
    state.index = event.index
    kind = event.type
    if kind == "created":
        created: Created = event.payload
        state = StreamState(
            index=event.index,
            exists=True,
            start=event.index,
            content_type=created.content_type,
            ttl_s=created.ttl_s,
            expires_at=created.expires_at,
            expires_at_ms=created.expires_at_ms,
            closed=created.closed,
            fork=created.fork,
            last_access_ms=_ms(event.created_at),
        )
        return state
    if not state.exists:
        return state
    if kind in APPEND_TYPES:
        _appended(state, event)
    elif kind == "closed":
        closed: Closed = event.payload
        state.closed = True
        state.closed_by = closed.producer
        if closed.producer is not None:
            p = closed.producer
            state.producers[p.id] = ProducerState(p.epoch, p.seq)
    elif kind == "deleted":
        if state.forks:
            state.soft_deleted = True
        else:
            state.exists = False
        return state
    elif kind == "forked":
        state.forks.append(event.payload)
        return state
    elif kind == "unforked":
        ref: ForkRef = event.payload
        state.forks = [f for f in state.forks if f != ref]
        if state.soft_deleted and not state.forks:
            state.exists = False
        return state
    state.last_access_ms = _ms(event.created_at)
    return state


#: The fold as an a2trio reducer, so a stream's state is a snapshot away
#: after a restart (``session.state``) rather than a read of its whole log.
REDUCER: Final[Reducer[StreamState]] = Reducer("durable_streams.state", StreamState(), fold)
