"""Connection states, the reconnect policy, and the push retry budget.

Every followed session of a client has a connection whose state is one of five
records, a tagged union on ``status`` (the seed's ``connection`` union):

============================== ======================================================
state                          meaning
============================== ======================================================
``Idle()``                     nothing asked for yet
``Connecting(reconnects, e)``  opening (``reconnects == 0``) or reopening after ``e``
``Paused(reconnects, e)``      the policy said ``False``: waits for ``reconnect()``
``Live(reconnects)``           subscribed; frames flow
``Closed()``                   the subscription (or the client) was closed
============================== ======================================================

"Reconnecting" is ``Connecting`` with ``reconnects > 0``. A
:class:`ConnectionWatch` holds one connection's state; read ``watch.state``
or await a change with :meth:`ConnectionWatch.wait_for`.

The policy is ``policy(session_id, error, attempt) -> delay_s | False``:
``attempt`` starts at 1 and resets when the connection goes live or on an
explicit ``reconnect()``; ``error`` is the :class:`~a2trio.A2Error` that ended
the last try, or ``None`` when the stream ended cleanly. :class:`Backoff` is
the default: exponential, jittered, capped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar, Final, Literal, TypeVar

import msgspec
import trio

from ...backoff import Backoff
from ...errors import A2Error, ErrorCode
from ...telemetry import Telemetry, decode_trace_context

__all__ = [
    "DEFAULT_PUSH_BACKOFF",
    "DEFAULT_RECONNECT",
    "PUSH_ATTEMPTS",
    "Backoff",
    "Closed",
    "Connecting",
    "ConnectionState",
    "ConnectionWatch",
    "Idle",
    "Live",
    "Paused",
    "ReconnectPolicy",
    "retryable",
    "retrying",
    "trace_headers",
]

logger = logging.getLogger("a2trio.transport.client")
T = TypeVar("T")


class Idle(msgspec.Struct, frozen=True, tag="idle", tag_field="status"):
    """Nothing asked for yet."""

    status: ClassVar[str] = "idle"


class Connecting(msgspec.Struct, frozen=True, tag="connecting", tag_field="status"):
    """Opening; ``reconnects > 0`` after a loss, ``error`` says why (``None``: it ended cleanly)."""

    status: ClassVar[str] = "connecting"
    reconnects: int
    error: A2Error | None = None


class Paused(msgspec.Struct, frozen=True, tag="paused", tag_field="status"):
    """The policy returned ``False``; nothing reconnects until ``reconnect()``."""

    status: ClassVar[str] = "paused"
    reconnects: int
    error: A2Error | None = None


class Live(msgspec.Struct, frozen=True, tag="live", tag_field="status"):
    """Subscribed: the server confirmed the lane (socket) or answered 200 (SSE)."""

    status: ClassVar[str] = "live"
    reconnects: int


class Closed(msgspec.Struct, frozen=True, tag="closed", tag_field="status"):
    """The subscription or its client was closed."""

    status: ClassVar[str] = "closed"


ConnectionState = Idle | Connecting | Paused | Live | Closed

#: ``policy(session_id, error, attempt)``: seconds to wait before the next try,
#: or ``False`` to pause.
ReconnectPolicy = Callable[[str, A2Error | None, int], float | Literal[False]]


#: The reconnect policy of every client unless given one: 0.5 s doubling to 30 s.
DEFAULT_RECONNECT: Final = Backoff()

#: A push is tried at most this many times (the seed's three-attempt budget).
PUSH_ATTEMPTS: Final = 3

#: The waits between push attempts: 0.25 s, then 0.5 s (jittered).
DEFAULT_PUSH_BACKOFF: Final = Backoff(base_s=0.25, cap_s=2.0)


class ConnectionWatch:
    """One connection's current state, and a way to wait for the next ones.

    The client sets it; applications read :attr:`state` and await
    :meth:`wait_for`.
    """

    def __init__(self) -> None:
        self._state: ConnectionState = Idle()
        self._changed = trio.Event()

    @property
    def state(self) -> ConnectionState:
        """The current state."""
        return self._state

    def set(self, state: ConnectionState) -> None:
        """Move to ``state`` and wake every waiter (the client calls this)."""
        if state == self._state:
            return
        logger.debug("connection %s", state)
        self._state = state
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(
        self, predicate: Callable[[ConnectionState], bool] = lambda _: True
    ) -> ConnectionState:
        """Wait until the state satisfies ``predicate``; return that state.

        Checks the current state first, so ``wait_for(lambda s: isinstance(s,
        Live))`` returns at once on a live connection. A state that came and
        went while this task was not scheduled may be missed: wait for the
        condition you need, not for a transition.

        Cancellation: a checkpoint; cancelling it changes nothing.
        """
        while not predicate(self._state):
            await self._changed.wait()
        await trio.lowlevel.checkpoint()
        return self._state


def retryable(error: A2Error) -> bool:
    """Whether a push that failed with ``error`` may be tried again: the store
    or the transport failed, so it may or may not have committed."""
    return error.code is ErrorCode.STORE_UNAVAILABLE


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    attempts: int = PUSH_ATTEMPTS,
    backoff: Backoff = DEFAULT_PUSH_BACKOFF,
) -> T:
    """Run ``attempt`` until it returns, at most ``attempts`` times.

    Only ``STORE_UNAVAILABLE`` (the server's, or a transport failure mapped to
    it) is retried; any other :class:`~a2trio.A2Error` is raised at once. The
    attempts must be idempotent: a push carries client ids, so a replay after a
    lost ack returns the stored events instead of writing them again.

    Raises:
      A2Error: the first non-retryable error, or the last retryable one.
    """
    n = 1
    while True:
        try:
            return await attempt()
        except A2Error as exc:
            if not retryable(exc) or n >= attempts:
                raise
            logger.info("push attempt %d failed (%s); retrying", n, exc.message)
        await trio.sleep(backoff.delay(n))
        n += 1


def trace_headers(telemetry: Telemetry | None) -> dict[str, str]:
    """The W3C trace headers of the caller's current span (``traceparent``,
    ``tracestate``) for a push to carry, so the server continues the caller's
    trace; none without a telemetry or a current span."""
    return {} if telemetry is None else decode_trace_context(telemetry.trace_context())
