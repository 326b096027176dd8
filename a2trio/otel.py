"""OpenTelemetry tracing: a :class:`~a2trio.Telemetry` that opens real spans.

Install the extra (``pip install 'a2trio[otel]'``, which brings
``opentelemetry-api``), configure an SDK as usual, and pass the adapter to the
server::

    from a2trio.otel import OpenTelemetry

    server = a2trio.Server(contract, store=..., telemetry=OpenTelemetry())

Spans keep the seed's names (``a2.append``, ``a2.state``, ``a2.drain``,
``a2.event``) and attribute keys (``a2.contract``, ``a2.session_id``,
``a2.event.outcome``, ``a2.event.aborted``, ``a2.drain.outcome`` ...), exactly
as the engine passes them.

Theory of operation: each span is started as the *current* span, in
OpenTelemetry's context, which lives in a :mod:`contextvars` variable. Trio
gives every task its own context, copied from the task that spawns it at the
moment it spawns it (``nursery.start_soon`` copies the caller's context, not
the nursery owner's). So a span is the parent of the spans opened in its block
and of the spans opened by tasks spawned inside its block, whichever nursery
they run in: an ``a2.event`` is a child of its ``a2.drain`` although the event
runs in a child task of the drain's nursery, an append from a handler is a
child of the handler's ``a2.event``, and the drain that an append starts is a
child of that ``a2.append`` (the seed: "the drain it schedules is created in
the append's active context"). Two tasks never share a current span, so
concurrent drains never mix. Detaching restores the context the span found,
in the task that opened it.

Errors: :meth:`Span.record_error` and an exception escaping a span's block
both record the exception (an ``exception`` span event) and set the span's
status to ``ERROR`` (described by the first error); an exception recorded and
then re-raised is recorded once. Trio's ``Cancelled`` escaping a block (the
server closing under a drain, a caller's deadline) is not an error: the span
ends with status ``UNSET`` and no exception event. The engine reports its own
cancellations as attributes (``a2.event.outcome = "surrendered"``,
``a2.event.aborted``), never as errors. An exception group is an error when it
holds anything besides ``Cancelled``.

Across processes: :meth:`OpenTelemetry.trace_context` is the current span's
W3C Trace Context (``traceparent``, ``tracestate``), which the engine stores
with each event it appends. A span opened with a ``parent`` (an ``a2.event``
with its event's stored context, an ``a2.append`` with an HTTP push's
headers) continues that trace: its parent is the remote span, and the span
that was current (the drain running the event) becomes a span link. When the
current span is already in the parent's trace (the drain that the append
itself started, in the same process) the current span stays the parent, so
in-process traces keep the nesting above. W3C Trace Context is used whatever
the global propagator is; baggage is not carried.

Metrics: :class:`OpenTelemetryMetrics` is a :class:`~a2trio.telemetry.Metrics`
over an OpenTelemetry meter (the global meter provider by default)::

    from a2trio.otel import OpenTelemetryMetrics

    server = a2trio.Server(contract, store=..., metrics=OpenTelemetryMetrics())

Its instruments are the series ``/_a2/metrics`` shows (``docs/operations.md``,
"Metrics"), named as OpenTelemetry names them: no ``_total`` and no unit in
the name (``a2trio_events_appended``, ``a2trio_handler_duration`` in ``s``),
which an OpenTelemetry Prometheus exporter turns back into
``a2trio_events_appended_total`` and ``a2trio_handler_duration_seconds``.
Counters and histograms are recorded as the engine reports; the gauges (live
feeds, the backlog) are observable, read by the SDK's reader from each open
server's last backlog read (the server reads it every
:data:`~a2trio.engine.gauges.DEPTH_POLL_S`), never from the store.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import trio

from .telemetry import (
    DEPTH_SERIES,
    AttemptOutcome,
    AttributeValue,
    Depth,
    Gauges,
    Span,
    decode_trace_context,
    encode_trace_context,
)

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:
    raise ImportError(
        "a2trio.otel needs the OpenTelemetry API: install the `otel` extra "
        "(pip install 'a2trio[otel]')"
    ) from exc

__all__ = ["OpenTelemetry", "OpenTelemetryMetrics"]

_W3C = TraceContextTextMapPropagator()


def _library_version() -> str | None:
    """a2trio's installed version, reported as the tracer's instrumentation
    scope version; None when running from a source tree that is not installed."""
    try:
        return importlib.metadata.version("a2trio")
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_error(exc: BaseException) -> bool:
    """Whether an exception escaping a span's block is the span's error:
    cancellation is not, nor a group of cancellations."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is not None
    return not isinstance(exc, trio.Cancelled)


class _OtelSpan:
    """The engine's view of one OpenTelemetry span (:class:`~a2trio.telemetry.Span`)."""

    __slots__ = ("_errored", "_recorded", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._errored = False
        self._recorded: list[BaseException] = []

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.span.set_attribute(key, value)

    def record_error(self, error: BaseException) -> None:
        if any(error is seen for seen in self._recorded):
            return
        self._recorded.append(error)
        self.span.record_exception(error)
        if not self._errored:
            self._errored = True
            self.span.set_status(
                trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )


class OpenTelemetry:
    """Opens OpenTelemetry spans for the engine (see the module docstring).

    Args:
      tracer_provider: where spans go; by default the global provider
        (``opentelemetry.trace.set_tracer_provider``), looked up when each span
        starts, so the adapter may be built before the SDK is configured.
      tracer_name: the instrumentation scope's name, ``"a2trio"`` by default;
        its version is a2trio's.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        tracer_name: str = "a2trio",
    ) -> None:
        self.tracer = trace.get_tracer(
            tracer_name, _library_version(), tracer_provider=tracer_provider
        )

    @contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        *,
        parent: str | None = None,
    ) -> Iterator[Span]:
        """Start ``name`` as the current span with ``attributes``, continuing
        ``parent``'s trace (see the module docstring), yield it, and end it
        when the block exits; an exception escaping the block is recorded as
        its error unless it is Trio's cancellation."""
        context, links = _continuing(parent) if parent is not None else (None, None)
        otel_span = self.tracer.start_span(
            name, context=context, attributes=attributes, links=links
        )
        wrapper = _OtelSpan(otel_span)
        token = otel_context.attach(trace.set_span_in_context(otel_span))
        try:
            yield wrapper
        except BaseException as exc:
            if _is_error(exc):
                wrapper.record_error(exc)
            raise
        finally:
            otel_context.detach(token)
            otel_span.end()

    def trace_context(self) -> str | None:
        """The current span's W3C Trace Context, encoded to store with an
        event; None without a valid current span (no SDK configured, say)."""
        headers: dict[str, str] = {}
        _W3C.inject(headers)
        return encode_trace_context(headers)


def _continuing(parent: str) -> tuple[otel_context.Context | None, list[trace.Link] | None]:
    """Where a span continuing ``parent`` starts, and its links: the remote
    span as its parent with the current span linked, or (None, None) for the
    current context when ``parent`` is invalid or the current span is
    already in its trace."""
    current = otel_context.get_current()
    remote = _W3C.extract(decode_trace_context(parent), context=current)
    remote_span = trace.get_current_span(remote).get_span_context()
    here = trace.get_current_span(current).get_span_context()
    if not remote_span.is_valid or remote_span.trace_id == here.trace_id:
        return None, None
    return remote, [trace.Link(here)] if here.is_valid else None


class OpenTelemetryMetrics:
    """The engine's numbers as OpenTelemetry instruments (see the module
    docstring).

    Args:
      meter_provider: where measurements go; by default the global provider
        (``opentelemetry.metrics.set_meter_provider``).
      meter_name: the instrumentation scope's name, ``"a2trio"`` by default;
        its version is a2trio's.
    """

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        meter_name: str = "a2trio",
    ) -> None:
        meter = metrics.get_meter(
            meter_name, _library_version() or "", meter_provider=meter_provider
        )
        self._observed: list[Gauges] = []
        self._appended = meter.create_counter(
            "a2trio_events_appended", description="Events appended."
        )
        self._attempts = meter.create_counter(
            "a2trio_handler_attempts", description="Handler attempts ended, by outcome."
        )
        self._dead = meter.create_counter(
            "a2trio_dead_lettered", description="Events dead-lettered by this process's attempts."
        )
        self._durations = meter.create_histogram(
            "a2trio_handler_duration", unit="s", description="The handler's own time per attempt."
        )
        self._store = meter.create_histogram(
            "a2trio_store_call_duration", unit="s", description="The engine's store calls."
        )
        self._store_errors = meter.create_counter(
            "a2trio_store_call_errors", description="The engine's store calls that raised."
        )
        self._lag = meter.create_histogram(
            "a2trio_scheduler_lag",
            unit="s",
            description="How late scheduler tasks were delivered.",
        )
        meter.create_observable_gauge(
            "a2trio_live_feeds",
            callbacks=[self._feeds],
            description="Readers of the shared session feeds.",
        )
        for name, unit, description, read in DEPTH_SERIES:
            meter.create_observable_gauge(
                name, callbacks=[self._depth_callback(read)], unit=unit, description=description
            )

    def appended(self, contract: str, event_type: str, source: str) -> None:
        self._appended.add(1, {"contract": contract, "type": event_type, "source": source})

    def attempt_ended(
        self, contract: str, event_type: str, outcome: AttemptOutcome, seconds: float
    ) -> None:
        labels = {"contract": contract, "type": event_type}
        self._attempts.add(1, {**labels, "outcome": outcome})
        self._durations.record(seconds, labels)
        if outcome == "dead_lettered":
            self._dead.add(1, labels)

    def store_call(self, operation: str, seconds: float, *, failed: bool) -> None:
        labels = {"operation": operation}
        self._store.record(seconds, labels)
        if failed:
            self._store_errors.add(1, labels)

    def scheduler_lag(self, contract: str, seconds: float) -> None:
        self._lag.record(seconds, {"contract": contract})

    def observe(self, gauges: Gauges) -> Callable[[], None]:
        self._observed.append(gauges)
        return lambda: self._observed.remove(gauges)

    def _feeds(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [
            metrics.Observation(gauges.live_feeds(), {"contract": gauges.contract})
            for gauges in list(self._observed)
        ]

    def _depth_callback(
        self, read: Callable[[Depth], float | None]
    ) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        def observed(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            found = []
            for gauges in list(self._observed):
                depth = gauges.depth()
                value = None if depth is None else read(depth)
                if value is not None:
                    found.append(metrics.Observation(value, {"contract": gauges.contract}))
            return found

        return observed
