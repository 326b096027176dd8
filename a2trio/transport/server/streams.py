"""The one SSE stream writer, for the session lanes and the actor lanes.

A route authorizes the stream, then hands :func:`write_sse` what differs: its
headers and its source, an async context manager that opens the feed and
yields an :class:`SSESource` (how to wait for the next chunk, and the
heartbeat task if the source has one). The writer owns the rest, the same for
every stream:

* the response start once the feed is open, then an ``ok`` comment, so the
  client sees the stream open before any frame;
* the frame loop: each chunk is one write; a source that ends
  (``StopAsyncIteration``) ends the stream cleanly, one that fails sends a
  last ``error`` frame (a dropped lagging reader, :class:`~a2trio.fanout.Lapped`,
  included: its client resumes with ``Last-Event-ID``);
* the disconnect watch: a client that leaves cancels the stream at once;
* the review of access (``access.under_review``): a withdrawn access ends the
  stream after the feed closes, with a last ``FORBIDDEN`` ``error`` frame.

Heartbeats are the source's: a source that waits on its feed under
``move_on_after(heartbeat_s)`` returns :data:`PING` when the wait lapses; the
session lane's shared subscription is interrupted by a :class:`Heartbeat`
instead (no timer around every wait), which the disconnect watch times: the
watch waits on the client under the next ping's deadline, so a stream runs one
task beside its loop, not two.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final

import trio

from ...engine.fanout import Lapped
from .. import sse
from .access import Grants, Withdrawal, under_review
from .auth import Authorize, Operation, Request
from .http import Receive, Send, logger, report, watch_disconnect

__all__ = ["PING", "Heartbeat", "SSESource", "write_sse"]

#: The heartbeat comment, encoded once.
PING: Final = sse.encode_comment("ping")
Headers = Sequence[tuple[bytes, bytes]]


class Heartbeat:
    """A stream's heartbeat, timed by its disconnect watch: after ``interval``
    seconds without a write, call ``interrupt`` (which makes the source's
    pending wait return :data:`PING`)."""

    def __init__(self, interrupt: Callable[[], None], interval: float) -> None:
        self.interrupt = interrupt
        self.interval = interval
        self.last = trio.current_time()

    def sent(self) -> None:
        """A chunk was written: the interval starts again."""
        self.last = trio.current_time()

    async def watch(self, receive: Receive, scope: trio.CancelScope) -> None:
        """:func:`~.http.watch_disconnect` (cancel ``scope`` once the client
        leaves) that interrupts the source after each silent interval."""
        while True:
            with trio.move_on_at(self.last + self.interval):
                await watch_disconnect(receive, scope)
                return
            if trio.current_time() >= self.last + self.interval:
                self.interrupt()
                self.last = trio.current_time()  # the ping is on its way


class SSESource:
    """What a stream writes: ``next_chunk()`` waits for the next bytes to send
    (frames or :data:`PING`) and raises ``StopAsyncIteration`` once the feed
    ended; ``heartbeat``, if any, runs beside the loop and hears of each write."""

    __slots__ = ("heartbeat", "next_chunk")

    def __init__(
        self, next_chunk: Callable[[], Awaitable[bytes]], heartbeat: Heartbeat | None = None
    ) -> None:
        self.next_chunk = next_chunk
        self.heartbeat = heartbeat


async def write_sse(
    send: Send,
    receive: Receive,
    source: AbstractAsyncContextManager[SSESource],
    *,
    headers: Headers,
    grants: Grants,
    authorize: Authorize | None,
    request: Request,
    operation: Operation,
    reauthorize_s: float | None,
) -> None:
    """Write one SSE response from ``source`` until it ends, fails, the client
    leaves or access is withdrawn (the module docstring).

    Args:
      source: opened before the response starts, so a refusal while opening
        (a store outage) still answers the error envelope.
      headers: the response's headers.
      grants, authorize, request, operation, reauthorize_s: the review of
        access (``access.under_review``): ``operation`` is what the stream
        was authorized for.

    Raises:
      Exception: what opening ``source`` raised (nothing was written).

    Cancellation: cancelling closes the feed; the response is left unfinished.
    """

    async def body(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async with source as chunks:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await body(sse.encode_comment("ok"))
        next_chunk, beat = chunks.next_chunk, chunks.heartbeat
        async with trio.open_nursery() as nursery:
            withdrawn = Withdrawal(nursery.cancel_scope)
            if beat is not None:
                nursery.start_soon(beat.watch, receive, nursery.cancel_scope)
            else:
                nursery.start_soon(watch_disconnect, receive, nursery.cancel_scope)
            with under_review(
                nursery, grants, authorize, request, operation, reauthorize_s, withdrawn
            ):
                try:
                    while True:
                        await body(await next_chunk())
                        if beat is not None:
                            beat.sent()
                except StopAsyncIteration:
                    pass
                except Exception as exc:
                    report(exc)
                    if isinstance(exc, Lapped):
                        logger.info("dropped a lagging SSE stream: %s", exc)
                    await body(sse.encode_error_frame(exc))
            nursery.cancel_scope.cancel(reason="stream ended")
    if withdrawn.error is not None:
        # The resumable end: the client reconnects with Last-Event-ID and is
        # asked again.
        await body(sse.encode_error_frame(withdrawn.error))
    await send({"type": "http.response.body", "body": b""})
