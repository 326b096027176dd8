"""The write operations' decisions: create (and fork), append, close, delete.

Each decision is a pure function of a stream's state and the request, in
the order Section 5.2 gives for conflicting conditions (closed first, then
the content type, then the sequences), and returns a :class:`~.table.Decision`:
the events to commit and the answer. :class:`~.table.Streams.write` runs it
against the freshest state and commits conditionally.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from .model import (
    BytesAppended,
    Closed,
    Created,
    Fork,
    JsonAppended,
    Nothing,
    Producer,
    StreamState,
    TextAppended,
)
from .protocol import (
    CONTENT_TYPE,
    PRODUCER_EPOCH,
    PRODUCER_EXPECTED_SEQ,
    PRODUCER_RECEIVED_SEQ,
    PRODUCER_SEQ,
    STREAM_CLOSED,
    STREAM_NEXT_OFFSET,
    is_json,
    is_text,
    json_messages,
    media_type,
)
from .table import Answer, Decision, producer_event_id

__all__ = [
    "AppendRequest",
    "CreateRequest",
    "append_events",
    "decide_append",
    "decide_create",
    "decide_delete",
    "gone",
    "missing",
]


class CreateRequest(NamedTuple):
    """A ``PUT``: the stream's configuration and its initial body."""

    content_type: str
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None
    closed: bool
    fork: Fork | None
    body: bytes
    #: The materialized sub-offset prefix of a fork (its first own append).
    prefix: tuple[str, Any] | None = None
    #: Whether the fork offset was given (a re-create without one matches any).
    fork_offset_given: bool = False


class AppendRequest(NamedTuple):
    """A ``POST``: its body, content type, writer sequence, closure and producer."""

    body: bytes
    content_type: str | None
    seq: str | None
    close: bool
    producer: Producer | None


def missing(path: str) -> Answer:
    return Answer(404, {}, f"no stream at {path[:200]}".encode())


def gone(path: str) -> Answer:
    return Answer(410, {}, b"the stream was deleted; its forks still read it")


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status, headers or {}, message.encode())


def append_events(
    content_type: str,
    body: bytes,
    *,
    producer: Producer | None = None,
    seq: str | None = None,
    close: bool = False,
    allow_empty: bool = False,
) -> list[tuple[str, Any]]:
    """The append event for ``body`` on a stream of ``content_type``: JSON
    messages, UTF-8 text of a text type, or bytes (none for an empty JSON
    array when ``allow_empty``).

    Raises:
      ValueError: not JSON, or an empty array (JSON mode).
    """
    if not body:
        return []
    if is_json(content_type):
        messages = json_messages(body, allow_empty=allow_empty)
        if not messages:
            return []
        return [("json", JsonAppended(messages, producer, seq, close))]
    if is_text(content_type) and b"\x00" not in body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return [("text", TextAppended(text, producer, seq, close))]
    return [("bytes", BytesAppended(body, producer, seq, close))]


def _created_headers(state: StreamState) -> dict[str, str]:
    headers = {CONTENT_TYPE: state.content_type, STREAM_NEXT_OFFSET: state.tail_offset}
    if state.closed:
        headers[STREAM_CLOSED] = "true"
    return headers


def _same_config(state: StreamState, request: CreateRequest) -> bool:
    if media_type(state.content_type) != media_type(request.content_type):
        return False
    if (state.ttl_s, state.expires_at, state.closed) != (
        request.ttl_s,
        request.expires_at,
        request.closed,
    ):
        return False
    mine, theirs = state.fork, request.fork
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return (
        mine.source == theirs.source
        and (not request.fork_offset_given or mine.offset == theirs.offset)
        and mine.sub_offset == theirs.sub_offset
    )


def decide_create(
    path: str, request: CreateRequest, now_ms: int, location: str
) -> Callable[[StreamState], Decision]:
    """The events of a ``PUT`` on a state, or the answer for a stream that
    exists (200 with the same configuration, else 409).

    Raises:
      ValueError: a JSON initial body that is not JSON.
    """

    def decide(state: StreamState) -> Decision:
        status = state.status(now_ms)
        if status == "live":
            if _same_config(state, request):
                return Decision((), lambda s: Answer(200, _created_headers(s)))
            return Decision(
                (), lambda s: _text(409, "the stream exists with another configuration")
            )
        if status == "gone" or (state.exists and state.forks):
            return Decision(
                (),
                lambda s: _text(409, "the stream was deleted but still has forks: not reusable"),
            )
        created = Created(
            request.content_type,
            request.ttl_s,
            request.expires_at,
            request.expires_at_ms,
            request.closed,
            request.fork,
        )
        events: list[tuple[str, Any, str | None]] = [("created", created, None)]
        if request.prefix is not None:
            events.append((*request.prefix, None))
        for kind, payload in append_events(request.content_type, request.body, allow_empty=True):
            events.append((kind, payload, None))

        def answer(s: StreamState) -> Answer:
            headers = _created_headers(s)
            headers["location"] = location
            return Answer(201, headers)

        return Decision(events, answer)

    return decide


ProducerVerdict = Literal["accepted", "duplicate", "stale", "bad_epoch_seq", "gap"]


def producer_verdict(state: StreamState, producer: Producer) -> tuple[ProducerVerdict, int]:
    """Section 5.2.1's validation: the verdict and the number its answer
    names (the last accepted sequence, the current epoch, the expected one)."""
    current = state.producers.get(producer.id)
    if current is None:
        if producer.seq != 0:
            return "gap", 0
        return "accepted", 0
    if producer.epoch < current.epoch:
        return "stale", current.epoch
    if producer.epoch > current.epoch:
        return ("accepted", 0) if producer.seq == 0 else ("bad_epoch_seq", 0)
    if producer.seq <= current.seq:
        return "duplicate", current.seq
    if producer.seq == current.seq + 1:
        return "accepted", 0
    return "gap", current.seq + 1


def _refused(verdict: ProducerVerdict, number: int, producer: Producer) -> Answer:
    if verdict == "stale":
        return _text(403, "stale producer epoch", {PRODUCER_EPOCH: str(number)})
    if verdict == "bad_epoch_seq":
        return _text(400, "a new producer epoch must start at sequence 0")
    return _text(
        409,
        "producer sequence gap",
        {PRODUCER_EXPECTED_SEQ: str(number), PRODUCER_RECEIVED_SEQ: str(producer.seq)},
    )


def _closed_conflict(state: StreamState) -> Answer:
    return _text(
        409,
        "the stream is closed",
        {STREAM_CLOSED: "true", STREAM_NEXT_OFFSET: state.tail_offset},
    )


def _producer_headers(producer: Producer, seq: int) -> dict[str, str]:
    return {PRODUCER_EPOCH: str(producer.epoch), PRODUCER_SEQ: str(seq)}


def decide_append(
    path: str, request: AppendRequest, now_ms: int
) -> Callable[[StreamState], Decision]:
    """The decision function of a ``POST`` (append, close, or both)."""
    producer = request.producer

    def decide(state: StreamState) -> Decision:
        status = state.status(now_ms)
        if status != "live":
            return Decision((), lambda s: missing(path) if status == "missing" else gone(path))
        closing_twin = (
            producer is not None and state.closed_by is not None and state.closed_by == producer
        )
        if not request.body:
            return _close_only(state, closing_twin)
        if state.closed:
            if closing_twin:
                assert producer is not None
                headers = {STREAM_CLOSED: "true", STREAM_NEXT_OFFSET: state.tail_offset}
                headers.update(_producer_headers(producer, producer.seq))
                return Decision((), lambda s: Answer(204, headers))
            return Decision((), lambda s: _closed_conflict(s))
        if media_type(request.content_type) != media_type(state.content_type):
            return Decision(
                (), lambda s: _text(409, f"the stream's content type is {s.content_type}")
            )
        event_id = None
        if producer is not None:
            verdict, number = producer_verdict(state, producer)
            if verdict == "duplicate":
                headers = _producer_headers(producer, number)
                return Decision((), lambda s: Answer(204, headers))
            if verdict != "accepted":
                return Decision((), lambda s: _refused(verdict, number, producer))
            event_id = producer_event_id(path, state.start, producer)
        if request.seq is not None and state.stream_seq is not None:
            if request.seq <= state.stream_seq:
                return Decision(
                    (), lambda s: _text(409, "Stream-Seq must be greater than the last one")
                )
        try:
            [(kind, payload)] = append_events(
                state.content_type,
                request.body,
                producer=producer,
                seq=request.seq,
                close=request.close,
            )
        except ValueError as exc:
            message = str(exc)
            return Decision((), lambda s: _text(400, message))

        def answer(s: StreamState) -> Answer:
            headers = {STREAM_NEXT_OFFSET: s.tail_offset}
            if request.close:
                headers[STREAM_CLOSED] = "true"
            if producer is not None:
                headers.update(_producer_headers(producer, producer.seq))
                return Answer(200, headers)
            return Answer(204, headers)

        return Decision([(kind, payload, event_id)], answer)

    def _close_only(state: StreamState, closing_twin: bool) -> Decision:
        closed_headers = {STREAM_CLOSED: "true", STREAM_NEXT_OFFSET: state.tail_offset}
        if producer is None:
            if state.closed:
                return Decision((), lambda s: Answer(204, closed_headers))
            return Decision(
                [("closed", Closed(), None)],
                lambda s: Answer(204, {STREAM_CLOSED: "true", STREAM_NEXT_OFFSET: s.tail_offset}),
            )
        if state.closed:
            if closing_twin:
                headers = {**closed_headers, **_producer_headers(producer, producer.seq)}
                return Decision((), lambda s: Answer(204, headers))
            return Decision((), lambda s: _closed_conflict(s))
        verdict, number = producer_verdict(state, producer)
        if verdict == "duplicate":
            headers = {**closed_headers, **_producer_headers(producer, number)}
            return Decision((), lambda s: Answer(204, headers))
        if verdict != "accepted":
            return Decision((), lambda s: _refused(verdict, number, producer))
        return Decision(
            [("closed", Closed(producer), producer_event_id(path, state.start, producer))],
            lambda s: Answer(
                204,
                {
                    STREAM_CLOSED: "true",
                    STREAM_NEXT_OFFSET: s.tail_offset,
                    **_producer_headers(producer, producer.seq),
                },
            ),
        )

    return decide


def decide_delete(path: str, now_ms: int) -> Callable[[StreamState], Decision]:
    """The decision function of a ``DELETE``."""

    def decide(state: StreamState) -> Decision:
        status = state.status(now_ms)
        if status == "missing":
            return Decision((), lambda s: missing(path))
        if status == "gone":
            return Decision((), lambda s: gone(path))
        return Decision([("deleted", Nothing(), None)], lambda s: Answer(204, {}))

    return decide
