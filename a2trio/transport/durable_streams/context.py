"""What every request handler of the lane shares: the streams, the
options, the authorization hook, and the ASGI types."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import msgspec

from .. import Authorize, Limits, Request
from .table import Answer, Streams

__all__ = ["LaneContext", "Receive", "Refusal", "Scope", "Send", "StreamOperation", "logger"]

#: The lane's failures: what an answer of 503 (or an SSE stream cut short) hid.
logger = logging.getLogger("a2trio.transport.durable_streams")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class StreamOperation(msgspec.Struct, frozen=True, tag="durable-stream"):
    """What ``authorize`` is asked about a stream: ``action`` is ``create``,
    ``append`` (``close`` when the append closes it), ``read`` (``live``:
    ``None``, ``long-poll`` or ``sse``), ``head`` or ``delete``. A fork's
    ``create`` is followed by a ``read`` of its source (``forked_from``)."""

    action: Literal["create", "append", "read", "head", "delete"]
    path: str
    close: bool = False
    live: str | None = None
    forked_from: str | None = None


class Refusal(Exception):
    """A request refused before anything was written: its answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.answer = Answer(status, headers or {}, message.encode())


class LaneContext:
    """The lane's streams and options, as the handlers see them."""

    __slots__ = (
        "authorize",
        "chunk_bytes",
        "limits",
        "long_poll_s",
        "sse_reconnect_s",
        "streams",
    )

    def __init__(
        self,
        streams: Streams,
        *,
        authorize: Authorize | None,
        limits: Limits,
        long_poll_s: float,
        sse_reconnect_s: float,
        chunk_bytes: int,
    ) -> None:
        self.streams = streams
        self.authorize = authorize
        self.limits = limits
        self.long_poll_s = long_poll_s
        self.sse_reconnect_s = sse_reconnect_s
        self.chunk_bytes = chunk_bytes

    async def authorized(self, request: Request, operation: Any) -> None:
        """Ask ``authorize``; anything but ``True`` refuses with 403.

        Raises:
          Refusal: 403.
          A2Error: the hook's own error.
        """
        if self.authorize is None:
            return
        verdict = self.authorize(request, operation)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is not True:
            raise Refusal(403, "not authorized")
