"""``GET /_a2/metrics``: the Prometheus text exposition of the mounted servers'
:class:`~a2trio.metrics.PrometheusMetrics`. Mounted by ``asgi(...,
metrics=True)``, which needs ``prometheus_client`` (the ``metrics`` extra).

Each scrape is authorized first, as a
:class:`~a2trio.transport.MetricsOperation` (refused without a policy that
allows it, like the inspector's reads). Then each observed server's backlog
is read (at most once per :data:`~a2trio.engine.gauges.DEPTH_MAX_AGE_S`, and
bounded: :mod:`a2trio.engine.gauges`), and every distinct metrics object of
the mounted servers is written by ``prometheus_client``'s own exposition
(``generate_latest``), with the app's open sockets as
``a2trio_live_sockets``. A server built without :class:`PrometheusMetrics`
shows nothing here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Final

from ...metrics import PrometheusMetrics, require_prometheus_client
from ...server import Server
from .auth import Authorize, MetricsOperation, Request, check_authorized
from .http import Refusal, Send

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["serve_metrics"]

_CONTENT_TYPE: Final = b"text/plain; version=0.0.4; charset=utf-8"


class _Scrape:
    """A one-scrape collector over the servers' metrics (prometheus_client's
    ``Collector`` protocol)."""

    def __init__(self, metrics: list[PrometheusMetrics], sockets: int) -> None:
        self.metrics = metrics
        self.sockets = sockets

    def collect(self) -> Iterator[Metric]:
        for position, metrics in enumerate(self.metrics):
            # The app's sockets once, with the first metrics' series.
            yield from metrics.collect(sockets=self.sockets if position == 0 else None)


def metrics_of(servers: Mapping[str, Server]) -> list[PrometheusMetrics]:
    """The distinct :class:`PrometheusMetrics` of ``servers`` (several
    servers may share one)."""
    found: list[PrometheusMetrics] = []
    for server in servers.values():
        metrics = server.metrics
        if isinstance(metrics, PrometheusMetrics) and not any(metrics is m for m in found):
            found.append(metrics)
    return found


async def serve_metrics(
    servers: Mapping[str, Server],
    authorize: Authorize | None,
    request: Request,
    send: Send,
    *,
    sockets: int,
) -> None:
    """Answer ``GET /_a2/metrics`` (``sockets``: the app's open sockets).

    Raises:
      Refusal / A2Error: a method other than GET, a refusal by ``authorize``,
        a store failure while reading the backlog (the caller answers the
        envelope).

    Cancellation: a read; nothing to undo.
    """
    if request.method not in ("GET", "HEAD"):
        raise Refusal(405, "the metrics route takes GET")
    await check_authorized(authorize, request, MetricsOperation())
    require_prometheus_client()
    from prometheus_client import CollectorRegistry, generate_latest

    found = metrics_of(servers)
    for metrics in found:
        for gauges in metrics.gauges:
            await gauges.read_depth()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(found, sockets))
    body = generate_latest(registry)
    headers = [(b"content-type", _CONTENT_TYPE), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if request.method == "HEAD" else body})
