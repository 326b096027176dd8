"""One trace across two processes: an API that takes pushes, a worker that runs
their handlers, both exporting OpenTelemetry spans.

Both serve the same app on one SQLite file (start them in two terminals)::

    pip install 'a2trio[otel]' opentelemetry-sdk
    python -m a2trio.serve examples.tracing:api --store sqlite:///.a2/shop.db --port 8000
    python -m a2trio.serve examples.tracing:worker --store sqlite:///.a2/shop.db --port 8001

Push an order with a W3C ``traceparent``, as an instrumented caller would::

    curl -X POST localhost:8000/shop/o1 \\
         -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' \\
         -d '{"events": [{"type": "ordered", "payload": {"item": "book"}}]}'

Each process prints its spans, one JSON object a line (to the file named by
``SPANS_FILE`` when it is set). The API's ``a2.append`` is a child of the
caller's span ``00f067aa0ba902b7``. In the worker, which found the order with
its sweep, the ``ordered`` event's ``a2.event`` is a child of that
``a2.append``, and the handler's ``a2.append`` (the note) and the returned
``shipped`` event's ``a2.event`` are its children: all in trace
``4bf92f35...``, while each ``a2.drain`` is a trace of its own, linked from the
events it ran. A real deployment exports with OTLP instead (see
``docs/operations.md``, "Tracing").
"""

from __future__ import annotations

import json
import os
import sys

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import a2trio
from a2trio.otel import OpenTelemetry

__all__ = ["api", "shop", "worker"]


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


class Note(msgspec.Struct, frozen=True):
    text: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "shipped": Shipped, "note": Note})


def _line(span: ReadableSpan) -> str:
    """A span as one JSON line: names, hex ids, links and attributes."""
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    return (
        json.dumps(
            {
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
                "links": [f"{link.context.span_id:016x}" for link in span.links],
                "attributes": dict(span.attributes or {}),
            }
        )
        + "\n"
    )


def _telemetry() -> OpenTelemetry:
    spans = os.environ.get("SPANS_FILE")
    # Exported as each span ends, so a killed process has written all of its.
    out = sys.stdout if spans is None else open(spans, "a", encoding="utf-8")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_line)))
    return OpenTelemetry(provider)


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
    await ctx.session.append("note", shop.event("note", Note(f"packing {ctx.event.payload.item}")))
    return shop.event("shipped", Shipped(ctx.event.payload.item))


async def track(ctx: a2trio.HandlerContext[Shipped]) -> None:
    pass


telemetry = _telemetry()
#: Takes pushes; declares the handlers (so events are stored pending) but runs none.
api = a2trio.Server(
    shop, handlers={"ordered": ship, "shipped": track}, run_handlers=False, telemetry=telemetry
)
#: Runs the handlers. SQLite has no cross-process wake-up: a short sweep finds
#: the API's appends within a tenth of a second.
worker = a2trio.Server(
    shop,
    handlers={"ordered": ship, "shipped": track},
    timings=a2trio.Timings(sweep_s=0.1),
    telemetry=telemetry,
)
