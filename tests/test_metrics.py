"""Metrics (issue 35): the engine's numbers through the telemetry seam, as
Prometheus text on ``/_a2/metrics`` (parsed by prometheus_client's own
parser) and as OpenTelemetry instruments (read through an in-memory reader);
nothing is counted, and nothing costs, without metrics."""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import a2trio
from a2trio.engine.gauges import DEPTH_MAX_AGE_S
from a2trio.metrics import PrometheusMetrics, require_prometheus_client
from a2trio.otel import OpenTelemetryMetrics
from a2trio.stores import memory
from a2trio.stores.memory import MemoryStore
from a2trio.transport import MetricsOperation, Operation, Request, asgi

from .apps import Ordered, Shipped, orders

OPERATOR = {"x-role": "operator"}


def _server(metrics: a2trio.Metrics | None) -> a2trio.Server:
    """``pen`` ships; ``flaky`` fails its first attempt; ``broken`` always
    fails, dead-lettered at its second failure."""

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        item = ctx.event.payload.item
        if item == "broken" or (item == "flaky" and ctx.attempt == 1):
            raise RuntimeError(f"no {item}")
        return orders.event("shipped", Shipped(item))

    return a2trio.Server(
        orders,
        store=memory(clock=a2trio.TrioClock()),
        handlers={"ordered": ship},
        timings=a2trio.Timings(max_failures=2),
        metrics=metrics,
        sweep=False,
    )


async def _run(server: a2trio.Server) -> None:
    """Three orders: a first drain runs them (pen ships, flaky and broken
    fail), a second retries the failures (flaky ships, broken is dead-lettered)."""
    await server.session("s1").append(
        orders.event("ordered", Ordered("pen")),
        orders.event("ordered", Ordered("flaky")),
        orders.event("ordered", Ordered("broken")),
    )
    await server.settle()
    await server.drain("s1")
    await server.settle()


def _policy(request: Request, op: Operation) -> bool:
    if isinstance(op, MetricsOperation):
        return request.headers.get("x-role") == "operator"
    return True


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        sample: Sample
        for sample in family.samples:
            found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def _at(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


async def test_the_endpoint_is_scraped_by_the_prometheus_parser(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = PrometheusMetrics()
    server = _server(metrics)
    app = asgi(server, authorize=_policy, metrics=True)
    transport = httpx.ASGITransport(app=app)
    async with server, httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        await _run(server)
        await trio.sleep(DEPTH_MAX_AGE_S)  # past the read the server made as it opened
        scraped = await c.get("/_a2/metrics", headers=OPERATOR)
        assert scraped.status_code == 200, scraped.text
        assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = _samples(scraped.text)
        c_ = {"contract": "orders"}
        assert (
            got[_at("a2trio_events_appended_total", **c_, type="ordered", source="external")] == 3
        )
        assert got[_at("a2trio_events_appended_total", **c_, type="shipped", source="handler")] == 2
        for outcome, count in (("completed", 2), ("failed", 2), ("dead_lettered", 1)):
            key = _at("a2trio_handler_attempts_total", **c_, type="ordered", outcome=outcome)
            assert got[key] == count, outcome
        assert got[_at("a2trio_dead_lettered_total", **c_, type="ordered")] == 1
        assert got[_at("a2trio_handler_duration_seconds_count", **c_, type="ordered")] == 5
        inf = _at("a2trio_handler_duration_seconds_bucket", **c_, type="ordered", le="+Inf")
        assert got[inf] == 5
        # One append; three completions (two with returned events) and three failures.
        assert got[_at("a2trio_store_call_duration_seconds_count", operation="append")] == 1
        assert got[_at("a2trio_store_call_duration_seconds_count", operation="complete")] == 2
        assert got[_at("a2trio_store_call_duration_seconds_count", operation="fail")] == 3
        assert got[_at("a2trio_store_call_errors_total", operation="fail")] == 0
        # The backlog, read at the scrape: broken is dead, nothing else pending.
        assert got[_at("a2trio_pending_events", **c_)] == 0
        assert got[_at("a2trio_dead_letters", **c_)] == 1
        assert got[_at("a2trio_sessions_pending", **c_)] == 0
        assert got[_at("a2trio_claimable_sessions", **c_)] == 0
        assert got[_at("a2trio_pending_age_seconds", **c_)] == 0
        assert got[_at("a2trio_live_feeds", **c_)] == 0
        assert got[_at("a2trio_live_sockets")] == 0
        assert not any(dict(labels).get("session") for _, labels in got), "no session labels"


async def test_the_backlog_is_read_at_most_every_few_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = _server(PrometheusMetrics())
    api = server.store.inspect
    assert api is not None
    listed = api.list_sessions
    reads: list[float] = []

    async def counted(**kwargs: Any) -> Any:
        reads.append(trio.current_time())
        return await listed(**kwargs)

    api.list_sessions = counted  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=asgi(server, authorize=_policy, metrics=True))
    async with server, httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        await server.session("s2").append(orders.event("ordered", Ordered("broken")))
        await server.settle()
        pending = _at("a2trio_sessions_pending", contract="orders")
        # The server's own read as it opened (at t=0) is fresh: scrapes reuse it.
        first = _samples((await c.get("/_a2/metrics", headers=OPERATOR)).text)[pending]
        await server.session("s3").append(orders.event("ordered", Ordered("broken")))
        await server.settle()
        assert _samples((await c.get("/_a2/metrics", headers=OPERATOR)).text)[pending] == first
        assert reads == [0]
        await trio.sleep(DEPTH_MAX_AGE_S)
        assert _samples((await c.get("/_a2/metrics", headers=OPERATOR)).text)[pending] == 2
        assert _samples((await c.get("/_a2/metrics", headers=OPERATOR)).text)[pending] == 2
        assert reads == [0, DEPTH_MAX_AGE_S]


async def test_a_scrape_is_refused_without_operator_rights() -> None:
    server = _server(PrometheusMetrics())
    async with server:
        no_policy = httpx.ASGITransport(app=asgi(server, metrics=True))
        async with httpx.AsyncClient(transport=no_policy, base_url="http://t") as c:
            refused = await c.get("/_a2/metrics", headers=OPERATOR)
            assert refused.status_code == 403
            assert refused.json()["error"]["message"] == (
                "inspection needs an authorize policy that allows MetricsOperation"
            )
        policed = httpx.ASGITransport(app=asgi(server, metrics=True, authorize=_policy))
        async with httpx.AsyncClient(transport=policed, base_url="http://t") as c:
            assert (await c.get("/_a2/metrics", headers={"x-role": "guest"})).status_code == 403
            assert (await c.post("/_a2/metrics", headers=OPERATOR)).status_code == 405
            assert (await c.get("/_a2/metrics", headers=OPERATOR)).status_code == 200
        off = httpx.ASGITransport(app=asgi(server, authorize=_policy))
        async with httpx.AsyncClient(transport=off, base_url="http://t") as c:
            assert (await c.get("/_a2/metrics", headers=OPERATOR)).status_code == 404


@pytest.fixture
def no_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("prometheus_client"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


@pytest.mark.usefixtures("no_prometheus_client")
def test_asking_for_the_endpoint_without_the_extra_names_it() -> None:
    message = (
        r"^the metrics endpoint needs prometheus_client: install the `metrics` extra "
        r"\(pip install 'a2trio\[metrics\]'\)$"
    )
    with pytest.raises(ImportError, match=message):
        require_prometheus_client()
    with pytest.raises(ImportError, match=message):
        asgi(_server(PrometheusMetrics()), metrics=True)
    asgi(_server(PrometheusMetrics()))  # the rest serves without it


async def test_otel_metrics_are_recorded_through_an_in_memory_reader(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    server = _server(OpenTelemetryMetrics(provider))
    async with server:
        await _run(server)
        # What a poll does (the reader's callbacks read its last result).
        await trio.sleep(DEPTH_MAX_AGE_S)
        await server.gauges.read_depth()
        data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "a2trio"
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)

    def counts(name: str, key: str) -> dict[str, int]:
        return {p.attributes[key]: p.value for p in points[name]}

    assert counts("a2trio_events_appended", "type") == {"ordered": 3, "shipped": 2}
    assert counts("a2trio_handler_attempts", "outcome") == {
        "completed": 2,
        "failed": 2,
        "dead_lettered": 1,
    }
    assert counts("a2trio_dead_lettered", "type") == {"ordered": 1}
    [duration] = points["a2trio_handler_duration"]
    assert duration.count == 5
    assert dict(duration.attributes) == {"contract": "orders", "type": "ordered"}
    store_calls = {p.attributes["operation"]: p.count for p in points["a2trio_store_call_duration"]}
    assert store_calls.items() >= {"append": 1, "complete": 2, "fail": 3}.items()
    assert counts("a2trio_dead_letters", "contract") == {"orders": 1}
    assert counts("a2trio_pending_events", "contract") == {"orders": 0}
    assert counts("a2trio_live_feeds", "contract") == {"orders": 0}


async def test_scheduler_lag_is_observed(autojump_clock: trio.testing.MockClock) -> None:
    metrics = PrometheusMetrics()
    server = _server(metrics)
    async with server:
        await trio.sleep(3)
        now_ms = server.clock.now_ms()
        await server.deliver(a2trio.DrainTask("orders", "s1", now_ms - 1500))
    text = "".join(
        line for family in metrics.collect() for line in _lines(family) if "scheduler_lag" in line
    )
    assert 'a2trio_scheduler_lag_seconds_count{contract="orders"} 1.0' in text
    assert 'a2trio_scheduler_lag_seconds_sum{contract="orders"} 1.5' in text


def _lines(family: Any) -> Iterator[str]:
    for sample in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
        yield f"{sample.name}{{{labels}}} {float(sample.value)}\n"


async def test_without_metrics_nothing_is_counted(autojump_clock: trio.testing.MockClock) -> None:
    watching = PrometheusMetrics()
    server = _server(None)
    assert server.metrics is None
    async with server:
        await _run(server)
        assert watching.gauges == []
    assert [s for family in watching.collect() for s in family.samples] == []


async def test_the_payments_example_shows_its_dead_letter(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("A2_STORE", "memory:")
    import examples.payments

    example = importlib.reload(examples.payments)  # its server on the memory store
    charge = {"charge_id": "c1", "cents": 1250, "card": "flaky"}
    transport = httpx.ASGITransport(app=example.app)  # a loopback client
    async with example.server, httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        pushed = await c.post(
            "/payments/acct-1", json={"events": [{"type": "charge", "payload": charge}]}
        )
        assert pushed.status_code == 200, pushed.text
        await example.server.settle()
        await trio.sleep(DEPTH_MAX_AGE_S)
        got = _samples((await c.get("/_a2/metrics")).text)
    assert got[_at("a2trio_dead_letters", contract="payments")] == 1
    dead = _at(
        "a2trio_handler_attempts_total", contract="payments", type="charge", outcome="dead_lettered"
    )
    assert got[dead] == 1


async def test_the_payments_example_serves_without_the_metrics_extra(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # The core install has no prometheus_client: the inspector's example
    # serves and inspects, without /_a2/metrics.
    monkeypatch.setenv("A2_STORE", "memory:")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    import examples.payments

    example = importlib.reload(examples.payments)
    transport = httpx.ASGITransport(app=example.app)
    async with example.server, httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.get("/_a2/inspect/payments?view=dead-letters")).status_code == 200
        assert (await c.get("/_a2/metrics")).status_code == 404


class _CompletionsDown(MemoryStore):
    """A memory store whose completions fail."""

    async def complete_attempt(self, *args: Any, **kwargs: Any) -> Any:
        await trio.lowlevel.checkpoint()
        raise a2trio.A2Error("STORE_UNAVAILABLE", "completions are down")


async def test_store_errors_and_live_feeds_are_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = PrometheusMetrics()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        pass

    server = a2trio.Server(
        orders,
        store=_CompletionsDown(clock=a2trio.TrioClock()),
        handlers={"ordered": ship},
        metrics=metrics,
        sweep=False,
    )
    async with server:
        session = server.session("s1")
        async with session.stream(), session.subscribe():
            assert server.gauges.live_feeds() == 2
            got = _samples(_exposition(metrics))
            assert got[_at("a2trio_live_feeds", contract="orders")] == 2
            await session.append(orders.event("ordered", Ordered("pen")))
            await server.settle()
        assert server.gauges.live_feeds() == 0
    got = _samples(_exposition(metrics))
    assert got[_at("a2trio_store_call_errors_total", operation="complete")] == 1
    assert got[_at("a2trio_store_call_errors_total", operation="append")] == 0
    surrendered = _at(
        "a2trio_handler_attempts_total", contract="orders", type="ordered", outcome="surrendered"
    )
    assert got[surrendered] == 1


def _exposition(metrics: PrometheusMetrics) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()
