"""Authorization: ``authorize(request, operation)`` before every read, write and subscription.

Authentication (who is asking) is the application's: it reads
:attr:`Request.headers` (a cookie, a bearer token). ``authorize`` decides whether
this operation is allowed; ``False`` answers 403 ``FORBIDDEN`` (on a socket, an
error ack or an ``unsubscribed`` notice). Raising ``A2Error`` answers with that
error's status. The operation is a tagged union, dispatched with ``match``:

* :class:`PushOperation` - events and/or presence pushed to a session;
* :class:`StreamOperation` - an SSE stream (or a single-session socket);
* :class:`HistoryOperation` - a bounded read of the log;
* :class:`SubscribeOperation` - one lane of a multiplexed socket;
* :class:`InspectOperation` - an operator's read through ``/_a2/inspect``;
* :class:`RedriveOperation`, :class:`SkipOperation`, :class:`WakeOperation`,
  :class:`CancelOperation`,
  :class:`RetryNowOperation` - an operator's action through ``/_a2/inspect``;
* :class:`EraseOperation`, :class:`TrimOperation` - an operator's removal of
  a session's data through ``/_a2/inspect`` (retention);
* :class:`MetricsOperation` - an operator's scrape of ``/_a2/metrics``;
* :class:`StateOperation` - an actor's snapshot (``GET ?snapshot=1``);
* :class:`CallOperation` - a call on an actor (``POST``); an actor's live
  state is a :class:`StreamOperation` (see ``docs/actors.md``).

The inspection and metrics operations are refused unless ``authorize`` allows them: with
no ``authorize`` at all, always.

Pushed events and presence also pass the server's ``validate_push``, after
``authorize`` and before schema validation, as in the seed.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from ...errors import A2Error, ErrorCode
from ...push import PushedEvent, PushedPresence

__all__ = [
    "Authorize",
    "CallOperation",
    "CancelOperation",
    "HistoryOperation",
    "InspectOperation",
    "MetricsOperation",
    "Operation",
    "PushOperation",
    "RedriveOperation",
    "Request",
    "RetryNowOperation",
    "SkipOperation",
    "StateOperation",
    "StreamOperation",
    "SubscribeOperation",
    "WakeOperation",
    "check_authorized",
]

#: Hidden from :class:`Request`'s repr: credentials (``a2trio.transport.server.tokens``).
_SECRET_HEADERS: Final = frozenset({"authorization", "cookie", "proxy-authorization"})
_SECRET_PARAMS: Final = frozenset({"token"})


class Request(msgspec.Struct, frozen=True):
    """What ``authorize`` sees of the HTTP request or socket handshake.

    Attributes:
      method: ``GET``/``POST`` (``GET`` for sockets).
      path: the decoded path.
      headers: lower-cased names to values (repeated headers joined by ``, ``).
      query: query parameters (the last value of a repeated one).
      client: the peer's (host, port), when the server knows it.

    Its repr hides the ``Authorization`` and ``Cookie`` headers and the
    query's ``token``.
    """

    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    client: tuple[str, int] | None = None

    def __repr__(self) -> str:
        # Credentials never reach a log line through a logged request.
        headers = {k: "<hidden>" if k in _SECRET_HEADERS else v for k, v in self.headers.items()}
        query = {k: "<hidden>" if k in _SECRET_PARAMS else v for k, v in self.query.items()}
        return (
            f"Request({self.method!r}, {self.path!r}, headers={headers!r}, "
            f"query={query!r}, client={self.client!r})"
        )


class PushOperation(msgspec.Struct, frozen=True, tag="push"):
    contract: str
    session_id: str
    events: tuple[PushedEvent, ...] = ()
    presence: PushedPresence | None = None


class StreamOperation(msgspec.Struct, frozen=True, tag="stream"):
    contract: str
    session_id: str
    start_after: int
    presence: bool = False


class HistoryOperation(msgspec.Struct, frozen=True, tag="history"):
    contract: str
    session_id: str
    gte: int | None = None
    lte: int | None = None


class SubscribeOperation(msgspec.Struct, frozen=True, tag="subscribe"):
    contract: str
    session_id: str
    start_after: int


class InspectOperation(msgspec.Struct, frozen=True, tag="inspect"):
    """An operator's read through ``/_a2/inspect`` (off unless the app enables
    it): ``session_id`` is ``""`` when listing the contract's sessions. Refused
    unless ``authorize`` says ``True`` to it; with no ``authorize`` at all,
    always refused."""

    contract: str
    session_id: str = ""


class RedriveOperation(msgspec.Struct, frozen=True, tag="redrive"):
    """An operator's redrive of a dead letter through ``/_a2/inspect``, with
    the ``by`` and ``reason`` it will be recorded with. Refused unless
    ``authorize`` says ``True`` to it (always, with no ``authorize``)."""

    contract: str
    session_id: str
    index: int
    by: str
    reason: str


class SkipOperation(msgspec.Struct, frozen=True, tag="skip"):
    """An operator's skip of an event through ``/_a2/inspect`` (refused as
    :class:`RedriveOperation` is)."""

    contract: str
    session_id: str
    index: int
    by: str
    reason: str


class RetryNowOperation(msgspec.Struct, frozen=True, tag="retry_now"):
    """An operator's retry-now of a session through ``/_a2/inspect`` (refused
    as :class:`RedriveOperation` is)."""

    contract: str
    session_id: str
    by: str
    reason: str


class WakeOperation(msgspec.Struct, frozen=True, tag="wake"):
    """An operator's wake of an event whose handler is suspended in a durable
    sleep or wait (issue 34) through ``/_a2/inspect`` (refused as
    :class:`RedriveOperation` is)."""

    contract: str
    session_id: str
    index: int
    by: str
    reason: str


class CancelOperation(msgspec.Struct, frozen=True, tag="cancel"):
    """An operator's cancel of an event whose handler is suspended in a
    durable sleep or wait (issue 34; settled as a skip) through
    ``/_a2/inspect`` (refused as :class:`RedriveOperation` is)."""

    contract: str
    session_id: str
    index: int
    by: str
    reason: str


class EraseOperation(msgspec.Struct, frozen=True, tag="erase"):
    """An operator's erasure of a session through ``/_a2/inspect`` (its
    events and everything derived from them: ``server.retention.erase``),
    refused as :class:`RedriveOperation` is."""

    contract: str
    session_id: str
    by: str
    reason: str


class TrimOperation(msgspec.Struct, frozen=True, tag="trim"):
    """An operator's trim of a session below ``reducer``'s snapshot through
    ``/_a2/inspect`` (``server.retention.trim``), refused as
    :class:`RedriveOperation` is."""

    contract: str
    session_id: str
    reducer: str
    by: str
    reason: str


class MetricsOperation(msgspec.Struct, frozen=True, tag="metrics"):
    """An operator's scrape of ``/_a2/metrics`` (off unless the app enables
    it): the numbers of every mounted contract, so ``contract`` and
    ``session_id`` are ``""``. Refused unless ``authorize`` says ``True`` to
    it; with no ``authorize`` at all, always refused."""

    contract: str = ""
    session_id: str = ""


#: The operations an app must allow explicitly: refused without ``authorize``.
_OPERATOR = (
    InspectOperation,
    RedriveOperation,
    SkipOperation,
    RetryNowOperation,
    WakeOperation,
    CancelOperation,
    EraseOperation,
    TrimOperation,
    MetricsOperation,
)


class StateOperation(msgspec.Struct, frozen=True, tag="state"):
    """A read of an actor's current ``{state, index}`` (``GET ?snapshot=1``)."""

    contract: str
    session_id: str


class CallOperation(msgspec.Struct, frozen=True, tag="call"):
    """A call on an actor: its name (``event`` on the wire), its input as sent
    (not yet validated) and its ``messageId``."""

    contract: str
    session_id: str
    event: str
    input: Any = None
    message_id: str | None = None


Operation = (
    PushOperation
    | StreamOperation
    | HistoryOperation
    | SubscribeOperation
    | InspectOperation
    | RedriveOperation
    | SkipOperation
    | RetryNowOperation
    | WakeOperation
    | CancelOperation
    | EraseOperation
    | TrimOperation
    | MetricsOperation
    | StateOperation
    | CallOperation
)

Authorize = Callable[[Request, Operation], "bool | Awaitable[bool]"]


async def check_authorized(authorize: Authorize | None, request: Request, op: Operation) -> None:
    """Ask ``authorize``; raise ``FORBIDDEN`` unless it says ``True``.

    Raises:
      A2Error: ``FORBIDDEN`` on a refusal, or whatever ``A2Error`` the policy
        raised itself.

    Cancellation: a checkpoint only if the policy is async; nothing is written.
    """
    if authorize is None:
        if isinstance(op, _OPERATOR):
            raise A2Error(
                ErrorCode.FORBIDDEN,
                f"inspection needs an authorize policy that allows {type(op).__name__}",
            )
        return
    verdict: Any = authorize(request, op)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    if verdict is not True:
        raise A2Error(ErrorCode.FORBIDDEN, f"{type(op).__name__} on '{op.session_id}' refused")
