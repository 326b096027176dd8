"""The telemetry seam: spans with the seed's names and attribute keys.

Spans: ``a2.append``, ``a2.state``, ``a2.drain``, ``a2.event``. Attributes use
the seed's keys (``a2.contract``, ``a2.session_id``, ``a2.event.outcome``,
``a2.event.aborted``, ``a2.drain.outcome`` ...). The default does nothing; an
OpenTelemetry adapter implements :class:`Telemetry` in a few lines.

Metrics go through the same seam: a server built with ``metrics=`` (a
:class:`Metrics`: :class:`a2trio.metrics.PrometheusMetrics` for
``/_a2/metrics``, :class:`a2trio.otel.OpenTelemetryMetrics` for an
OpenTelemetry meter) reports each append, attempt, engine store call and
scheduler delivery to it, and registers its gauges (live feeds, pending
depth) with :meth:`Metrics.observe`. Without one the engine skips every call
(one ``is None`` test per site). Each call runs on the hot path: an
implementation only bumps in-process numbers, never does I/O or locks.

Traces cross processes through the store. Inside its ``a2.append`` span an
append asks :meth:`Telemetry.trace_context` for the current span's context and
stores it with each event (``trace_context``); whoever runs the event's handler,
in this process or another, opens its ``a2.event`` with that context as
``parent``. An HTTP push passes the request's ``traceparent`` and
``tracestate`` headers as the ``a2.append``'s parent. A trace context is the
W3C Trace Context headers as a JSON object (:func:`encode_trace_context`), so
any telemetry, and any process, reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Literal, Protocol

import msgspec

__all__ = [
    "DEPTH_SERIES",
    "MAX_TRACE_HEADER",
    "NOOP_TELEMETRY",
    "TRACE_HEADERS",
    "AttemptOutcome",
    "AttributeValue",
    "Depth",
    "Gauges",
    "Metrics",
    "Span",
    "Telemetry",
    "decode_trace_context",
    "encode_trace_context",
    "trace_id_of",
]

AttributeValue = str | int | float | bool

#: The W3C Trace Context headers a trace context carries.
TRACE_HEADERS = ("traceparent", "tracestate")
#: Longest header value kept. A ``traceparent`` is 55 characters; W3C asks
#: that at least 512 characters of ``tracestate`` be propagated.
MAX_TRACE_HEADER = 512

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(dict[str, str]).decode


def encode_trace_context(headers: Mapping[str, str]) -> str | None:
    """The trace context in ``headers`` (lower-cased names: ``traceparent``,
    optionally ``tracestate``) as stored with an event; None without a
    ``traceparent``. Other headers and values longer than
    :data:`MAX_TRACE_HEADER` are left out: trace headers come from clients and
    must never fail a request or grow a row. The values are not parsed; the
    telemetry that reads them ignores a malformed one."""
    traceparent = headers.get("traceparent")
    if not traceparent or len(traceparent) > MAX_TRACE_HEADER:
        return None
    kept = {"traceparent": traceparent}
    tracestate = headers.get("tracestate")
    if tracestate and len(tracestate) <= MAX_TRACE_HEADER:
        kept["tracestate"] = tracestate
    return _encode(kept).decode()


def decode_trace_context(trace_context: str | None) -> dict[str, str]:
    """The W3C headers of a stored trace context: ``{}`` for None or for
    anything that is not one (a row from another writer), never an error."""
    if trace_context is None:
        return {}
    try:
        headers = _decode(trace_context)
    except msgspec.DecodeError:  # malformed JSON, or not an object of strings
        return {}
    return {name: value for name, value in headers.items() if name in TRACE_HEADERS}


def trace_id_of(trace_context: str | None) -> str | None:
    """The W3C trace id (32 hex digits) in a stored trace context's
    ``traceparent``, or None: no context, or not a valid one."""
    traceparent = decode_trace_context(trace_context).get("traceparent", "")
    parts = traceparent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    trace_id = parts[1].lower()
    if trace_id == "0" * 32 or any(c not in "0123456789abcdef" for c in trace_id):
        return None
    return trace_id


class Span(Protocol):
    """A live span: attributes and recorded errors."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def record_error(self, error: BaseException) -> None: ...


class Telemetry(Protocol):
    """Opens spans and carries their context across processes."""

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        *,
        parent: str | None = None,
    ) -> AbstractContextManager[Span]:
        """Open span ``name``: a context manager; an exception escaping the
        block is the span's error. ``parent`` is a trace context (the event's
        stored one, a request's headers) that the span continues: its parent
        unless the current span is already in that trace (then the current
        span is the nearer parent)."""
        ...

    def trace_context(self) -> str | None:
        """The current span's trace context to store with an event
        (:func:`encode_trace_context`'s encoding), or None: then nothing is
        stored."""
        ...


#: How an attempt ended, as metrics label it: ``completed`` (an abort that
#: landed or was requested is ``aborted``), ``failed`` (a handler's timeout is
#: ``timed_out``), ``dead_lettered``, ``superseded``, ``surrendered`` (its
#: lease lapsed or the store could not record the outcome).
AttemptOutcome = Literal[
    "completed",
    "aborted",
    "failed",
    "timed_out",
    "dead_lettered",
    "superseded",
    "surrendered",
    "suspended",
]


class Depth(msgspec.Struct, frozen=True):
    """A contract's backlog as its store tells it, read at most every few
    seconds (``a2trio.engine.gauges``).

    Attributes:
      pending: events not yet processed nor dead-lettered (claimed or failed
        ones awaiting a retry included), over the sessions read.
      dead_letters: dead-lettered events, over the sessions read.
      sessions_pending: sessions holding a pending event.
      claimable_sessions: sessions holding work a claim would take now (the
        store's sweep; None without that capability).
      pending_age_s: seconds since the least recently written session with a
        pending event was last written: a lower bound of the oldest pending
        event's age (0 with nothing pending).
      complete: every session was read (False: past the read's bound, the
        counts cover the first sessions only).
    """

    pending: int
    dead_letters: int
    sessions_pending: int
    claimable_sessions: int | None
    pending_age_s: float
    complete: bool


#: The backlog gauges: (name without its unit, unit, meaning, reading);
#: one table for :mod:`a2trio.metrics` and :class:`a2trio.otel.OpenTelemetryMetrics`.
DEPTH_SERIES: list[tuple[str, str, str, Callable[[Depth], float | None]]] = [
    (
        "a2trio_pending_events",
        "",
        "Events not yet processed nor dead-lettered.",
        lambda depth: depth.pending,
    ),
    ("a2trio_dead_letters", "", "Dead-lettered events now.", lambda depth: depth.dead_letters),
    (
        "a2trio_sessions_pending",
        "",
        "Sessions holding a pending event.",
        lambda depth: depth.sessions_pending,
    ),
    (
        "a2trio_claimable_sessions",
        "",
        "Sessions holding work a claim would take now.",
        lambda depth: depth.claimable_sessions,
    ),
    (
        "a2trio_pending_age",
        "s",
        "Since the least recently written session with pending work was written.",
        lambda depth: depth.pending_age_s,
    ),
]


class Gauges(Protocol):
    """What one server shows when its metrics are read (registered with
    :meth:`Metrics.observe` while it is open)."""

    @property
    def contract(self) -> str:
        """The server's contract (the ``contract`` label)."""
        ...

    def live_feeds(self) -> int:
        """Readers of the server's shared session feeds now (SSE streams,
        socket subscriptions, ``session.stream()``)."""
        ...

    def depth(self) -> Depth | None:
        """The backlog last read, or None before the first read (or on a store
        without inspection). Never does I/O."""
        ...

    async def read_depth(self) -> Depth | None:
        """The backlog, read from the store unless the last read is recent
        (its bounded cost: ``a2trio.engine.gauges``).

        Cancellation: a read; nothing to undo."""
        ...


class Metrics(Protocol):
    """Where a server's numbers go (see the module docstring). Every method
    but :meth:`observe` is called on the hot path and must not block."""

    def appended(self, contract: str, event_type: str, source: str) -> None:
        """One event was appended (``source``: ``external`` or ``handler``)."""
        ...

    def attempt_ended(
        self, contract: str, event_type: str, outcome: AttemptOutcome, seconds: float
    ) -> None:
        """A handler attempt ended after ``seconds`` of the handler's own time."""
        ...

    def store_call(self, operation: str, seconds: float, *, failed: bool) -> None:
        """One of the engine's store calls (``append``, ``claim``, ``complete``,
        ``fail``, ``renew``) took ``seconds``; ``failed`` if it raised."""
        ...

    def scheduler_lag(self, contract: str, seconds: float) -> None:
        """A scheduler task was delivered ``seconds`` after it was due."""
        ...

    def observe(self, gauges: Gauges) -> Callable[[], None]:
        """Show ``gauges`` with the metrics until the returned function is called."""
        ...


class _NoopSpan:
    """A span that records nothing; also its own (re-entrant) context manager,
    so the default telemetry costs one attribute lookup per span."""

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass

    def record_error(self, error: BaseException) -> None:
        pass

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_NOOP_SPAN = _NoopSpan()


class _NoopTelemetry:
    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        *,
        parent: str | None = None,
    ) -> _NoopSpan:
        return _NOOP_SPAN

    def trace_context(self) -> None:
        return None


NOOP_TELEMETRY: Telemetry = _NoopTelemetry()
