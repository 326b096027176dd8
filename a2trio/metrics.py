"""In-process metrics for Prometheus: the numbers ``/_a2/metrics`` shows.

Build one and pass it to each server, then mount the endpoint::

    from a2trio.metrics import PrometheusMetrics

    metrics = PrometheusMetrics()
    server = a2trio.Server(contract, store=..., metrics=metrics)
    app = asgi(server, authorize=..., metrics=True)

Counting costs a dictionary update per call (a tuple key and an integer): no
lock (a server's calls all come from its Trio thread), no I/O, nothing else
allocated. Histograms keep fixed bucket counts. ``prometheus_client`` (the
``metrics`` extra) is needed only to write the exposition, when
:meth:`PrometheusMetrics.collect` runs, so a core install counts and serves
everything else. The series are listed in ``docs/operations.md`` ("Metrics").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .telemetry import DEPTH_SERIES, AttemptOutcome, Gauges

if TYPE_CHECKING:
    from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

__all__ = [
    "DEFAULT_BUCKETS",
    "LAG_BUCKETS",
    "STORE_BUCKETS",
    "PrometheusMetrics",
    "require_prometheus_client",
]

#: Handler durations, in seconds: from a millisecond to a minute (handlers
#: run from microseconds to a lease's length; past 60 s is +Inf).
DEFAULT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Store round trips, in seconds: 100 µs (memory, SQLite) to 5 s (a stalled backend).
STORE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
    5.0,
)
#: Scheduler lag, in seconds: a watchdog's slot is a second wide; minutes mean trouble.
LAG_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def require_prometheus_client() -> None:
    """Raise ImportError naming the ``metrics`` extra unless ``prometheus_client``
    can be imported."""
    try:
        import prometheus_client  # noqa: F401 - only checked
    except ImportError as exc:
        raise ImportError(
            "the metrics endpoint needs prometheus_client: install the `metrics` extra "
            "(pip install 'a2trio[metrics]')"
        ) from exc


class _Histogram:
    """Bucket counts (the last is +Inf, not cumulative), their sum and count."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((repr(float(bound)), running))
        buckets.append(("+Inf", running + self.counts[-1]))
        return buckets


class PrometheusMetrics:
    """A :class:`~a2trio.telemetry.Metrics` that keeps its numbers in this
    process for Prometheus to scrape (see the module docstring). One may
    serve several servers: every series is labelled by contract.

    Args:
      buckets: the handler duration histogram's upper bounds, in seconds
        (:data:`DEFAULT_BUCKETS`).
    """

    def __init__(self, *, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"`buckets` must be increasing and not empty, got {buckets!r}")
        self._buckets = tuple(float(b) for b in buckets)
        self._appended: dict[tuple[str, str, str], int] = {}
        self._attempts: dict[tuple[str, str, str], int] = {}
        self._durations: dict[tuple[str, str], _Histogram] = {}
        self._store: dict[str, _Histogram] = {}
        self._store_errors: dict[str, int] = {}
        self._lag: dict[str, _Histogram] = {}
        self._gauges: list[Gauges] = []

    # -- the hot path (telemetry.Metrics) ------------------------------------------

    def appended(self, contract: str, event_type: str, source: str) -> None:
        key = (contract, event_type, source)
        counts = self._appended
        counts[key] = counts.get(key, 0) + 1

    def attempt_ended(
        self, contract: str, event_type: str, outcome: AttemptOutcome, seconds: float
    ) -> None:
        key = (contract, event_type, outcome)
        counts = self._attempts
        counts[key] = counts.get(key, 0) + 1
        histogram = self._durations.get((contract, event_type))
        if histogram is None:
            histogram = self._durations[contract, event_type] = _Histogram(self._buckets)
        # _Histogram.observe, inlined: a call per attempt showed in the bench.
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.total += seconds

    def store_call(self, operation: str, seconds: float, *, failed: bool) -> None:
        histogram = self._store.get(operation)
        if histogram is None:
            histogram = self._store[operation] = _Histogram(STORE_BUCKETS)
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.total += seconds
        if failed:
            self._store_errors[operation] = self._store_errors.get(operation, 0) + 1

    def scheduler_lag(self, contract: str, seconds: float) -> None:
        histogram = self._lag.get(contract)
        if histogram is None:
            histogram = self._lag[contract] = _Histogram(LAG_BUCKETS)
        histogram.observe(seconds)

    def observe(self, gauges: Gauges) -> Callable[[], None]:
        self._gauges.append(gauges)
        return lambda: self._gauges.remove(gauges)

    # -- reading -----------------------------------------------------------------

    @property
    def gauges(self) -> list[Gauges]:
        """The servers observed now (open servers built with these metrics)."""
        return list(self._gauges)

    def collect(self, *, sockets: int | None = None) -> Iterator[Metric]:
        """Every series as ``prometheus_client`` metric families, the gauges
        from each observed server's last depth read; ``sockets`` (the app's
        open sockets) adds ``a2trio_live_sockets``.

        Raises:
          ImportError: ``prometheus_client`` is not installed (the ``metrics`` extra).
        """
        require_prometheus_client()
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        appended = CounterMetricFamily(
            "a2trio_events_appended",
            "Events appended, by contract, event type and source (external or handler).",
            labels=("contract", "type", "source"),
        )
        for labels, value in sorted(self._appended.items()):
            appended.add_metric(labels, value)
        yield appended
        attempts = CounterMetricFamily(
            "a2trio_handler_attempts",
            "Handler attempts ended, by contract, event type and outcome.",
            labels=("contract", "type", "outcome"),
        )
        for labels, value in sorted(self._attempts.items()):
            attempts.add_metric(labels, value)
        yield attempts
        dead = CounterMetricFamily(
            "a2trio_dead_lettered",
            "Events dead-lettered by this process's attempts, by contract and event type.",
            labels=("contract", "type"),
        )
        for (contract, event_type, outcome), value in sorted(self._attempts.items()):
            if outcome == "dead_lettered":
                dead.add_metric((contract, event_type), value)
        yield dead
        yield _histogram(
            HistogramMetricFamily(
                "a2trio_handler_duration_seconds",
                "The handler's own time per attempt, by contract and event type.",
                labels=("contract", "type"),
            ),
            self._durations.items(),
        )
        yield _histogram(
            HistogramMetricFamily(
                "a2trio_store_call_duration_seconds",
                "The engine's store calls (append, claim, complete, fail, renew), by operation.",
                labels=("operation",),
            ),
            (((op,), h) for op, h in self._store.items()),
        )
        errors = CounterMetricFamily(
            "a2trio_store_call_errors",
            "The engine's store calls that raised, by operation.",
            labels=("operation",),
        )
        for operation in sorted(self._store):
            errors.add_metric((operation,), self._store_errors.get(operation, 0))
        yield errors
        yield _histogram(
            HistogramMetricFamily(
                "a2trio_scheduler_lag_seconds",
                "How late scheduler tasks were delivered, by contract.",
                labels=("contract",),
            ),
            (((c,), h) for c, h in self._lag.items()),
        )
        yield from _gauge_families(GaugeMetricFamily, self._gauges)
        if sockets is not None:
            live = GaugeMetricFamily("a2trio_live_sockets", "WebSocket connections open now.")
            live.add_metric((), sockets)
            yield live


def _histogram(
    family: HistogramMetricFamily, histograms: Iterable[tuple[tuple[str, ...], _Histogram]]
) -> HistogramMetricFamily:
    for labels, histogram in sorted(histograms, key=lambda item: item[0]):
        family.add_metric(list(labels), histogram.cumulative(), histogram.total)
    return family


def _gauge_families(
    family: type[GaugeMetricFamily], observed: list[Gauges]
) -> Iterator[GaugeMetricFamily]:
    """The observed servers' gauges, one family per series."""
    feeds = family(
        "a2trio_live_feeds", "Readers of the shared session feeds.", labels=("contract",)
    )
    for gauges in observed:
        feeds.add_metric((gauges.contract,), gauges.live_feeds())
    yield feeds
    depths = [(gauges.contract, gauges.depth()) for gauges in observed]
    for name, unit, documentation, read in DEPTH_SERIES:
        metric = family(
            name + ("_seconds" if unit == "s" else ""), documentation, labels=("contract",)
        )
        for contract, depth in depths:
            value = None if depth is None else read(depth)
            if value is not None:
                metric.add_metric((contract,), value)
        yield metric
