"""Handler registration: ``handler(fn, abort_on=..., lane=...)`` and its context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from .contract import AppendInput, Contract, Event
from .core import LaneFn

if TYPE_CHECKING:
    from .abort import AbortMatcher
    from .session import HandlerSession

__all__ = ["HandlerContext", "HandlerSpec", "Returned", "handler"]

P = TypeVar("P")

#: What a handler may return: nothing, one append input, or a list of them.
#: Returned events are committed atomically with the completion.
Returned = AppendInput | Sequence[AppendInput] | None

HandlerFn = Callable[["HandlerContext[Any]"], Awaitable[Returned]]
AbortPredicate = Callable[[Event[Any], Event[Any], dict[str, int]], bool]


class HandlerContext(Generic[P]):
    """What a handler receives.

    Attributes:
      event: the triggering event, payload typed.
      attempt: the durable, 1-based dispatch ordinal of this run.
      session: this session, whose ``append(name, *events)`` is idempotent per
        trigger: ids derive from (trigger id, name, position), and the store
        refuses it once a newer attempt owns the trigger (``SUPERSEDED_ATTEMPT``).
      aborted: set when an ``abort_on`` event matched. The handler is also
        cancelled then, unless it shields itself to finish and return events.
    """

    __slots__ = ("_aborted", "attempt", "event", "session")

    def __init__(
        self, event: Event[P], attempt: int, session: HandlerSession, aborted: trio.Event | None
    ) -> None:
        self.event = event
        self.attempt = attempt
        self.session = session
        self._aborted = aborted

    @property
    def aborted(self) -> trio.Event:
        """Set when an ``abort_on`` event matched (never, for a handler without
        ``abort_on``; its event is made only if asked for: one fewer object per
        event for the garbage collector)."""
        if self._aborted is None:
            self._aborted = trio.Event()
        return self._aborted

    def __repr__(self) -> str:
        return f"HandlerContext(event={self.event.type}#{self.event.index}, attempt={self.attempt})"


class HandlerSpec:
    """A handler with its options; build it with :func:`handler`."""

    __slots__ = ("abort_on", "fn", "lane")

    def __init__(
        self,
        fn: HandlerFn,
        abort_on: Mapping[str, bool | AbortPredicate] | None,
        lane: str | LaneFn | None,
    ) -> None:
        self.fn = fn
        self.abort_on: AbortMatcher | None = abort_on
        self.lane = lane

    def check(self, contract: Contract, type: str) -> None:
        """Raise TypeError/ValueError if this spec does not fit ``contract``."""
        if type not in contract.events:
            raise TypeError(
                f"contract '{contract.name}' has no event type {type!r}: "
                "cannot register a handler for it"
            )
        for abort_type in self.abort_on or {}:
            if abort_type not in contract.events:
                raise TypeError(
                    f"contract '{contract.name}' has no event type {abort_type!r}: "
                    f"the handler for {type!r} cannot abort on it"
                )

    def __repr__(self) -> str:
        return f"handler({getattr(self.fn, '__name__', self.fn)!r})"


def handler(
    fn: HandlerFn,
    *,
    abort_on: Sequence[str] | Mapping[str, bool | AbortPredicate] | None = None,
    lane: str | LaneFn | None = None,
) -> HandlerSpec:
    """Wrap a handler with options.

    Args:
      fn: ``async def fn(ctx: HandlerContext) -> Returned``.
      abort_on: event types that abort a running attempt: a list of types, or a
        mapping type -> ``True`` or a predicate ``(event, trigger, {"attempt": n})
        -> bool`` for targeted cancellation.
      lane: a FIFO key: events of one lane run strictly one at a time, in order.
        A string, or ``lane(session_id, event) -> str`` resolved and stored when
        the event is appended.

    Raises:
      TypeError: ``fn`` is not callable, a bad ``abort_on`` shape, or a lane that
        is neither a non-empty string nor a function.
    """
    if not callable(fn):
        raise TypeError(f"handler must be an async function, got {fn!r}")
    matcher: dict[str, bool | AbortPredicate] | None
    if abort_on is None:
        matcher = None
    elif isinstance(abort_on, Mapping):
        matcher = {}
        for key, rule in abort_on.items():
            if rule is not True and rule is not False and not callable(rule):
                raise TypeError(f"abort_on[{key!r}] must be True or a predicate, got {rule!r}")
            if rule is not False:
                matcher[key] = rule
    elif isinstance(abort_on, str):
        raise TypeError(f"abort_on must be a list of types, not the string {abort_on!r}")
    else:
        matcher = dict.fromkeys(abort_on, True)
    if lane is not None and not callable(lane) and (not isinstance(lane, str) or not lane):
        raise TypeError(f"lane must be a non-empty string or a function, got {lane!r}")
    return HandlerSpec(fn, matcher or None, lane)


HandlerSpec.__module__ = "a2trio"
HandlerContext.__module__ = "a2trio"
