"""Forks: creating one over its source, and letting go of sources on delete.

A fork is created in three steps, each committed conditionally: the fork's
turn is taken and its state checked (an existing stream answers 200 or
409 as any ``PUT``); the source records the fork (``forked``, only while
the source is live); the fork's ``created`` (with its sub-offset prefix and
initial body) is committed. A fork that loses its own commit to another
process withdraws its record (``unforked``) and decides again.

A source deleted while forks read it is soft-deleted (410) and keeps its
data; when its last fork is deleted it is gone for good (404, and its path
may be created again), and if it was itself a fork its own source lets go of
it in turn, up the chain.
"""

from __future__ import annotations

from typing import Any

from ... import A2Error, ErrorCode
from .model import ForkRef, JsonAppended, Nothing, StreamState
from .protocol import START, Offset, format_offset, parse_offset
from .reads import read_chunk
from .table import Answer, Decision, Streams
from .writes import CreateRequest, append_events, decide_create, decide_delete

__all__ = ["create_fork", "delete_stream", "reap", "resolve_fork"]


def _bad(message: str) -> Answer:
    return Answer(400, {}, message.encode())


async def resolve_fork(
    streams: Streams,
    source_path: str,
    offset: Offset | None,
    sub_offset: int,
    content_type: str | None,
) -> tuple[StreamState, str, tuple[str, Any] | None] | Answer:
    """The source's state, the fork offset, and the sub-offset prefix to
    materialize as the fork's first own append; or the refusal."""
    try:
        source = await streams.state(source_path)
    except ValueError:
        return Answer(404, {}, b"no source stream at that path")
    status = source.status(streams.now_ms)
    if status == "missing":
        return Answer(404, {}, b"no source stream at that path")
    if status == "gone":
        return Answer(409, {}, b"the source stream was deleted but still has forks")
    if content_type is not None and content_type.split(";")[0].strip().lower() != (
        source.content_type.split(";")[0].strip().lower()
    ):
        return Answer(409, {}, b"a fork's content type must be its source's")
    tail = parse_offset(source.tail_offset)
    assert tail is not None
    if offset is None:
        offset = tail
    elif offset < START or tail < offset:
        return _bad("Stream-Fork-Offset is past the source stream's tail")
    prefix = None
    if sub_offset > 0:
        chunk = await read_chunk(streams, source_path, source, offset, max_bytes=1)
        if not chunk.items:
            return _bad("Stream-Fork-Sub-Offset points past the source stream's data")
        first = chunk.items[0]
        if first.json:
            messages = first.messages()
            if sub_offset > len(messages):
                return _bad("Stream-Fork-Sub-Offset is past the append's messages")
            prefix = ("json", JsonAppended(messages[:sub_offset]))
        else:
            if sub_offset > len(first.data):
                return _bad("Stream-Fork-Sub-Offset is past the append's bytes")
            [prefix] = append_events(source.content_type, first.data[:sub_offset])
    return source, format_offset(offset), prefix


def _register(ref: ForkRef, now_ms: int) -> Any:
    def decide(state: StreamState) -> Decision:
        status = state.status(now_ms)
        if status == "missing":
            return Decision((), lambda s: Answer(404, {}, b"no source stream at that path"))
        if status == "gone":
            return Decision((), lambda s: Answer(409, {}, b"the source stream was deleted"))
        return Decision([("forked", ref, None)], lambda s: Answer(204, {}))

    return decide


async def create_fork(streams: Streams, path: str, request: CreateRequest, location: str) -> Answer:
    """``PUT`` of a fork (``request.fork`` set)."""
    fork = request.fork
    assert fork is not None
    async with streams.turn(path):
        for _ in range(8):
            state = await streams.state(path)
            decision = decide_create(path, request, streams.now_ms, location)(state)
            if not decision.events:
                return decision.answer(state)
            index = state.index
            ref = ForkRef(path, index + 1)
            registered = await streams.write(fork.source, _register(ref, streams.now_ms))
            if registered.status != 204:
                return registered
            if state.index != index:  # the path moved while the source answered
                await streams.append_now(fork.source, "unforked", ref)
                continue
            try:
                state, _ = await streams.commit(path, state, decision.events)
            except A2Error as exc:
                await streams.append_now(fork.source, "unforked", ref)
                if exc.code is ErrorCode.INDEX_CONFLICT:
                    continue
                raise
            except BaseException:
                await streams.append_now(fork.source, "unforked", ref)
                raise
            return decision.answer(state)
    raise A2Error(ErrorCode.STORE_UNAVAILABLE, "the fork lost its commit repeatedly: retry")


async def _release(streams: Streams, state: StreamState, path: str) -> None:
    """Let go of ``path``'s source once ``path`` is gone for good, up the chain."""
    while not state.exists and state.fork is not None:
        fork = state.fork
        source = await streams.state(fork.source)
        if not source.exists or source.start != fork.source_start:
            return
        await streams.append_now(fork.source, "unforked", ForkRef(path, state.start))
        path, state = fork.source, await streams.state(fork.source)


async def delete_stream(streams: Streams, path: str) -> Answer:
    """``DELETE``: soft while forks read the stream; releasing its source if
    it was a fork and is now gone."""
    answer = await streams.write(path, decide_delete(path, streams.now_ms))
    if answer.status == 204:
        await _release(streams, await streams.state(path), path)
    elif answer.status == 404:
        await reap(streams, path, await streams.state(path))
    return answer


def _reaped(now_ms: int) -> Any:
    def decide(state: StreamState) -> Decision:
        if state.exists and not state.forks and state.expired(now_ms):
            return Decision([("deleted", Nothing(), None)], lambda s: Answer(204, {}))
        return Decision((), lambda s: Answer(200, {}))

    return decide


async def reap(streams: Streams, path: str, state: StreamState) -> None:
    """Delete for good a fork found expired with no forks of its own, so its
    source lets go of it (a source deleted meanwhile is then gone: 404)."""
    if not (state.exists and state.fork is not None and not state.forks):
        return
    if not state.expired(streams.now_ms):
        return
    answer = await streams.write(path, _reaped(streams.now_ms))
    if answer.status == 204:
        await _release(streams, await streams.state(path), path)
