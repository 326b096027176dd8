"""A :class:`~a2trio.Telemetry` that records spans for tests to assert on."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import trio

from ..telemetry import AttributeValue, Span, encode_trace_context

__all__ = ["RecordedSpan", "RecordingTelemetry"]


class RecordedSpan:
    """One span as the engine opened it.

    Attributes:
      name: ``a2.append``, ``a2.state``, ``a2.drain`` or ``a2.event``.
      attributes: the opening attributes plus every ``set_attribute`` since.
      errors: what the engine passed to ``record_error``, in order.
      error: the exception that escaped the span's block, if any.
      started_at / ended_at: Trio time (``ended_at`` is None while open).
      parent: the trace context the engine asked the span to continue (an
        ``a2.event``'s stored one, an HTTP push's headers), or None.
      context: the span's own trace context, what ``trace_context()`` returns
        inside it (a W3C ``traceparent`` in the trace of the span current when
        it opened, or in a new one).
      trace_id: the number in that ``traceparent``'s trace id: spans with
        equal ones are in one recorded trace.
    """

    __slots__ = (
        "attributes",
        "context",
        "ended_at",
        "error",
        "errors",
        "name",
        "parent",
        "started_at",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        parent: str | None,
        trace_id: int,
        span_id: int,
    ) -> None:
        self.name = name
        self.parent = parent
        self.trace_id = trace_id
        self.context = encode_trace_context(
            {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
        )
        self.attributes: dict[str, AttributeValue] = dict(attributes)
        self.errors: list[BaseException] = []
        self.error: BaseException | None = None
        self.started_at = trio.current_time()
        self.ended_at: float | None = None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def record_error(self, error: BaseException) -> None:
        self.errors.append(error)

    def matches(self, name: str, where: Mapping[str, AttributeValue]) -> bool:
        """Whether this span is called ``name`` and has every attribute in ``where``."""
        return self.name == name and all(
            key in self.attributes and self.attributes[key] == value for key, value in where.items()
        )

    def __repr__(self) -> str:
        return f"RecordedSpan({self.name!r}, {self.attributes!r})"


class RecordingTelemetry:
    """Records every span in the order it opened.

    Pass it as ``Server(telemetry=...)`` (the harness does), then query::

        [span] = telemetry.find("a2.event", {"a2.event.type": "ordered"})
        assert span.attributes["a2.event.outcome"] == "processed"

    Attribute keys contain dots, so filters are mappings rather than keywords.
    """

    def __init__(self) -> None:
        self.spans: list[RecordedSpan] = []
        self._open: Counter[str] = Counter()
        self._closed: dict[str, trio.Event] = {}
        self._ids = itertools.count(1)
        # Each telemetry its own: two in one test never see each other's spans.
        self._current: ContextVar[RecordedSpan | None] = ContextVar(
            f"a2trio_recorded_span_{id(self)}", default=None
        )

    @contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        *,
        parent: str | None = None,
    ) -> Iterator[Span]:
        current = self._current.get()
        trace_id = next(self._ids) if current is None else current.trace_id
        recorded = RecordedSpan(name, attributes, parent, trace_id, next(self._ids))
        self.spans.append(recorded)
        self._open[name] += 1
        token = self._current.set(recorded)
        try:
            yield recorded
        except BaseException as exc:
            recorded.error = exc
            raise
        finally:
            self._current.reset(token)
            recorded.ended_at = trio.current_time()
            self._open[name] -= 1
            if not self._open[name]:
                closed = self._closed.pop(name, None)
                if closed is not None:
                    closed.set()

    def trace_context(self) -> str | None:
        """The current recorded span's ``context`` (None outside every span)."""
        current = self._current.get()
        return None if current is None else current.context

    def open_count(self, name: str) -> int:
        """How many spans called ``name`` are open now."""
        return self._open[name]

    async def wait_all_closed(self, name: str) -> None:
        """Wait until no span called ``name`` is open, e.g. every ``a2.drain``,
        whoever started it (an append, a scheduler's watchdog, a test).

        Cancellation: a checkpoint; nothing to undo.
        """
        while self._open[name]:
            closed = self._closed.get(name)
            if closed is None:
                closed = self._closed[name] = trio.Event()
            await closed.wait()
        await trio.lowlevel.checkpoint()

    def find(
        self, name: str, where: Mapping[str, AttributeValue] | None = None
    ) -> list[RecordedSpan]:
        """Spans called ``name`` whose attributes include ``where``, oldest first."""
        return [s for s in self.spans if s.matches(name, where or {})]

    def one(self, name: str, where: Mapping[str, AttributeValue] | None = None) -> RecordedSpan:
        """The single span matching, or an ``AssertionError`` listing what was recorded."""
        found = self.find(name, where)
        if len(found) != 1:
            recorded = "\n  ".join(repr(s) for s in self.spans if s.name == name) or "(none)"
            raise AssertionError(
                f"expected exactly one {name!r} span with {dict(where or {})!r}, "
                f"found {len(found)}; recorded {name!r} spans:\n  {recorded}"
            )
        return found[0]

    def clear(self) -> None:
        """Forget every recorded span (open spans keep recording into their objects)."""
        self.spans.clear()
