"""A Trio client of one actor's HTTP lanes (httpx, which runs on Trio).

::

    async with open_actor_client("http://localhost:8000", "vault", "alice",
                                 state_type=PublicVault) as vault:
        answer = await vault.call("deposit", {"amount": 50}, id="deposit-7")
        current = await vault.state()
        async with vault.follow() as states:      # SSE state frames, forward only
            async for state in states: ...

What it promises:

* **Calls are never retried by the client.** A network failure, a timeout or
  a 5xx does not say whether the call committed; retry it yourself with the
  same ``id`` (the call's ``messageId``) and input, which answers the
  original ``{state, index}`` if it did.
* **``on_snapshot``** receives every successful read and call answer, before
  the method returns, older ones included (a retried call's original answer
  may be older than what the client has seen).
* **The live view moves forward only**: :attr:`ActorClient.latest` adopts an
  answer, a read or a stream frame only if its index is newer, so a delayed
  frame or an older answer never replaces a newer state. ``follow()`` yields
  only states newer than the last adopted one and resumes after it.

Failures are :class:`ActorRequestError`, with the HTTP ``status`` when there
was an answer and the server's :class:`~a2trio.A2Error` when it sent the
envelope. Set timeouts with ``trio.fail_after`` around any call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Generic, TypeVar, cast, overload
from urllib.parse import quote

import httpx
import msgspec

from ..actor_calls import ActorState
from ..errors import A2Error
from ..stores._feed import Feed
from . import wire
from .sse import SSEDecoder, SSEEvent

__all__ = ["ActorClient", "ActorRequestError", "open_actor_client"]

S = TypeVar("S")

_encode = msgspec.json.Encoder().encode
_SSE: Final = {"accept": "text/event-stream"}


class ActorRequestError(Exception):
    """A call, read or stream that failed.

    Attributes:
      status: the HTTP status, or None when no answer came (a network failure:
        whether a call committed is unknown; retry it with the same ``id``).
      error: the server's error (``CALL_REFUSED``, ``FORBIDDEN``, ...) when it
        answered with the envelope.
    """

    def __init__(self, message: str, status: int | None, error: A2Error | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error


class _Answer(msgspec.Struct, frozen=True):
    state: Any
    index: int


_answer = msgspec.json.Decoder(_Answer)


class ActorClient(Generic[S]):
    """One actor over HTTP; build it with :func:`open_actor_client`."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        actor: str,
        actor_id: str,
        state_type: type[S] | Any,
        on_snapshot: Callable[[ActorState[S]], None] | None,
    ) -> None:
        self._http = http
        self._path = f"/{_quote(actor)}/{_quote(actor_id)}"
        self._state_type = state_type
        self._on_snapshot = on_snapshot
        self.latest: ActorState[S] | None = None
        """The newest state adopted (by index) from answers, reads and frames."""

    def _decode(self, data: bytes | str) -> ActorState[S]:
        try:
            answer = _answer.decode(data)
            state = msgspec.convert(answer.state, self._state_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ActorRequestError(f"unreadable answer from {self._path}: {exc}", 200) from exc
        return ActorState(state, answer.index)

    def _adopt(self, state: ActorState[S]) -> bool:
        if self.latest is not None and state.index <= self.latest.index:
            return False
        self.latest = state
        return True

    async def _request(self, method: str, **options: Any) -> ActorState[S]:
        try:
            response = await self._http.request(method, self._path, **options)
        except httpx.HTTPError as exc:
            raise ActorRequestError(f"{method} {self._path} failed: {exc}", None) from exc
        if response.status_code != 200:
            error = wire.error_from_wire(response.content)
            message = error.message if error is not None else response.text[:200]
            raise ActorRequestError(
                f"{method} {self._path} answered {response.status_code}: {message}",
                response.status_code,
                error,
            )
        state = self._decode(response.content)
        self._adopt(state)
        if self._on_snapshot is not None:
            self._on_snapshot(state)
        return state

    async def call(self, name: str, input: Any = None, *, id: str | None = None) -> ActorState[S]:
        """Call ``name`` with ``input``; the answer is the state after the
        call's own commit (or, for a retry of a committed ``id``, its original
        answer), whatever :attr:`latest` is.

        Args:
          id: the call's ``messageId``: retrying with it is exactly-once.

        Raises:
          ActorRequestError: ``status`` 409 with ``error.code`` ``CALL_REFUSED``
            for a refusal, 400 for an undeclared call or a bad input, 403, ...;
            ``status`` None when no answer came.

        Cancellation: the request is abandoned; whether the call committed is
        unknown, as after a network failure.
        """
        body: dict[str, Any] = {"event": name, "input": msgspec.to_builtins(input)}
        if id is not None:
            body["messageId"] = id
        return await self._request(
            "POST", content=_encode(body), headers={"content-type": "application/json"}
        )

    async def state(self) -> ActorState[S]:
        """A fresh snapshot (``GET ?snapshot=1``).

        Raises:
          ActorRequestError: as :meth:`call`.
        """
        return await self._request("GET", params={"snapshot": "1"})

    @asynccontextmanager
    async def follow(self) -> AsyncIterator[Feed[ActorState[S]]]:
        """Follow the actor's state frames (SSE), from after :attr:`latest`
        (its current state first when nothing was adopted yet). The feed
        yields only states newer than the last adopted one; it ends when the
        server ends the stream, and raises :class:`ActorRequestError` if the
        server refused or lost it. Enter it again to resume.

        Cancellation: leaving the block closes the stream.
        """
        params = {} if self.latest is None else {"startAfter": str(self.latest.index)}
        try:
            async with self._http.stream("GET", self._path, params=params, headers=_SSE) as r:
                if r.status_code != 200:
                    await r.aread()
                    error = wire.error_from_wire(r.content)
                    raise ActorRequestError(
                        f"GET {self._path} (stream) answered {r.status_code}",
                        r.status_code,
                        error,
                    )
                frames = _StateFrames(self, r)
                try:
                    yield frames
                finally:
                    # httpx's byte iterator is a generator: close it here, in
                    # the stream's block, not in the garbage collector.
                    await frames.aclose()
        except httpx.HTTPError as exc:
            raise ActorRequestError(f"GET {self._path} (stream) failed: {exc}", None) from exc


class _StateFrames(Feed[ActorState[S]]):
    def __init__(self, client: ActorClient[S], response: httpx.Response) -> None:
        self._client = client
        self._chunks = cast("AsyncGenerator[bytes]", response.aiter_bytes())
        self._decoder = SSEDecoder()
        self._frames: list[SSEEvent] = []

    async def aclose(self) -> None:
        await self._chunks.aclose()

    async def receive(self) -> ActorState[S]:
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.event == "error":
                    error = wire.error_from_wire(frame.data.encode())
                    raise ActorRequestError(
                        f"the stream ended: {error.message if error else frame.data[:200]}",
                        None,
                        error,
                    )
                if frame.event == "state":
                    state = self._client._decode(frame.data)
                    if self._client._adopt(state):
                        return state
            try:
                chunk = await anext(self._chunks)
            except httpx.HTTPError as exc:
                raise ActorRequestError(f"the stream failed: {exc}", None) from exc
            self._frames.extend(self._decoder.feed(chunk))


def _quote(segment: str) -> str:
    return quote(segment, safe="")


@overload
def open_actor_client(
    base_url: str,
    actor: str,
    actor_id: str,
    *,
    state_type: type[S],
    on_snapshot: Callable[[ActorState[S]], None] | None = None,
    http: httpx.AsyncClient | None = None,
) -> AbstractAsyncContextManager[ActorClient[S]]: ...


@overload
def open_actor_client(
    base_url: str,
    actor: str,
    actor_id: str,
    *,
    on_snapshot: Callable[[ActorState[Any]], None] | None = None,
    http: httpx.AsyncClient | None = None,
) -> AbstractAsyncContextManager[ActorClient[Any]]: ...


def open_actor_client(
    base_url: str,
    actor: str,
    actor_id: str,
    *,
    state_type: Any = Any,
    on_snapshot: Callable[[ActorState[Any]], None] | None = None,
    http: httpx.AsyncClient | None = None,
) -> AbstractAsyncContextManager[ActorClient[Any]]:
    """A client of actor ``actor_id`` of the actor mounted as ``actor`` at
    ``base_url``: an async context manager.

    Args:
      state_type: what answers and frames decode to (the mount's view shape,
        e.g. ``PublicVault``); default JSON builtins.
      on_snapshot: called with every successful read and call answer, before
        the method returns.
      http: an ``httpx.AsyncClient`` of your own, whose ``base_url`` is used
        instead; by default one (without timeouts) is opened and closed here.
    """
    return _open(base_url, actor, actor_id, state_type, on_snapshot, http)


@asynccontextmanager
async def _open(
    base_url: str,
    actor: str,
    actor_id: str,
    state_type: Any,
    on_snapshot: Callable[[ActorState[Any]], None] | None,
    http: httpx.AsyncClient | None,
) -> AsyncIterator[ActorClient[Any]]:
    if http is not None:
        yield ActorClient(http, actor, actor_id, state_type, on_snapshot)
        return
    async with httpx.AsyncClient(base_url=base_url, timeout=None) as owned:
        yield ActorClient(owned, actor, actor_id, state_type, on_snapshot)
