"""When a handler's attempts may start: its retry policy and backoff, and
its debounce.

:class:`Retry` says how many failed attempts a handler gets and how long
each retry waits (issue 33). A backoff's wait becomes the failure's stored
not-before (``Store.fail_attempt(retry_after_ms=...)``, ``rules.ripe``), so
no claim in any process retries the event before it; the server arms a
drain for that instant (``Watchdogs.wake``).

:class:`Debounce` runs only the last event of a key once its period passed
without a newer one. An event appended for a debounced handler carries its
key (resolved at append, as a lane function is) and the period as its delay
(``AppendEvent.debounce_key``, ``delay_ms``): the store writes it not before
``now + period`` and, in the same transaction, settles the earlier events
of the same type and key in the session that are alive and not running as
skipped by it (``rules.debounces``). A key that raises or returns a
non-string leaves the event undebounced at append; the attempt that runs it
resolves the key again and dead-letters the event with the error
(:class:`DebounceKeyError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..backoff import Backoff
from ..contract import AppendInput

__all__ = ["BackoffFn", "Debounce", "DebounceKeyError", "KeyFn", "Retry", "check_timeout"]

#: ``key(event) -> str``: a debounced event's key (an :class:`~a2trio.AppendInput`
#: with the typed payload), resolved when it is appended.
KeyFn = Callable[[AppendInput], str]

#: ``backoff=`` as a function: the failure's number (1 after the first
#: failure) -> seconds to wait before the next attempt.
BackoffFn = Callable[[int], float]


class Retry:
    """A handler's retry policy: ``a2trio.handler(fn, retry=a2trio.Retry(3))``.

    A failed attempt (the handler raised, or ran past its ``timeout``) is
    retried until ``max_attempts`` attempts have failed; that failure
    dead-letters the event, and its lane stays blocked behind it until
    redriven. An attempt that did not fail (its lease lapsed, it was
    superseded, the server shut down) spends none. A handler without
    ``retry=`` dead-letters at the server's ``Timings.max_failures``.

    Without ``backoff`` a retry follows the seed's rule: the sweep waits out
    :data:`a2trio.stores.rules.EVENT_RETRY` (1 s, doubling, at most a
    minute), and a drain running anyway may retry sooner. With one, the
    failure stores its retry-at and no attempt starts before it, in any
    process; the server wakes a drain then (with a scheduler: on time; else
    its sweep finds it within ``Timings.sweep_s``).

    Args:
      max_attempts: failed attempts before the event is dead-lettered (1: no
        retry).
      backoff: how long to wait before each retry: a
        :class:`~a2trio.backoff.Backoff` (its ``delay(n)`` after the n-th
        failure; ``a2trio.stores.rules.EVENT_RETRY`` holds the seed's schedule
        exactly) or a function ``n -> seconds``. None: the seed's rule above.
      non_retryable: exception classes that dead-letter the event on its first
        failure (``isinstance``; an exception group does when every exception
        in it is one). Timeouts raise :class:`TimeoutError`, so
        ``non_retryable=(TimeoutError,)`` gives a timed-out event up at once.

    Raises:
      ValueError: ``max_attempts`` is below 1.
      TypeError: ``max_attempts`` is not an int, ``backoff`` is neither a
        ``Backoff`` nor a function, or ``non_retryable`` is not a tuple of
        exception classes.
    """

    __slots__ = ("backoff", "max_attempts", "non_retryable")

    def __init__(
        self,
        max_attempts: int = 10,
        *,
        backoff: Backoff | BackoffFn | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
    ) -> None:
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool):
            raise TypeError(f"Retry(max_attempts=...) must be an int, got {max_attempts!r}")
        if max_attempts < 1:
            raise ValueError(f"Retry(max_attempts=...) must be at least 1, got {max_attempts!r}")
        if backoff is not None and not isinstance(backoff, Backoff) and not callable(backoff):
            raise TypeError(
                "Retry(backoff=...) must be an a2trio.backoff.Backoff or a function "
                f"failure number -> seconds, got {backoff!r}"
            )
        if not isinstance(non_retryable, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in non_retryable
        ):
            raise TypeError(
                "Retry(non_retryable=...) must be a tuple of exception classes, "
                f"got {non_retryable!r}"
            )
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.non_retryable = non_retryable

    def retryable(self, error: BaseException) -> bool:
        """False if ``error`` dead-letters at once (see ``non_retryable``)."""
        if not self.non_retryable:
            return True
        if isinstance(error, BaseExceptionGroup):
            _, rest = error.split(self.non_retryable)
            return rest is not None
        return not isinstance(error, self.non_retryable)

    def retry_after_ms(self, failures: int) -> int | None:
        """How long after its ``failures``-th failure the event waits, in ms
        (None without a ``backoff``: the seed's rule).

        Raises:
          ValueError: the backoff function returned no finite, non-negative
            number of seconds (or raised: its exception is the cause).
        """
        if self.backoff is None:
            return None
        try:
            if isinstance(self.backoff, Backoff):
                seconds: object = self.backoff.delay(failures)
            else:
                seconds = self.backoff(failures)
        except Exception as exc:
            raise ValueError(f"Retry(backoff=...) raised for failure {failures}: {exc!r}") from exc
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (math.isfinite(seconds) and seconds >= 0)
        ):
            raise ValueError(
                f"Retry(backoff=...) must give a finite, non-negative number of seconds, "
                f"got {seconds!r} for failure {failures}"
            )
        return round(seconds * 1000)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Retry):
            return NotImplemented
        return (self.max_attempts, self.backoff, self.non_retryable) == (
            other.max_attempts,
            other.backoff,
            other.non_retryable,
        )

    def __hash__(self) -> int:
        return hash((self.max_attempts, self.non_retryable))

    def __repr__(self) -> str:
        kinds = ", ".join(kind.__name__ for kind in self.non_retryable)
        more = f", non_retryable=({kinds}{',' if len(self.non_retryable) == 1 else ''})"
        backoff = "" if self.backoff is None else f", backoff={self.backoff!r}"
        return f"Retry({self.max_attempts}{backoff}{more if self.non_retryable else ''})"


class DebounceKeyError(TypeError):
    """A debounce key function raised or returned a non-string: the event
    is dead-lettered with this error (it never retries)."""


class Debounce:
    """Run only the last event of a key once ``period`` passed without a
    newer one: ``a2trio.handler(fn, debounce=a2trio.Debounce(2, key=lambda e:
    e.payload.doc))``.

    Each event appended for the handler waits ``period`` seconds (its stored
    not-before); an event of the same key appended meanwhile settles it as
    skipped (no attempt: ``skipped`` in inspection) and waits its own
    ``period``. An earlier event already running is left alone. The key's
    scope is the session: one append is one session's transaction, which is
    where the store can settle the earlier events atomically (an event of
    another session never debounces this one).

    Args:
      period: seconds of quiet before the last event runs (positive, finite).
      key: ``key(event) -> str`` (an :class:`~a2trio.AppendInput` with the
        typed payload), resolved when the event is appended; None: one key
        for the handler. A key that raises or returns a non-string
        dead-letters its event with the error.

    Raises:
      TypeError: ``period`` is not a number, or ``key`` is not callable.
      ValueError: ``period`` is not positive and finite.
    """

    __slots__ = ("key", "period")

    def __init__(self, period: float, key: KeyFn | None = None) -> None:
        if isinstance(period, bool) or not isinstance(period, int | float):
            raise TypeError(f"Debounce(period=...) must be a number of seconds, got {period!r}")
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(
                f"Debounce(period=...) must be a positive, finite number of seconds, got {period!r}"
            )
        if key is not None and not callable(key):
            raise TypeError(f"Debounce(key=...) must be a function of the event, got {key!r}")
        self.period = float(period)
        self.key = key

    @property
    def period_ms(self) -> int:
        """The period in whole milliseconds (at least 1)."""
        return max(1, round(self.period * 1000))

    def key_of(self, event: AppendInput) -> str:
        """``event``'s debounce key ("" when the handler has one key).

        Raises:
          DebounceKeyError: the key function raised or returned a non-string.
        """
        if self.key is None:
            return ""
        try:
            found: Any = self.key(event)
        except Exception as exc:
            raise DebounceKeyError(f"Debounce(key=...) raised for {event.type!r}: {exc!r}") from exc
        if not isinstance(found, str):
            raise DebounceKeyError(
                f"Debounce(key=...) must return a string for {event.type!r}, got {found!r}"
            )
        return found

    def __repr__(self) -> str:
        key = "" if self.key is None else f", key={getattr(self.key, '__name__', self.key)}"
        return f"Debounce({self.period}{key})"


Retry.__module__ = "a2trio"
Debounce.__module__ = "a2trio"


def check_timeout(timeout: float | None) -> float | None:
    """``timeout=`` as seconds (None: no limit).

    Raises:
      TypeError: not a number. ValueError: not positive and finite."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)
