"""Two processes of one app, for the cross-process trace test
(``tests/test_otel_processes.py``): an API that takes pushes and runs no
handlers, and a worker that runs them. Each is served by ``python -m
a2trio.serve tests.trace_workers.app:api`` (or ``:worker``) with ``--store``
naming the shared SQLite file, and writes every span it ends to the file named
by ``A2_TRACE_SPANS``, one JSON object a line.
"""

from __future__ import annotations

import json
import os

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import a2trio
from a2trio.otel import OpenTelemetry


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


class Note(msgspec.Struct, frozen=True):
    text: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "shipped": Shipped, "note": Note})


def _line(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    return (
        json.dumps(
            {
                "name": span.name,
                "trace": context.trace_id,
                "span": context.span_id,
                "parent": None if span.parent is None else span.parent.span_id,
                "links": [link.context.span_id for link in span.links],
                "attributes": dict(span.attributes or {}),
            }
        )
        + "\n"
    )


def _telemetry() -> OpenTelemetry:
    provider = TracerProvider()
    spans = os.environ.get("A2_TRACE_SPANS")
    if spans is not None:
        # Exported as each span ends, so a killed process has written all of its.
        out = open(spans, "a", encoding="utf-8")  # open for the process's life
        provider.add_span_processor(
            SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_line))
        )
    return OpenTelemetry(provider)


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
    await ctx.session.append("note", shop.event("note", Note(f"packing {ctx.event.payload.item}")))
    return shop.event("shipped", Shipped(ctx.event.payload.item))


async def track(ctx: a2trio.HandlerContext[Shipped]) -> None:
    pass


#: The worker's sweep finds the API's appends (SQLite has no cross-process wake-up).
TIMINGS = a2trio.Timings(sweep_s=0.1)

telemetry = _telemetry()
api = a2trio.Server(
    shop, handlers={"ordered": ship, "shipped": track}, run_handlers=False, telemetry=telemetry
)
worker = a2trio.Server(
    shop, handlers={"ordered": ship, "shipped": track}, timings=TIMINGS, telemetry=telemetry
)
