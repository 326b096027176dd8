"""a2trio.otel: the engine's spans as OpenTelemetry spans, read back from the
SDK's in-memory exporter.

Parentage is checked by span ids: Trio copies the spawning task's context into
each new task, so a span must parent the spans of tasks spawned inside it (an
``a2.event`` under its ``a2.drain``) and concurrent drains must not mix.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import a2trio
import a2trio.otel
from a2trio.otel import OpenTelemetry
from a2trio.stores import memory
from a2trio.transport import asgi

from .apps import Cancelled, Note, Ordered, Shipped, orders
from .test_transport import serving

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def server(provider: TracerProvider, handlers: Mapping[str, Any]) -> a2trio.Server:
    return a2trio.Server(
        orders,
        store=memory(clock=a2trio.TrioClock()),
        handlers=handlers,
        telemetry=OpenTelemetry(provider),
    )


def finished(exporter: InMemorySpanExporter, name: str | None = None) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if name is None or s.name == name]


def one(
    exporter: InMemorySpanExporter, name: str, where: dict[str, object] | None = None
) -> ReadableSpan:
    found = [
        s
        for s in finished(exporter, name)
        if all((s.attributes or {}).get(k) == v for k, v in (where or {}).items())
    ]
    assert len(found) == 1, (name, where, [(s.name, s.attributes) for s in finished(exporter)])
    return found[0]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.trace_id
    return found


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def exception_events(span: ReadableSpan) -> list[tuple[object, object]]:
    return [
        ((e.attributes or {}).get("exception.type"), (e.attributes or {}).get("exception.message"))
        for e in span.events
        if e.name == "exception"
    ]


# -- the engine's spans ---------------------------------------------------------


async def test_drain_event_and_a_handlers_append_nest_under_the_external_append(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    app_tracer = provider.get_tracer("app")

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        # The handler's own spans nest under its a2.event: it is the current span.
        with app_tracer.start_as_current_span("app.pack"):
            await trio.sleep(1)
        await ctx.session.append("ship", orders.event("shipped", Shipped(ctx.event.payload.item)))

    counter = a2trio.Reducer("count", 0, lambda n, e: n + 1)
    async with server(provider, {"ordered": ship}) as srv:
        session = srv.session("s1")
        [ordered] = await session.append(orders.event("ordered", Ordered("book"), id="c1"))
        await srv.settle()
        assert await session.state(counter) == (2, 2)

    external = one(exporter, "a2.append", {"a2.append.source": "external"})
    assert dict(external.attributes or {}) == {
        "a2.contract": "orders",
        "a2.session_id": "s1",
        "a2.append.source": "external",
        "a2.append.mode": "inline",
        "a2.append.types": "ordered",
        "a2.append.count": 1,
    }
    assert external.parent is None
    drain = one(exporter, "a2.drain", {"a2.session_id": "s1"})
    assert parent_id(drain) == span_id(external)
    assert drain.attributes is not None
    assert drain.attributes["a2.contract"] == "orders"
    assert drain.attributes["a2.drain.outcome"] == "settled"
    assert drain.attributes["a2.drain.processed"] == 1
    event = one(exporter, "a2.event", {"a2.event.type": "ordered"})
    # The event runs in a child task of the drain's nursery.
    assert parent_id(event) == span_id(drain)
    assert dict(event.attributes or {}) == {
        "a2.contract": "orders",
        "a2.session_id": "s1",
        "a2.event.type": "ordered",
        "a2.event.index": 1,
        "a2.event.id": ordered.id,
        "a2.event.attempt": 1,
        "a2.event.handled": True,
        "a2.event.outcome": "processed",
    }
    assert parent_id(one(exporter, "app.pack")) == span_id(event)
    inner = one(exporter, "a2.append", {"a2.append.source": "handler"})
    assert parent_id(inner) == span_id(event)
    assert (inner.attributes or {})["a2.append.types"] == "shipped"
    # "shipped" has no handler, so nothing drains it.
    assert len(finished(exporter, "a2.event")) == 1
    state = one(exporter, "a2.state")
    assert dict(state.attributes or {}) == {
        "a2.contract": "orders",
        "a2.session_id": "s1",
        "a2.state.reducer": "count",
        "a2.state.snapshot": "miss",
        "a2.state.folded": 2,
        "a2.state.index": 2,
    }
    # One causal trace for the push and what it caused; the read is its own trace.
    assert {trace_id(s) for s in finished(exporter) if s is not state} == {trace_id(external)}
    assert trace_id(state) != trace_id(external)
    assert state.parent is None
    assert all(s.status.status_code is StatusCode.UNSET for s in finished(exporter))
    assert all(s.instrumentation_scope is not None for s in finished(exporter))
    scope = event.instrumentation_scope
    assert scope is not None
    assert scope.name == "a2trio"
    assert scope.version == importlib.metadata.version("a2trio")


async def test_concurrent_drains_keep_their_spans_apart(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    running: set[str] = set()
    overlapped: list[set[str]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        running.add(ctx.event.payload.item)
        await trio.sleep(10)
        overlapped.append(set(running))
        await ctx.session.append("note", orders.event("note", Note(ctx.event.payload.item)))
        running.discard(ctx.event.payload.item)

    async with server(provider, {"ordered": ship}) as srv:

        async def push(session_id: str) -> None:
            await srv.session(session_id).append(orders.event("ordered", Ordered(session_id)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(push, "s1")
            nursery.start_soon(push, "s2")
        await srv.settle()

    # Both handlers were running at once.
    assert {"s1", "s2"} in overlapped
    by_id = {span_id(s): s for s in finished(exporter)}
    for session_id in ("s1", "s2"):
        external = one(
            exporter, "a2.append", {"a2.session_id": session_id, "a2.append.source": "external"}
        )
        drain = one(exporter, "a2.drain", {"a2.session_id": session_id})
        event = one(exporter, "a2.event", {"a2.session_id": session_id, "a2.event.index": 1})
        inner = one(
            exporter, "a2.append", {"a2.session_id": session_id, "a2.append.source": "handler"}
        )
        assert [parent_id(drain), parent_id(event), parent_id(inner)] == [
            span_id(external),
            span_id(drain),
            span_id(event),
        ]
        # Every span of this session's trace is about this session.
        in_trace = [s for s in finished(exporter) if trace_id(s) == trace_id(external)]
        assert len(in_trace) == 4  # append, drain, event, the handler's append
        assert {(s.attributes or {})["a2.session_id"] for s in in_trace} == {session_id}
        for span in in_trace:
            parent = parent_id(span)
            if parent is not None:
                assert (by_id[parent].attributes or {})["a2.session_id"] == session_id
    assert len({trace_id(s) for s in finished(exporter)}) == 2


async def test_a_failing_handler_marks_its_event_span_an_error(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(1)
        raise ValueError(f"no stock for {ctx.event.payload.item}")

    async with server(provider, {"ordered": ship}) as srv:
        await srv.session("s1").append(orders.event("ordered", Ordered("book")))
        await srv.settle()

    event = one(exporter, "a2.event", {"a2.event.type": "ordered"})
    assert (event.attributes or {})["a2.event.outcome"] == "failed"
    assert event.status.status_code is StatusCode.ERROR
    assert event.status.description == "ValueError: no stock for book"
    assert exception_events(event) == [("ValueError", "no stock for book")]
    # The drain did its job: the handler's failure is not the drain's.
    drain = one(exporter, "a2.drain")
    assert (drain.attributes or {})["a2.drain.outcome"] == "stalled"
    assert drain.status.status_code is StatusCode.UNSET
    assert drain.events == ()


async def test_an_abort_is_an_attribute_not_an_error(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    cancelled_at: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        try:
            await trio.sleep(100)
        finally:
            cancelled_at.append(trio.current_time())

    handlers = {"ordered": a2trio.handler(ship, abort_on=["cancelled"])}
    async with server(provider, handlers) as srv:
        session = srv.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await trio.sleep(10)
        await session.append(orders.event("cancelled", Cancelled("book")))
        await srv.settle()

    assert cancelled_at == [10.0]
    event = one(exporter, "a2.event", {"a2.event.type": "ordered"})
    assert (event.attributes or {})["a2.event.outcome"] == "processed"
    assert (event.attributes or {})["a2.event.aborted"] is True
    assert event.status.status_code is StatusCode.UNSET
    assert event.events == ()


async def test_closing_the_server_under_a_running_handler_ends_its_spans_without_errors(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    started = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.set()
        await trio.sleep(100)

    async with server(provider, {"ordered": ship}) as srv:
        await srv.session("s1").append(orders.event("ordered", Ordered("book")))
        await started.wait()
        assert finished(exporter, "a2.event") == []

    assert trio.current_time() < 100
    event = one(exporter, "a2.event", {"a2.event.type": "ordered"})
    drain = one(exporter, "a2.drain")
    for span in (event, drain):
        assert span.end_time is not None
        assert span.status.status_code is StatusCode.UNSET
        assert span.events == ()
    # Cancelled before any outcome: the spans carry none.
    assert "a2.event.outcome" not in (event.attributes or {})
    assert "a2.drain.outcome" not in (drain.attributes or {})


# -- the adapter ------------------------------------------------------------------


async def test_an_exception_escaping_the_block_is_the_spans_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    telemetry = OpenTelemetry(provider)
    with pytest.raises(KeyError), telemetry.span("a2.append", {"a2.append.count": 1}) as span:
        span.set_attribute("a2.append.armed", False)
        raise KeyError("k")
    [append] = finished(exporter)
    assert dict(append.attributes or {}) == {"a2.append.count": 1, "a2.append.armed": False}
    assert append.status.status_code is StatusCode.ERROR
    assert append.status.description == "KeyError: 'k'"
    assert exception_events(append) == [("KeyError", "'k'")]
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_an_error_recorded_then_reraised_is_recorded_once_and_the_first_error_describes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    telemetry = OpenTelemetry(provider)
    arm = trio.TooSlowError()
    with pytest.raises(trio.TooSlowError), telemetry.span("a2.append", {}) as span:
        span.record_error(ValueError("store down"))
        span.record_error(arm)
        span.record_error(arm)
        raise arm
    [append] = finished(exporter)
    assert exception_events(append) == [("ValueError", "store down"), ("trio.TooSlowError", "")]
    assert append.status.status_code is StatusCode.ERROR
    assert append.status.description == "ValueError: store down"


async def test_spans_nest_in_the_opening_task_and_the_context_is_restored(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    telemetry = OpenTelemetry(provider)
    seen: list[trace.Span] = []

    async def child() -> None:
        seen.append(trace.get_current_span())
        with telemetry.span("a2.event", {}):
            await trio.lowlevel.checkpoint()

    with telemetry.span("a2.drain", {}):
        outer = trace.get_current_span()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is trace.INVALID_SPAN
    drain = one(exporter, "a2.drain")
    assert seen == [outer]
    assert outer.get_span_context().span_id == span_id(drain)
    assert parent_id(one(exporter, "a2.event")) == span_id(drain)


async def test_cancellation_escaping_the_block_is_not_an_error(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    telemetry = OpenTelemetry(provider)
    with trio.move_on_after(1) as scope, telemetry.span("a2.event", {}):
        await trio.sleep(2)
    assert scope.cancelled_caught
    assert trio.current_time() == 1
    # A group of cancellations (a cancelled nursery) is not an error either.
    with trio.CancelScope() as scope, telemetry.span("a2.drain", {}):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert scope.cancelled_caught
    spans = finished(exporter)
    assert [s.name for s in spans] == ["a2.event", "a2.drain"]
    for span in spans:
        assert span.status.status_code is StatusCode.UNSET
        assert span.events == ()
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_a_group_holding_an_error_beside_cancellations_is_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    telemetry = OpenTelemetry(provider)

    async def fail(scope: trio.CancelScope) -> None:
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        raise ValueError("bad")

    caught: list[BaseExceptionGroup[BaseException]] = []
    with trio.CancelScope() as scope:
        try:
            with telemetry.span("a2.drain", {}):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.sleep_forever)
                    nursery.start_soon(fail, scope)
        except BaseExceptionGroup as exc:
            caught.append(exc)
    [group] = caught
    assert group.split(trio.Cancelled)[0] is not None  # the group did hold a Cancelled
    [drain] = finished(exporter)
    assert drain.status.status_code is StatusCode.ERROR
    assert [t for t, _ in exception_events(drain)] == [type(group).__name__]


def test_the_global_tracer_provider_is_the_default_and_may_be_set_later() -> None:
    # In a fresh process: the global provider can be set only once.
    code = """
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from a2trio.otel import OpenTelemetry

telemetry = OpenTelemetry()
with telemetry.span("a2.state", {}) as span:  # no SDK yet: a valid no-op
    span.set_attribute("a2.state.index", 0)
    span.record_error(ValueError("dropped"))
    assert not trace.get_current_span().is_recording()
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with telemetry.span("a2.drain", {"a2.session_id": "s1"}):
    assert trace.get_current_span().is_recording()
print([(s.name, dict(s.attributes)) for s in exporter.get_finished_spans()])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[('a2.drain', {'a2.session_id': 's1'})]"


def test_the_tracer_names_its_scope(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with OpenTelemetry(provider, tracer_name="billing").span("a2.drain", {}):
        pass
    [drain] = finished(exporter)
    scope = drain.instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version) == ("billing", "")


def test_without_the_api_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "a2trio.otel")
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"install the `otel` extra") as caught:
        importlib.import_module("a2trio.otel")
    assert isinstance(caught.value.__cause__, ImportError)


def test_import_a2trio_does_not_import_opentelemetry() -> None:
    code = "import sys, a2trio; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_the_adapter_imports_only_the_telemetry_seam_from_a2trio() -> None:
    tree = ast.parse((ROOT / "a2trio" / "otel.py").read_text())
    internal: Sequence[str | None] = [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert internal == ["telemetry"]


# -- trace context across processes ---------------------------------------------

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{CALLER:016x}-01"


def link_ids(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


async def test_an_http_push_continues_the_requests_trace_to_its_handler(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        pass

    srv = server(provider, {"ordered": ship})
    # The app's lifespan opens the server.
    async with serving(asgi(srv)) as base, httpx.AsyncClient(base_url=base) as http:
        response = await http.post(
            "/orders/s1",
            json={"events": [{"type": "ordered", "payload": {"item": "book"}}]},
            headers={"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"},
        )
        assert response.status_code == 200, response.text
        await srv.settle()

    append = one(exporter, "a2.append")
    assert append.parent is not None
    assert append.parent.is_remote
    assert (trace_id(append), parent_id(append)) == (TRACE, CALLER)
    assert append.context is not None
    assert append.context.trace_state.to_header() == "congo=t61rcWkgMzE"
    # In one process the drain the append started is in its trace already, so
    # the event keeps the in-process nesting (a2.append > a2.drain > a2.event).
    drain = one(exporter, "a2.drain")
    event = one(exporter, "a2.event")
    assert parent_id(drain) == span_id(append)
    assert parent_id(event) == span_id(drain)
    assert event.links == ()
    assert {trace_id(s) for s in finished(exporter)} == {TRACE}


async def test_a_drain_in_another_trace_runs_each_event_in_its_appenders_trace(
    autojump_clock: trio.testing.MockClock,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    # An API server that runs no handlers and a worker on one store stand for
    # two processes: the worker's drain starts outside every span, as a drain
    # woken by another process's append does.
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    async def track(ctx: a2trio.HandlerContext[Shipped]) -> None:
        pass

    handlers: dict[str, a2trio.HandlerSpec | Any] = {"ordered": ship, "shipped": track}
    store = memory(clock=a2trio.TrioClock())
    telemetry = OpenTelemetry(provider)
    api = a2trio.Server(
        orders, store=store, handlers=handlers, run_handlers=False, telemetry=telemetry
    )
    worker = a2trio.Server(orders, store=store, handlers=handlers, sweep=False, telemetry=telemetry)
    tracer = provider.get_tracer("app")
    async with api, worker:
        with tracer.start_as_current_span("app.request") as request:
            await api.session("s1").append(orders.event("ordered", Ordered("book")))
        assert not trace.get_current_span().get_span_context().is_valid
        await worker.drain("s1")

    append = one(exporter, "a2.append")
    assert parent_id(append) == request.get_span_context().span_id
    drain = one(exporter, "a2.drain")
    assert drain.parent is None
    assert trace_id(drain) != trace_id(append)
    ordered = one(exporter, "a2.event", {"a2.event.type": "ordered"})
    shipped = one(exporter, "a2.event", {"a2.event.type": "shipped"})
    # Each event continues the trace that appended it, and links the drain.
    assert (trace_id(ordered), parent_id(ordered)) == (trace_id(append), span_id(append))
    assert (trace_id(shipped), parent_id(shipped)) == (trace_id(append), span_id(ordered))
    assert link_ids(ordered) == link_ids(shipped) == [span_id(drain)]


def test_trace_context_is_the_current_spans_w3c_headers(provider: TracerProvider) -> None:
    telemetry = OpenTelemetry(provider)
    assert telemetry.trace_context() is None
    with telemetry.span("a2.append", {}):
        context = trace.get_current_span().get_span_context()
        stored = telemetry.trace_context()
    assert a2trio.telemetry.decode_trace_context(stored) == {
        "traceparent": (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        )
    }


@pytest.mark.parametrize(
    "parent",
    [
        "not json",
        '{"traceparent": "00-not-a-trace-01"}',
        '{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}',
        "{}",
    ],
)
def test_a_parent_that_is_no_trace_context_is_ignored(
    provider: TracerProvider, exporter: InMemorySpanExporter, parent: str
) -> None:
    with OpenTelemetry(provider).span("a2.event", {}, parent=parent):
        pass
    [event] = finished(exporter)
    assert event.parent is None
    assert event.links == ()


def test_a_parent_in_the_current_trace_leaves_the_current_span_the_parent(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    telemetry = OpenTelemetry(provider)
    with telemetry.span("a2.append", {}):
        stored = telemetry.trace_context()
    with telemetry.span("a2.drain", {}, parent=stored):
        with telemetry.span("a2.event", {}, parent=stored):
            pass
    event = one(exporter, "a2.event")
    drain = one(exporter, "a2.drain")
    assert parent_id(drain) == span_id(one(exporter, "a2.append"))
    assert link_ids(drain) == []
    assert parent_id(event) == span_id(drain)
    assert event.links == ()
