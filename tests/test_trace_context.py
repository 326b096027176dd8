"""Trace context through the engine (issue 18): what an append stores with its
events, and what each event's span is asked to continue, seen through the
:class:`~a2trio.testing.RecordingTelemetry` (no OpenTelemetry needed; the
OpenTelemetry side is in ``test_otel.py`` and ``test_otel_processes.py``)."""

from __future__ import annotations

import json

import msgspec
import pytest
import trio
import trio.testing
import trio_websocket

import a2trio
from a2trio.push import PushedEvent
from a2trio.stores import memory
from a2trio.telemetry import (
    MAX_TRACE_HEADER,
    decode_trace_context,
    encode_trace_context,
    trace_id_of,
)
from a2trio.testing import RecordingTelemetry
from a2trio.transport import asgi, open_client, open_http_client
from examples.vault import vault

from .apps import Note, Ordered, Shipped, orders
from .test_scheduler import Recording
from .test_transport import (
    FAST,
    client,
    collect_client_garbage,
    frame,
    guarded,
    ordered,
    serving,
    ws_url,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

__all__ = ["collect_client_garbage"]  # the autouse fixture, in this module's filters too

CALLER = encode_trace_context(
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
)


async def test_events_store_their_appenders_context_and_their_spans_continue_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        await ctx.session.append("note", orders.event("note", Note("packed")))
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    async def track(ctx: a2trio.HandlerContext[Shipped]) -> None:
        pass

    telemetry = RecordingTelemetry()
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(
        orders, store=store, handlers={"ordered": ship, "shipped": track}, telemetry=telemetry
    )
    async with server:
        await server.session("s1").push(
            [PushedEvent("ordered", {"item": "book"})], trace_parent=CALLER
        )
        await server.settle()
        rows = {row.type: row for row in await store.read("orders\x1fs1")}

    push = telemetry.one("a2.append", {"a2.append.source": "external"})
    assert push.parent == CALLER
    assert rows["ordered"].trace_context == push.context
    ordered = telemetry.one("a2.event", {"a2.event.type": "ordered"})
    assert ordered.parent == push.context
    # A handler's appends and its returned events are in its event's trace.
    inner = telemetry.one("a2.append", {"a2.append.source": "handler"})
    assert inner.parent is None
    assert inner.trace_id == ordered.trace_id == push.trace_id
    assert rows["note"].trace_context == inner.context
    assert rows["shipped"].trace_context == ordered.context
    assert telemetry.one("a2.event", {"a2.event.type": "shipped"}).parent == ordered.context


async def test_a_scheduled_append_continues_the_trace_that_scheduled_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await ctx.session.schedule("remind", "30s", orders.event("note", Note("late")))

    telemetry = RecordingTelemetry()
    scheduler = Recording()
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(
        orders, store=store, handlers={"ordered": ship}, scheduler=scheduler, telemetry=telemetry
    )
    async with server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await server.settle()
        [task] = [t for t in scheduler.tasks if isinstance(t, a2trio.AppendTask)]
        await trio.sleep(31)
        await server.settle()
        rows = {row.type: row for row in await store.read("orders\x1fs1")}

    ordered = telemetry.one("a2.event", {"a2.event.type": "ordered"})
    assert task.trace_parent == ordered.context
    delivered = telemetry.one("a2.append", {"a2.append.types": "note"})
    assert delivered.parent == ordered.context
    assert rows["note"].trace_context == delivered.context
    # The task's encoding carries it beside the seed's fields, and reads back.
    body = msgspec.json.encode(task)
    assert msgspec.json.decode(body)["traceContext"] == ordered.context
    assert a2trio.scheduler.task_decoder().decode(body) == task


async def test_without_a_trace_nothing_is_stored(autojump_clock: trio.testing.MockClock) -> None:
    store = memory(clock=a2trio.TrioClock())
    async with a2trio.Server(orders, store=store) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        [row] = await store.read("orders\x1fs1")
    assert row.trace_context is None


def test_encode_keeps_only_the_w3c_headers_within_their_bound() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    encoded = encode_trace_context(
        {"traceparent": parent, "tracestate": "congo=t61rcWkgMzE", "baggage": "user=alice"}
    )
    assert decode_trace_context(encoded) == {
        "traceparent": parent,
        "tracestate": "congo=t61rcWkgMzE",
    }
    long_state = "a=" + "b" * MAX_TRACE_HEADER
    assert decode_trace_context(
        encode_trace_context({"traceparent": parent, "tracestate": long_state})
    ) == {"traceparent": parent}
    assert encode_trace_context({"tracestate": "congo=t61rcWkgMzE"}) is None
    assert encode_trace_context({"traceparent": ""}) is None
    assert encode_trace_context({"traceparent": "0" * (MAX_TRACE_HEADER + 1)}) is None


@pytest.mark.parametrize(
    "stored", [None, "", "not json", "[1, 2]", '{"traceparent": 7}', '{"baggage": "a=b"}']
)
def test_decode_reads_anything_else_as_no_context(stored: str | None) -> None:
    assert decode_trace_context(stored) == {}


# -- over the transports ------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@guarded(20)
async def test_a_socket_push_frame_carries_its_trace_context() -> None:
    telemetry = RecordingTelemetry()
    server = a2trio.Server(orders, store=memory(), telemetry=telemetry)
    async with serving(asgi(server, limits=FAST)) as base:
        async with trio_websocket.open_websocket_url(ws_url(base, "/orders/s1/ws")) as ws:
            frames = [
                {"kind": "push", "req": 1, "events": [ordered("traced")]},
                {"kind": "push", "req": 2, "events": [ordered("plain")]},
            ]
            frames[0] |= {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
            for sent in frames:
                await ws.send_message(json.dumps(sent))
                while (await frame(ws))["kind"] != "ack":
                    pass
    traced, plain = telemetry.find("a2.append")
    assert decode_trace_context(traced.parent) == {
        "traceparent": TRACEPARENT,
        "tracestate": "congo=t61rcWkgMzE",
    }
    assert plain.parent is None


@guarded(20)
async def test_an_http_actor_call_carries_its_trace_context() -> None:
    telemetry = RecordingTelemetry()
    app = asgi(a2trio.Server(vault, store=memory(), telemetry=telemetry), limits=FAST)
    async with serving(app) as base, client(base) as c:
        answered = await c.post(
            "/vault/alice",
            json={"event": "deposit", "input": {"amount": 5}},
            headers={"traceparent": TRACEPARENT},
        )
        assert answered.status_code == 200, answered.text
    [append] = telemetry.find("a2.append")
    assert decode_trace_context(append.parent) == {"traceparent": TRACEPARENT}


@pytest.mark.parametrize(
    ("stored", "trace_id"),
    [
        (CALLER, "0af7651916cd43dd8448eb211c80319c"),
        (
            encode_trace_context({"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-b7-01"}),
            ("0af7651916cd43dd8448eb211c80319c"),
        ),
        (None, None),
        (encode_trace_context({"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"}), None),
        (encode_trace_context({"traceparent": "00-0af76519-b7ad6b7169203331-01"}), None),
        (encode_trace_context({"traceparent": "00-" + "g" * 32 + "-b7ad6b7169203331-01"}), None),
        (encode_trace_context({"traceparent": "garbage"}), None),
    ],
)
def test_trace_id_of_reads_the_traceparent(stored: str | None, trace_id: str | None) -> None:
    assert trace_id_of(stored) == trace_id


async def test_inspection_shows_the_trace_an_event_was_appended_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    telemetry = RecordingTelemetry()
    server = a2trio.Server(orders, store=memory(clock=a2trio.TrioClock()), telemetry=telemetry)
    async with server:
        await server.session("s1").push(
            [PushedEvent("ordered", {"item": "book"})], trace_parent=CALLER
        )
        async with a2trio.Server(orders, store=server.store) as untraced:
            await untraced.session("s1").append(orders.event("note", Note("plain")))
        page = await server.inspect.read_session_page("s1")
    push = telemetry.one("a2.append")
    assert [e.trace_id for e in page.events] == [trace_id_of(push.context), None]
    assert page.events[0].trace_id is not None


@guarded(20)
async def test_the_clients_pushes_carry_the_callers_trace_context() -> None:
    served = RecordingTelemetry()
    caller = RecordingTelemetry()
    app = asgi(a2trio.Server(orders, store=memory(), telemetry=served), limits=FAST)
    async with serving(app) as base:
        ws = ws_url(base, "/orders/ws")
        async with (
            open_http_client(f"{base}/orders", telemetry=caller) as over_http,
            open_client(ws, telemetry=caller) as over_socket,
        ):
            with caller.span("app.request", {}):
                await over_http.push("s1", ordered("by-http"))
                await over_socket.push("s1", ordered("by-socket"))
            await over_http.push("s1", ordered("untraced"))
    request = caller.one("app.request")
    assert [s.parent for s in served.find("a2.append")] == [request.context] * 2 + [None]
