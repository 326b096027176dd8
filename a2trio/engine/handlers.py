"""Handler registration and its context.

Two forms: ``on(placed, fn, abort_on=..., lane=...)``, typed by the event
type's handle (a type checker verifies that ``fn`` takes a
``HandlerContext`` of the event's payload type), and ``handler(fn, ...)``,
registered under a string key in ``Server(handlers={...})``. Either way the
server checks at construction what it can: the event type is declared, and a
handler annotated ``HandlerContext[X]`` is registered for an event whose
payload is an ``X`` (:mod:`a2trio.signatures`).

Both take the handler's flow options (issue 33, ``docs/flow-control.md``):
``retry=``, ``timeout=`` and ``debounce=`` (:mod:`.pacing`), ``concurrency=``,
``throttle=`` and ``priority=`` (:mod:`.flow`).
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..contract import AppendInput, Contract, EventType
from ..signatures import accepts, parameter_annotation, type_name
from .abort import AbortOn, AbortPredicate, abort_matcher
from .context import LaneFn
from .flow import Concurrency, PriorityFn, Throttle, check_priority
from .handler_context import HandlerContext
from .pacing import Debounce, Retry, check_timeout

if TYPE_CHECKING:
    from .abort import AbortMatcher

__all__ = [
    "HandlerContext",
    "HandlerSpec",
    "Handlers",
    "Retry",
    "Returned",
    "handler",
    "on",
    "registrations",
]

P = TypeVar("P")

#: What a handler may return: nothing, one append input, or a list of them.
#: Returned events are committed atomically with the completion.
Returned = AppendInput | Sequence[AppendInput] | None

HandlerFn = Callable[["HandlerContext[Any]"], Awaitable[Returned]]


class HandlerSpec:
    """A handler with its options; build it with :func:`on` or :func:`handler`.

    Attributes:
      fn: the handler function.
      abort_on: event type -> ``True`` or a predicate, or None.
      lane: the lane, a string or a function, or None.
      event: the event type it is registered for when built with :func:`on`;
        None for a spec registered under a key of ``Server(handlers={...})``.
      retry: the :class:`Retry` policy, or None (the server's
        ``Timings.max_failures``).
      timeout: seconds an attempt may run, or None (no limit).
      concurrency: the :class:`~a2trio.Concurrency` limit, or None.
      debounce: the :class:`~a2trio.Debounce`, or None.
      throttle: the :class:`~a2trio.Throttle`, or None.
      priority: ``priority(event) -> int``, or None.
    """

    __slots__ = (
        "abort_on",
        "concurrency",
        "debounce",
        "event",
        "fn",
        "lane",
        "priority",
        "retry",
        "throttle",
        "timeout",
    )

    def __init__(
        self,
        fn: HandlerFn,
        abort_on: Mapping[str, bool | AbortPredicate] | None,
        lane: str | LaneFn | None,
        event: EventType[Any] | None = None,
        *,
        retry: Retry | None = None,
        timeout: float | None = None,
        concurrency: Concurrency | None = None,
        debounce: Debounce | None = None,
        throttle: Throttle | None = None,
        priority: PriorityFn | None = None,
    ) -> None:
        self.fn = fn
        self.abort_on: AbortMatcher | None = abort_on
        self.lane = lane
        self.event = event
        self.retry = retry
        self.timeout = timeout
        self.concurrency = concurrency
        self.debounce = debounce
        self.throttle = throttle
        self.priority = priority

    def check(self, contract: Contract, type: str) -> None:
        """Raise TypeError/ValueError if this spec does not fit ``contract``'s
        event type ``type``: an undeclared type, an ``abort_on`` type the
        contract lacks, a handle whose payload type is not the contract's, or
        a handler annotated ``HandlerContext[X]`` for a payload that is no ``X``."""
        if type not in contract.events:
            raise TypeError(
                f"contract '{contract.name}' has no event type {type!r}: "
                "cannot register a handler for it"
            )
        declared = contract.events[type]
        if self.event is not None and self.event.payload_type != declared:
            raise TypeError(
                f"handler {self.name} is registered with a2trio.on for {self.event!r}, but "
                f"contract '{contract.name}' declares {type!r} with "
                f"{type_name(declared)}"
            )
        _check_payload(self.fn, type, declared, f" of contract '{contract.name}'")
        for abort_type in self.abort_on or {}:
            if abort_type not in contract.events:
                raise TypeError(
                    f"contract '{contract.name}' has no event type {abort_type!r}: "
                    f"the handler for {type!r} cannot abort on it"
                )

    @property
    def name(self) -> str:
        """The handler function's name, for messages."""
        return str(getattr(self.fn, "__qualname__", None) or self.fn)

    def __repr__(self) -> str:
        return f"handler({getattr(self.fn, '__name__', self.fn)!r})"


#: What ``Server(handlers=...)`` takes: a list of specs built with :func:`on`,
#: or a mapping event type -> handler function or :func:`handler` spec.
Handlers = Sequence[HandlerSpec] | Mapping[str, HandlerSpec | Callable[..., Awaitable[Any]]]


def registrations(contract: Contract, handlers: Handlers | None) -> dict[str, HandlerSpec]:
    """``Server(handlers=...)`` as event type -> spec, each checked against
    ``contract`` (:meth:`HandlerSpec.check`).

    Raises:
      TypeError: a list entry not built with :func:`on`, a mapping key that
        differs from its spec's :func:`on` event, or any check that fails.
      ValueError: two handlers for one event type.
    """
    specs: dict[str, HandlerSpec] = {}
    if handlers is None:
        return specs
    if isinstance(handlers, Mapping):
        for type_, entry in handlers.items():
            spec = entry if isinstance(entry, HandlerSpec) else handler(entry)
            if spec.event is not None and spec.event.name != type_:
                raise TypeError(
                    f"handler {spec.name} is registered with a2trio.on for "
                    f"{spec.event.name!r} but keyed {type_!r} in handlers="
                )
            spec.check(contract, type_)
            specs[type_] = spec
        return specs
    for spec in handlers:
        if not isinstance(spec, HandlerSpec) or spec.event is None:
            raise TypeError(
                "a list of handlers holds a2trio.on(event_type, fn) registrations "
                f"(a mapping takes event type -> handler), got {spec!r}"
            )
        if spec.event.name in specs:
            raise ValueError(
                f"two handlers for event type {spec.event.name!r}: "
                f"{specs[spec.event.name].name} and {spec.name}"
            )
        spec.check(contract, spec.event.name)
        specs[spec.event.name] = spec
    return specs


def _check_payload(fn: HandlerFn, type: str, declared: Any, where: str) -> None:
    """Refuse a handler annotated ``HandlerContext[X]`` for an event of
    ``declared`` payload type when that is clearly not an ``X``."""
    annotation = parameter_annotation(fn, 0)
    if typing.get_origin(annotation) is not HandlerContext:
        return
    [payload] = typing.get_args(annotation)
    if not accepts(payload, declared):
        name = getattr(fn, "__qualname__", None) or fn
        raise TypeError(
            f"handler {name} is annotated HandlerContext[{type_name(payload)}], but event "
            f"type {type!r}{where} carries {type_name(declared)}"
        )


def _spec(
    fn: HandlerFn,
    abort_on: AbortOn,
    lane: str | LaneFn | None,
    event: EventType[Any] | None,
    retry: Retry | None,
    timeout: float | None,
    concurrency: Concurrency | None,
    debounce: Debounce | None,
    throttle: Throttle | None,
    priority: PriorityFn | None,
) -> HandlerSpec:
    if not callable(fn):
        raise TypeError(f"handler must be an async function, got {fn!r}")
    matcher = abort_matcher(abort_on)
    if lane is not None and not callable(lane) and (not isinstance(lane, str) or not lane):
        raise TypeError(f"lane must be a non-empty string or a function, got {lane!r}")
    if retry is not None and not isinstance(retry, Retry):
        raise TypeError(f"retry must be an a2trio.Retry(...), got {retry!r}")
    if concurrency is not None and not isinstance(concurrency, Concurrency):
        raise TypeError(f"concurrency must be an a2trio.Concurrency(...), got {concurrency!r}")
    if debounce is not None and not isinstance(debounce, Debounce):
        raise TypeError(f"debounce must be an a2trio.Debounce(...), got {debounce!r}")
    if throttle is not None and not isinstance(throttle, Throttle):
        raise TypeError(f"throttle must be an a2trio.Throttle(...), got {throttle!r}")
    return HandlerSpec(
        fn,
        matcher,
        lane,
        event,
        retry=retry,
        timeout=check_timeout(timeout),
        concurrency=concurrency,
        debounce=debounce,
        throttle=throttle,
        priority=check_priority(priority),
    )


def handler(
    fn: HandlerFn,
    *,
    abort_on: AbortOn = None,
    lane: str | LaneFn | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    concurrency: Concurrency | None = None,
    debounce: Debounce | None = None,
    throttle: Throttle | None = None,
    priority: PriorityFn | None = None,
) -> HandlerSpec:
    """Wrap a handler with options, for a key of ``Server(handlers={...})``
    (:func:`on` is the typed form).

    Args:
      fn: ``async def fn(ctx: HandlerContext) -> Returned``.
      abort_on: event types (names or :class:`~a2trio.EventType` handles) that
        abort a running attempt: a list of them, or a mapping of them to
        ``True`` or a predicate ``(event, trigger, {"attempt": n}) -> bool``
        for targeted cancellation.
      lane: a FIFO key: events of one lane run strictly one at a time, in order.
        A string, or ``lane(session_id, event) -> str`` resolved and stored when
        the event is appended.
      retry: a :class:`Retry`: failed attempts before a dead letter, and the
        exceptions that dead-letter at once. None: the server's
        ``Timings.max_failures``, every exception retried.
      timeout: seconds an attempt's handler may run. Past it the handler is
        cancelled (its lease and abort scopes aside) and the attempt fails
        with a :class:`TimeoutError` naming the timeout, retried or
        dead-lettered as ``retry`` says. None: no limit.
      concurrency: a :class:`~a2trio.Concurrency`: at most ``limit`` attempts
        at once per key value, across sessions and processes; the rest wait
        in order. None: no limit but the server's ``max_handlers``.
      debounce: a :class:`~a2trio.Debounce`: run only the last event of a
        key (per session) once its period passed without a newer one; the
        earlier ones are skipped. None: every event runs.
      throttle: a :class:`~a2trio.Throttle`: at most ``limit`` attempt
        starts per ``period`` per key value, across sessions and processes;
        the excess waits. None: no throttle.
      priority: ``priority(event) -> int``, resolved at append: a session's
        waiting events are claimed higher first (lanes still hold); one that
        raises or returns no int dead-letters its event. None: index order.

    Raises:
      TypeError: ``fn`` is not callable, a bad ``abort_on`` shape, a lane that
        is neither a non-empty string nor a function, a ``retry`` that is no
        :class:`Retry`, a ``concurrency`` that is no :class:`Concurrency`, a
        ``throttle`` that is no :class:`Throttle`, a ``priority`` that is no
        function, a ``timeout`` that is no number, or a ``debounce`` that is
        no :class:`~a2trio.Debounce`.
      ValueError: a ``timeout`` that is not positive and finite.
    """
    return _spec(
        fn, abort_on, lane, None, retry, timeout, concurrency, debounce, throttle, priority
    )


def on(
    event: EventType[P],
    fn: Callable[[HandlerContext[P]], Awaitable[Returned]],
    *,
    abort_on: AbortOn = None,
    lane: str | LaneFn | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    concurrency: Concurrency | None = None,
    debounce: Debounce | None = None,
    throttle: Throttle | None = None,
    priority: PriorityFn | None = None,
) -> HandlerSpec:
    """Register ``fn`` for the event type ``event``, for ``Server(handlers=[...])``.

    Typed by the handle: ``on(placed, ship)`` type-checks only if ``ship``
    takes a ``HandlerContext`` of ``placed``'s payload type, so
    ``ctx.event.payload`` is that type in the handler. The same mismatch is
    refused at run time when the annotation says so.

    Args:
      event: the event type's handle (:func:`~a2trio.event_type`).
      fn: ``async def fn(ctx: HandlerContext[P]) -> Returned``.
      abort_on: as for :func:`handler`.
      lane: as for :func:`handler`.
      retry: as for :func:`handler`.
      timeout: as for :func:`handler`.
      concurrency: as for :func:`handler`.
      debounce: as for :func:`handler`.
      throttle: as for :func:`handler`.
      priority: as for :func:`handler`.

    Raises:
      TypeError: ``event`` is not a handle, ``fn`` is not callable or is
        annotated for another payload type, a bad ``abort_on``, lane, retry,
        timeout, concurrency, throttle or debounce.
      ValueError: as for :func:`handler`.
    """
    if not isinstance(event, EventType):
        raise TypeError(f"on() takes an a2trio.event_type(...) handle, got {event!r}")
    spec = _spec(
        fn, abort_on, lane, event, retry, timeout, concurrency, debounce, throttle, priority
    )
    _check_payload(fn, event.name, event.payload_type, "")
    return spec


HandlerSpec.__module__ = "a2trio"
