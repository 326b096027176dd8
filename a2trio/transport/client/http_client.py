"""The same client over plain HTTP: SSE streams, HTTP pushes, backscroll.

For networks that block WebSockets. Each followed session is one SSE request
(``GET /{contract}/{session}``, ``Accept: text/event-stream``) that resumes
with ``Last-Event-ID`` from its lane's index after every loss; pushes are
``POST``s retried like the socket client's (client ids, three attempts);
:meth:`HttpClient.load_history` pages backward through the history lane.

::

    async with open_http_client("http://localhost:8000/orders") as client:
        await client.push("s1", {"type": "ordered", "payload": {"item": "book"}})
        async with client.subscribe("s1") as lane:
            async for frame in lane:
                ...
        page = await client.load_history("s1", before=100)

Every request goes through one ``httpx.AsyncClient`` owned by the block, and
every lane task lives in its nursery. Errors reach the caller as themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote

import msgspec
import trio

from ...errors import A2Error, ErrorCode
from .. import wire
from ..sse import SSEDecoder, SSEEvent
from ._httpx import httpx
from .client import with_ids
from .connection import (
    DEFAULT_RECONNECT,
    Closed,
    Live,
    ReconnectPolicy,
    retrying,
    trace_headers,
)
from .history import DEFAULT_HISTORY_LIMIT, Backscroll, History
from .lane import Fold, Lane, LaneFrame

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ...contract import Contract, Reducer
    from ...telemetry import Telemetry

__all__ = ["REQUEST_TIMEOUT_S", "HttpClient", "open_http_client"]

S = TypeVar("S")

#: How long a push, presence or history request may take (streams have no
#: read timeout: the watchdog covers them).
REQUEST_TIMEOUT_S = 30.0


_events = msgspec.json.Decoder(wire.EventsBody)
_event = msgspec.json.Decoder(wire.WireEvent)
_patch = msgspec.json.Decoder(wire.WirePresencePatch)
_snapshot = msgspec.json.Decoder(wire.WirePresenceSnapshot)
_JSON: Final = {"content-type": "application/json"}


def _unavailable(why: str) -> A2Error:
    return A2Error(ErrorCode.STORE_UNAVAILABLE, why)


def _answer_error(status: int, body: bytes) -> A2Error:
    """A non-200 answer as the server's error (its envelope), or a retryable one."""
    return wire.error_from_wire(body) or _unavailable(f"HTTP {status}")


def _frame(event: SSEEvent, session_id: str) -> LaneFrame | None:
    """One SSE frame as the socket frame it mirrors; ``None`` for unknown names.

    Raises:
      A2Error: an ``error`` frame (the server's error), or a frame it cannot read.
    """
    try:
        match event.event:
            case "event":
                return wire.event_frame(_event.decode(event.data))
            case "presence":
                p = _patch.decode(event.data)
                return wire.PresenceFrame(p.participant, p.values, p.seen, p.at, session_id)
            case "presence-snapshot":
                return wire.PresenceSnapshotFrame(_snapshot.decode(event.data).snapshot, session_id)
            case "error":
                raise wire.error_from_wire(event.data.encode()) or _unavailable("stream failed")
    except msgspec.DecodeError as exc:
        raise _unavailable(f"unreadable {event.event!r} frame: {exc}") from None
    return None


class HttpClient:
    """The handle :func:`open_http_client` yields."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        nursery: trio.Nursery,
        policy: ReconnectPolicy,
        watchdog_s: float,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.http = http
        self._telemetry = telemetry
        self._nursery = nursery
        self._policy = policy
        self._watchdog_s = watchdog_s
        self._lanes: dict[str, Lane] = {}
        self._histories: dict[str, History] = {}

    @staticmethod
    def _path(session_id: str) -> str:
        return quote(session_id, safe="")

    async def _request(self, method: str, session_id: str, **kwargs: Any) -> bytes:
        try:
            response = await self.http.request(method, self._path(session_id), **kwargs)
        except httpx.TransportError as exc:
            raise _unavailable(f"request failed: {exc!r}") from exc
        if response.status_code != 200:
            raise _answer_error(response.status_code, response.content)
        return response.content

    # -- pushes ------------------------------------------------------------------

    async def push(self, session_id: str, *events: Mapping[str, Any]) -> list[wire.WireEvent]:
        """``POST`` events (``{type, payload, id?}``); as the socket client's
        :meth:`~a2trio.transport.Client.push`: client ids, three attempts on
        ``STORE_UNAVAILABLE`` and transport failures, other errors at once.
        A live stream of the session that has not delivered the stored events
        yet is refreshed (restarted from its index at once, state
        ``Connecting`` then ``Live``), so the follower sees its own write
        without waiting for a polling server's next read.

        Cancellation: a cancelled push may still commit; retry with the same ids.
        """
        body = wire.encode(wire.PushBody(events=with_ids(events)))
        headers = {**_JSON, **trace_headers(self._telemetry)}
        stored = await retrying(lambda: self._post(session_id, body, headers))
        self._refresh(session_id, stored)
        return stored

    def _refresh(self, session_id: str, stored: list[wire.WireEvent]) -> None:
        """Restart a live stream of ``session_id`` that has not delivered
        ``stored`` yet, as the seed refreshes an idle SSE stream after its own
        push: a polling server's stream may sleep up to ``poll_idle_s``
        before reading the write, while a fresh GET reads it at once. It
        resumes from the lane's index, so nothing is skipped or repeated; a
        lane already reconnecting is shared, since its GET reads the store anew."""
        lane = self._lanes.get(session_id)
        if lane is None or not stored or not isinstance(lane.state, Live):
            return
        if lane.index < max(event.index for event in stored):
            lane.reconnect()

    async def _post(
        self, session_id: str, body: bytes, headers: Mapping[str, str]
    ) -> list[wire.WireEvent]:
        answer = await self._request("POST", session_id, content=body, headers=headers)
        return _events.decode(answer).events

    async def set_presence(
        self,
        session_id: str,
        participant: str,
        values: Mapping[str, Any],
        *,
        seen: int | None = None,
        at_ms: int | None = None,
    ) -> None:
        """``POST`` a presence patch; unlike the socket's, refusals raise.

        Raises:
          A2Error: the server refused the patch, or the request failed.

        Cancellation: the patch was applied or not; sending it again is harmless.
        """
        presence = wire.PushedPresenceWire(participant, dict(values), seen, at_ms)
        await self._post(session_id, wire.encode(wire.PushBody(presence=presence)), _JSON)

    # -- lanes -------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, session_id: str, start_after: int = 0, *, presence: bool = False
    ) -> AsyncIterator[Lane]:
        """Follow a session over SSE from ``start_after`` (exclusive).

        As the socket client's :meth:`~a2trio.transport.Client.subscribe`; with
        ``presence=True`` each stream (first and every reconnect) starts with
        a presence snapshot that repaints ``lane.presence``.

        Raises:
          RuntimeError: this client already follows the session.
        """
        if session_id in self._lanes:
            raise RuntimeError(f"this client already follows {session_id!r}")
        lane = self._lanes[session_id] = Lane(session_id, start_after, self._policy)
        scope = trio.CancelScope()
        try:
            await self._nursery.start(self._run_lane, lane, presence, scope)
            yield lane
        finally:
            scope.cancel(reason="unsubscribed")
            lane.connection.set(Closed())
            del self._lanes[session_id]

    async def _run_lane(
        self,
        lane: Lane,
        presence: bool,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None],
    ) -> None:
        with scope:

            async def attach(
                start_after: int,
                live: Callable[[], None],
                deliver: Callable[[LaneFrame], Awaitable[None]],
            ) -> None:
                await self._stream(lane.session_id, presence, start_after, live, deliver)

            await lane.run(attach, task_status=task_status)

    async def _stream(
        self,
        session_id: str,
        presence: bool,
        start_after: int,
        live: Callable[[], None],
        deliver: Callable[[LaneFrame], Awaitable[None]],
    ) -> None:
        headers = {"accept": "text/event-stream", "last-event-id": str(start_after)}
        params = {"presence": "1"} if presence else {}
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=None)
        try:
            async with self.http.stream(
                "GET", self._path(session_id), headers=headers, params=params, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    raise _answer_error(response.status_code, await response.aread())
                live()
                decoder = SSEDecoder()
                with trio.CancelScope() as watchdog:
                    watchdog.relative_deadline = self._watchdog_s
                    async for chunk in response.aiter_raw():
                        watchdog.relative_deadline = self._watchdog_s
                        for event in decoder.feed(chunk):
                            frame = _frame(event, session_id)
                            if frame is None:
                                continue
                            history = self._histories.get(session_id)
                            if history is not None and isinstance(frame, wire.EventFrame):
                                history.merge([frame])
                            await deliver(frame)
                if watchdog.cancelled_caught:
                    raise _unavailable(f"stream lost: no frame for {self._watchdog_s} s")
        except httpx.TransportError as exc:
            raise _unavailable(f"stream lost: {exc!r}") from exc
        except ValueError as exc:  # the decoder's line limit
            raise _unavailable(f"stream lost: {exc}") from exc

    @asynccontextmanager
    async def follow(
        self,
        session_id: str,
        reducer: Reducer[S],
        *,
        contract: Contract | None = None,
        start_after: int = 0,
        state: S | None = None,
    ) -> AsyncIterator[Fold[S]]:
        """Follow a session folded locally: see :meth:`a2trio.transport.Client.follow`."""
        async with self.subscribe(session_id, start_after) as lane:
            yield Fold(lane, reducer, contract, state)

    def reconnect(self, session_id: str | None = None) -> None:
        """Restart one stream (or every stream) from its index now, with a fresh GET."""
        for sid, lane in list(self._lanes.items()):
            if session_id is None or sid == session_id:
                lane.reconnect()

    # -- backscroll --------------------------------------------------------------

    def history(self, session_id: str) -> History:
        """The session's merged feed (created empty on first use)."""
        history = self._histories.get(session_id)
        if history is None:
            history = self._histories[session_id] = History(session_id)
        return history

    async def load_history(
        self, session_id: str, before: int | None = None, limit: int = DEFAULT_HISTORY_LIMIT
    ) -> Backscroll:
        """Fetch up to ``limit`` events below ``before`` and merge them into
        :meth:`history` (the seed's ``loadHistory``; see :mod:`.history`).

        ``before`` defaults to the oldest loaded event, else the followed
        lane's index + 1.

        Raises:
          ValueError: bad bounds, or nothing to page from (pass ``before``).
          A2Error: the history lane refused or failed; nothing is merged.

        Cancellation: calls serialize per session; a cancelled one merges nothing.
        """
        history = self.history(session_id)
        lane = self._lanes.get(session_id)
        frontier = lane.index if lane is not None else None

        async def fetch(gte: int, lte: int) -> list[wire.WireEvent]:
            answer = await self._request("GET", session_id, params={"gte": gte, "lte": lte})
            return _events.decode(answer).events

        return await history.load(fetch, frontier, before, limit)


@asynccontextmanager
async def open_http_client(
    base_url: str,
    *,
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    watchdog_s: float = 45.0,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[HttpClient]:
    """A client of one mounted contract over HTTP, ``http://host:port/{contract}``.

    Args:
      base_url: the contract's mount; sessions are ``{base_url}/{session}``.
      reconnect: the reconnect policy of every stream.
      watchdog_s: silence after which a stream counts as lost; three of the
        server's default 15 s heartbeats.
      headers: sent with every request (an ``authorization`` header, say).
      transport: an httpx transport (tests, proxies).
      telemetry: with one (``a2trio.otel.OpenTelemetry()``), each push
        carries the caller's current span as its ``traceparent`` header, so
        the append and its handlers on the server continue the caller's trace.

    Cancellation: leaving the block cancels every stream and closes the
    connections; pushes not yet answered may have committed.
    """
    base = base_url.rstrip("/") + "/"
    try:
        async with (
            httpx.AsyncClient(
                base_url=base,
                headers=dict(headers or {}),
                timeout=REQUEST_TIMEOUT_S,
                transport=transport,
            ) as http,
            trio.open_nursery() as nursery,
        ):
            client = HttpClient(http, nursery, reconnect, watchdog_s, telemetry)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel(reason="client closed")
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
