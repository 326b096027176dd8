"""Flow limits across sessions (issue 33): a handler's :class:`Concurrency`
and :class:`Throttle`, and its ``priority=``.

The limit lives in the store, not here: an event appended for a handler
with ``concurrency=`` carries its key, resolved at append (as a lane
function is) and scoped to the contract and the event type, and its limit
(``AppendEvent.concurrency_key``/``concurrency_limit``). Every store's
claim counts the key's live claims across sessions and processes and takes
the event only under the limit (``a2trio.stores.rules.flow``); the rest wait
in order, never failing.

This module also keeps, per server, which sessions wait on which key
(:class:`FlowWaiters`): when an attempt of a keyed event ends here, the
sessions waiting on its key are woken at once. A slot freed by another
process is found by this server's sweep (the store's sweep counts a key's
room) or when the waiting claim's ``Busy`` answer comes due.

A key function that raises or returns a non-string leaves the event
without a key at append, and the attempt that runs it resolves the key
again and dead-letters the event with the error (:class:`FlowKeyError`),
as any handler failure (a key resolved then, for an event appended before
the handler had a limit, runs it unlimited). A throttle's key is resolved,
stored and failed the same way (``AppendEvent.throttle_*``); a throttled
event's wait ends at a known instant, at which the drain is armed. A
``priority(event) -> int`` is resolved at append too (``AppendEvent.priority``):
a claim considers its session's candidates higher first
(``rules.claim_order``), so the free handler slots and a key's free slots go
to them first; lanes still hold (only a lane's head is a candidate).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..contract import AppendInput
from ..stores.base import StoredEvent

if TYPE_CHECKING:
    from .pacing import Debounce

__all__ = [
    "Concurrency",
    "FlowKeyError",
    "FlowOptions",
    "FlowWaiters",
    "KeyFn",
    "PriorityFn",
    "Throttle",
    "check_priority",
    "key_value",
    "priority_value",
    "recheck",
    "resolve_concurrency",
    "resolve_throttle",
]

#: ``key(event) -> str``: the flow key of an event, resolved at append.
KeyFn = Callable[[AppendInput], str]
#: ``priority(event) -> int``: an event's priority among the waiting events
#: of its handler (higher first), resolved at append.
PriorityFn = Callable[[AppendInput], int]

_SEP = "\x1f"


class Concurrency:
    """At most ``limit`` attempts of a handler run at once per key value,
    across sessions and processes: ``a2trio.handler(fn,
    concurrency=a2trio.Concurrency(2, key=lambda e: e.payload.customer))``.

    A running attempt holds its slot as long as its claim: a crashed
    holder's slot frees when its lease lapses. Events over the limit wait,
    in order, and never fail or dead-letter for waiting.

    Args:
      limit: attempts at once per key value (at least 1).
      key: ``key(event) -> str`` (an :class:`~a2trio.AppendInput` with the
        typed payload), resolved when the event is appended; None: one key
        for the handler. A key that raises or returns a non-string
        dead-letters its event with the error.

    Raises:
      TypeError: ``limit`` is not an int, or ``key`` is not callable.
      ValueError: ``limit`` is below 1.
    """

    __slots__ = ("key", "limit")

    def __init__(self, limit: int, key: KeyFn | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"Concurrency(limit=...) must be an int, got {limit!r}")
        if limit < 1:
            raise ValueError(f"Concurrency(limit=...) must be at least 1, got {limit!r}")
        if key is not None and not callable(key):
            raise TypeError(f"Concurrency(key=...) must be a function of the event, got {key!r}")
        self.limit = limit
        self.key = key

    def __repr__(self) -> str:
        key = "" if self.key is None else f", key={getattr(self.key, '__name__', self.key)}"
        return f"Concurrency({self.limit}{key})"


_PERIOD = re.compile(r"^(?:0|[1-9]\d*)(?:\.\d+)?(ms|s|m|h|d)$")
_PERIOD_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _period_ms(period: float | str) -> int:
    if isinstance(period, str):
        found = _PERIOD.match(period)
        if found is None:
            raise ValueError(
                f"Throttle(period=...) must be seconds or a duration like '30s', '1m', "
                f"'500ms', got {period!r}"
            )
        ms = round(float(period[: -len(found.group(1))]) * _PERIOD_MS[found.group(1)])
    elif isinstance(period, bool) or not isinstance(period, (int, float)):
        raise TypeError(f"Throttle(period=...) must be seconds or a duration, got {period!r}")
    elif not (period > 0 and math.isfinite(period)):
        raise ValueError(f"Throttle(period=...) must be positive and finite, got {period!r}")
    else:
        ms = round(period * 1000)
    if ms < 1:
        raise ValueError(f"Throttle(period=...) must be at least 1 ms, got {period!r}")
    return ms


class Throttle:
    """At most ``limit`` attempt starts of a handler per ``period`` per key
    value, across sessions and processes: ``a2trio.handler(fn,
    throttle=a2trio.Throttle(10, "1m", key=lambda e: e.payload.customer))``.

    An attempt starts when it is claimed (a retry is a new start); the
    excess waits, in order, and is never dropped: it runs once the window
    has room (its first start's ``period`` has passed).

    Args:
      limit: attempt starts per period per key value (at least 1).
      period: seconds, or a duration string (``"500ms"``, ``"30s"``,
        ``"1m"``, ``"1h"``).
      key: as :class:`Concurrency`'s.

    Raises:
      TypeError: ``limit`` is not an int, ``period`` not a number or a
        string, or ``key`` not callable.
      ValueError: ``limit`` below 1, or a period that is not positive.
    """

    __slots__ = ("key", "limit", "period_ms")

    def __init__(self, limit: int, period: float | str, key: KeyFn | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"Throttle(limit=...) must be an int, got {limit!r}")
        if limit < 1:
            raise ValueError(f"Throttle(limit=...) must be at least 1, got {limit!r}")
        self.period_ms = _period_ms(period)
        if key is not None and not callable(key):
            raise TypeError(f"Throttle(key=...) must be a function of the event, got {key!r}")
        self.limit = limit
        self.key = key

    def __repr__(self) -> str:
        key = "" if self.key is None else f", key={getattr(self.key, '__name__', self.key)}"
        return f"Throttle({self.limit}, {self.period_ms / 1000:g}{key})"


class FlowKeyError(Exception):
    """A :class:`Concurrency` key function raised or returned a non-string:
    its event is dead-lettered with this error, at once."""


def key_value(option: Concurrency | Throttle, event: AppendInput) -> str:
    """The key value of ``event`` under ``option`` (``""`` without a key
    function).

    Raises:
      FlowKeyError: the key function raised (its error is the cause) or
        returned a non-string."""
    if option.key is None:
        return ""
    what = "concurrency" if isinstance(option, Concurrency) else "throttle"
    try:
        value: Any = option.key(event)
    except Exception as exc:
        raise FlowKeyError(f"the {what} key of {event.type!r} raised {exc!r}") from exc
    if not isinstance(value, str):
        raise FlowKeyError(f"the {what} key of {event.type!r} must return a string, got {value!r}")
    return value


def resolve_concurrency(
    prefix: str, concurrency: Concurrency | None, event: AppendInput
) -> tuple[str | None, int | None]:
    """The stored key and limit of ``event`` (None, None: unlimited, or a key
    that failed: the attempt dead-letters it). The key is scoped by the
    contract's store prefix and the event type: one handler's limits."""
    if concurrency is None:
        return None, None
    try:
        value = key_value(concurrency, event)
    except FlowKeyError:
        return None, None
    return f"{prefix}{event.type}{_SEP}{value}", concurrency.limit


def resolve_throttle(
    prefix: str, throttle: Throttle | None, event: AppendInput
) -> tuple[str | None, int | None, int | None]:
    """The stored throttle key, limit and period of ``event`` (Nones:
    unthrottled, or a key that failed), scoped as :func:`resolve_concurrency`'s."""
    if throttle is None:
        return None, None, None
    try:
        value = key_value(throttle, event)
    except FlowKeyError:
        return None, None, None
    return f"{prefix}{event.type}{_SEP}{value}", throttle.limit, throttle.period_ms


def check_priority(priority: PriorityFn | None) -> PriorityFn | None:
    """``priority=`` as given, checked.

    Raises:
      TypeError: not callable."""
    if priority is not None and not callable(priority):
        raise TypeError(f"priority must be a function of the event, got {priority!r}")
    return priority


def priority_value(priority: PriorityFn, event: AppendInput) -> int:
    """``priority(event)``.

    Raises:
      FlowKeyError: it raised (its error is the cause) or returned no int."""
    try:
        value: Any = priority(event)
    except Exception as exc:
        raise FlowKeyError(f"the priority of {event.type!r} raised {exc!r}") from exc
    if isinstance(value, bool) or not isinstance(value, int):
        raise FlowKeyError(f"the priority of {event.type!r} must return an int, got {value!r}")
    return value


class FlowOptions(Protocol):
    """A handler's flow options, as its ``HandlerSpec`` holds them."""

    @property
    def concurrency(self) -> Concurrency | None: ...
    @property
    def throttle(self) -> Throttle | None: ...
    @property
    def priority(self) -> PriorityFn | None: ...
    @property
    def debounce(self) -> Debounce | None: ...


def recheck(options: FlowOptions, row: StoredEvent, payload: Any) -> None:
    """Before an attempt: each flow option of the handler (``options``: its
    spec) whose value ``row`` lacks (it failed at append, or the row predates
    the option) is resolved again, raising its :class:`FlowKeyError` (a
    debounce key its ``DebounceKeyError``); one that resolves now leaves the
    event unlimited by it. A handler without options builds nothing here."""
    concurrency, throttle, priority = options.concurrency, options.throttle, options.priority
    debounce = options.debounce
    if concurrency is None and throttle is None and priority is None and debounce is None:
        return
    event = AppendInput(row.type, payload, row.id)
    if concurrency is not None and row.concurrency_key is None:
        key_value(concurrency, event)
    if throttle is not None and row.throttle_key is None:
        key_value(throttle, event)
    if priority is not None and row.priority is None:
        priority_value(priority, event)
    if debounce is not None and row.debounce_key is None:
        debounce.key_of(event)


class FlowWaiters:
    """Which sessions wait on which concurrency key, in one server; woken
    through ``on_free`` (the drain registry's ``wake``) when an attempt of
    the key ends here."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[str]] = {}
        self.on_free: Callable[[str], None] | None = None

    def wait(self, session_id: str, keys: list[str]) -> None:
        """``session_id`` holds events its claim left waiting on ``keys``."""
        for key in keys:
            self._waiting.setdefault(key, set()).add(session_id)

    def freed(self, key: str) -> None:
        """A slot of ``key`` freed here: wake every session waiting on it (the
        first to claim takes it; the others find the key full and wait again)."""
        sessions = self._waiting.pop(key, None)
        if sessions and self.on_free is not None:
            for session_id in sorted(sessions):
                self.on_free(session_id)

    def waiting(self) -> Mapping[str, frozenset[str]]:
        """The sessions waiting, per key (tests, inspection)."""
        return {key: frozenset(sessions) for key, sessions in self._waiting.items()}


Concurrency.__module__ = "a2trio"
Throttle.__module__ = "a2trio"
