"""A Trio client of one actor's HTTP lanes (httpx, which runs on Trio).

::

    async with open_actor_client("http://localhost:8000", "vault", "alice",
                                 state_type=PublicVault) as vault:
        answer = await vault.call("deposit", {"amount": 50}, id="deposit-7")
        current = await vault.state()
        async with vault.follow() as states:      # SSE state frames, forward only,
            async for state in states: ...        # across reconnects

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
  only states newer than the last adopted one.
* **The live view reconnects**: ``follow()`` runs on the session client's
  machinery (:class:`~a2trio.transport.client.lane.Resuming`): the same connection
  states, reconnect policy and ``reconnect()``, each try resuming after
  :attr:`ActorClient.latest`.

Failures of calls and reads are :class:`ActorRequestError`, with the HTTP
``status`` when there was an answer and the server's :class:`~a2trio.A2Error`
when it sent the envelope; a followed stream's failures are its connection
states. Set timeouts with ``trio.fail_after`` around any call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any, Final, Generic, TypeVar, cast, overload
from urllib.parse import quote

import msgspec
import trio
from msgspec import UNSET

from ...engine.actor_calls import ActorState
from ...errors import A2Error, ErrorCode
from ...stores.feed import own_tasks
from .. import wire
from ..sse import SSEDecoder
from ._httpx import httpx
from .connection import DEFAULT_RECONNECT, ReconnectPolicy
from .lane import Resuming

__all__ = ["ActorClient", "ActorRequestError", "ActorStates", "open_actor_client"]

S = TypeVar("S")

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


_answer = msgspec.json.Decoder(wire.StateBody)


class ActorClient(Generic[S]):
    """One actor over HTTP; build it with :func:`open_actor_client`."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        actor: str,
        actor_id: str,
        state_type: type[S] | Any,
        on_snapshot: Callable[[ActorState[S]], None] | None,
        reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
        watchdog_s: float = 45.0,
    ) -> None:
        self._http = http
        self._actor_id = actor_id
        self._reconnect = reconnect
        self._watchdog_s = watchdog_s
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
        body = wire.CallBody(name, msgspec.to_builtins(input), UNSET if id is None else id)
        return await self._request(
            "POST", content=wire.encode(body), headers={"content-type": "application/json"}
        )

    async def state(self) -> ActorState[S]:
        """A fresh snapshot (``GET ?snapshot=1``).

        Raises:
          ActorRequestError: as :meth:`call`.
        """
        return await self._request("GET", params={"snapshot": "1"})

    @asynccontextmanager
    async def follow(self) -> AsyncIterator[ActorStates[S]]:
        """Follow the actor's state frames (SSE), from after :attr:`latest`
        (its current state first when nothing was adopted yet), across
        reconnects: the session client's connection states
        (``states.connection``), its reconnect policy and ``reconnect()``.

        Each try asks for the states after :attr:`latest`, so after a lost
        stream, a restarted server or a watchdog timeout the feed goes on
        from the newest state adopted, by the stream or by a call's answer.
        It yields only states newer than the last adopted one. A refused or
        lost stream is a connection state, not an exception: its error is
        the :class:`~a2trio.A2Error` the server sent (``FORBIDDEN``, ...) or
        ``STORE_UNAVAILABLE`` for a lost stream or an unreadable frame;
        ``await states.wait_live()`` raises it once the policy pauses.

        Cancellation: leaving the block closes the stream (state ``Closed``,
        iteration ends).
        """
        states = ActorStates(self, self._reconnect)
        async with own_tasks() as nursery:
            await nursery.start(states.run_tries, self._stream)
            yield states

    async def _stream(
        self,
        live: Callable[[], None],
        deliver: Callable[[ActorState[S]], Awaitable[None]],
    ) -> None:
        """One try of :meth:`follow`: a GET of the states after :attr:`latest`."""
        params = {} if self.latest is None else {"startAfter": str(self.latest.index)}
        try:
            async with self._http.stream("GET", self._path, params=params, headers=_SSE) as r:
                if r.status_code != 200:
                    error = wire.error_from_wire(await r.aread())
                    raise error or _unavailable(f"the stream answered {r.status_code}")
                live()
                decoder = SSEDecoder()
                # httpx's byte iterator is a generator: close it here, in the
                # stream's block, not in the garbage collector.
                chunks = cast("AsyncGenerator[bytes]", r.aiter_bytes())
                with trio.CancelScope() as watchdog:
                    watchdog.relative_deadline = self._watchdog_s
                    async with aclosing(chunks):
                        async for chunk in chunks:
                            watchdog.relative_deadline = self._watchdog_s
                            for frame in decoder.feed(chunk):
                                if frame.event == "error":
                                    error = wire.error_from_wire(frame.data.encode())
                                    raise error or _unavailable("the stream failed")
                                if frame.event == "state":
                                    await deliver(self._streamed(frame.data))
                if watchdog.cancelled_caught:
                    raise _unavailable(f"stream lost: no frame for {self._watchdog_s} s")
        except httpx.HTTPError as exc:
            raise _unavailable(f"stream lost: {exc!r}") from exc
        except ValueError as exc:  # the decoder's line limit
            raise _unavailable(f"stream lost: {exc}") from exc

    def _streamed(self, data: str) -> ActorState[S]:
        try:
            return self._decode(data)
        except ActorRequestError as exc:
            raise _unavailable(str(exc)) from exc


class ActorStates(Resuming[ActorState[S]]):
    """What :meth:`ActorClient.follow` yields: ``async for state in states``.

    Attributes:
      connection: the stream's :class:`~a2trio.transport.ConnectionWatch`
        (``Connecting``, ``Live``, ``Paused``, ``Closed``, with the error that
        ended the last try).
    """

    def __init__(self, client: ActorClient[S], policy: ReconnectPolicy) -> None:
        super().__init__(client._actor_id, policy)
        self._client = client

    def takes(self, frame: ActorState[S]) -> bool:
        """Only a state newer than :attr:`ActorClient.latest`, which adopts it."""
        return self._client._adopt(frame)


def _unavailable(why: str) -> A2Error:
    return A2Error(ErrorCode.STORE_UNAVAILABLE, why)


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
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    watchdog_s: float = 45.0,
) -> AbstractAsyncContextManager[ActorClient[S]]: ...


@overload
def open_actor_client(
    base_url: str,
    actor: str,
    actor_id: str,
    *,
    on_snapshot: Callable[[ActorState[Any]], None] | None = None,
    http: httpx.AsyncClient | None = None,
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    watchdog_s: float = 45.0,
) -> AbstractAsyncContextManager[ActorClient[Any]]: ...


def open_actor_client(
    base_url: str,
    actor: str,
    actor_id: str,
    *,
    state_type: Any = Any,
    on_snapshot: Callable[[ActorState[Any]], None] | None = None,
    http: httpx.AsyncClient | None = None,
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    watchdog_s: float = 45.0,
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
      reconnect: the reconnect policy of :meth:`ActorClient.follow`'s stream
        (the session client's, ``policy(actor_id, error, attempt)``).
      watchdog_s: silence after which a followed stream counts as lost; three
        of the server's default 15 s heartbeats.
    """
    options = _Options(state_type, on_snapshot, reconnect, watchdog_s)
    return _open(base_url, actor, actor_id, options, http)


class _Options(msgspec.Struct, frozen=True):
    state_type: Any
    on_snapshot: Callable[[ActorState[Any]], None] | None
    reconnect: ReconnectPolicy
    watchdog_s: float


@asynccontextmanager
async def _open(
    base_url: str, actor: str, actor_id: str, options: _Options, http: httpx.AsyncClient | None
) -> AsyncIterator[ActorClient[Any]]:
    def client(http: httpx.AsyncClient) -> ActorClient[Any]:
        return ActorClient(
            http,
            actor,
            actor_id,
            options.state_type,
            options.on_snapshot,
            options.reconnect,
            options.watchdog_s,
        )

    if http is not None:
        yield client(http)
        return
    async with httpx.AsyncClient(base_url=base_url, timeout=None) as owned:
        yield client(owned)
