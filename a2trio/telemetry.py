"""The telemetry seam: spans with the seed's names and attribute keys.

Spans: ``a2.append``, ``a2.state``, ``a2.drain``, ``a2.event``. Attributes use
the seed's keys (``a2.contract``, ``a2.session_id``, ``a2.event.outcome``,
``a2.event.aborted``, ``a2.drain.outcome`` ...). The default does nothing; an
OpenTelemetry adapter implements :class:`Telemetry` in a few lines.

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

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

import msgspec

__all__ = [
    "MAX_TRACE_HEADER",
    "NOOP_TELEMETRY",
    "TRACE_HEADERS",
    "AttributeValue",
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
