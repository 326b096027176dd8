"""The telemetry seam: spans with the seed's names and attribute keys.

Spans: ``a2.append``, ``a2.state``, ``a2.drain``, ``a2.event``. Attributes use
the seed's keys (``a2.contract``, ``a2.session_id``, ``a2.event.outcome``,
``a2.event.aborted``, ``a2.drain.outcome`` ...). The default does nothing; an
OpenTelemetry adapter implements :class:`Telemetry` in a few lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

__all__ = ["NOOP_TELEMETRY", "AttributeValue", "Span", "Telemetry"]

AttributeValue = str | int | float | bool


class Span(Protocol):
    """A live span: attributes and recorded errors."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def record_error(self, error: BaseException) -> None: ...


class Telemetry(Protocol):
    """Opens spans. ``span`` is a context manager; an exception escaping the block
    is the span's error."""

    def span(
        self, name: str, attributes: Mapping[str, AttributeValue]
    ) -> AbstractContextManager[Span]: ...


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
    def span(self, name: str, attributes: Mapping[str, AttributeValue]) -> _NoopSpan:
        return _NOOP_SPAN


NOOP_TELEMETRY: Telemetry = _NoopTelemetry()
