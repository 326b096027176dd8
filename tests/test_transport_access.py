"""Withdrawn access ends what is already open (issue 17): ``App.revoke`` at
once, and a periodic re-ask of ``authorize`` (``Limits.reauthorize_s``).

Each end is resumable: SSE gets a last ``error`` frame, a multiplexed lane an
``unsubscribed`` notice with reason ``forbidden``, a single-session socket a
1008 close; reconnecting asks ``authorize`` again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx
import pytest
import trio_websocket

import a2trio
from a2trio.stores import memory
from a2trio.transport import Limits, Operation, Request, SubscribeOperation, asgi
from a2trio.transport.sse import SSEDecoder, SSEEvent
from tests.test_transport import (
    collect_client_garbage,
    frame,
    guarded,
    ordered,
    orders,
    push_body,
    pytestmark,
    serving,
    until,
    ws_url,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

SSE = {"accept": "text/event-stream"}
QUICK = Limits(heartbeat_s=30, ping_s=30, reauthorize_s=0.05)


class Policy:
    """Allows the sessions in ``allowed``; ``broken`` makes it crash."""

    def __init__(self, *allowed: str) -> None:
        self.allowed = set(allowed)
        self.broken = False

    def __call__(self, request: Request, op: Operation) -> bool:
        if self.broken:
            raise RuntimeError("the policy's database is down")
        return op.session_id in self.allowed


async def next_sse(frames: AsyncGenerator[SSEEvent]) -> SSEEvent:
    async for item in frames:
        return item
    raise AssertionError("the stream ended")


@asynccontextmanager
async def sse_stream(c: httpx.AsyncClient, path: str) -> AsyncIterator[AsyncGenerator[SSEEvent]]:
    async with c.stream("GET", path, headers=SSE) as response:
        assert response.status_code == 200

        async def frames() -> AsyncGenerator[SSEEvent]:
            decoder = SSEDecoder()
            async for chunk in response.aiter_bytes():
                for item in decoder.feed(chunk):
                    yield item

        async with aclosing(frames()) as items:
            yield items


def error_of(item: SSEEvent) -> dict[str, Any]:
    assert item.event == "error"
    error: dict[str, Any] = json.loads(item.data)["error"]
    return error


@guarded(20)
async def test_revoke_ends_matching_streams_and_lanes_at_once() -> None:
    server = a2trio.Server(orders, store=memory())
    policy = Policy("s1", "s2")
    app = asgi(server, authorize=policy, limits=Limits(heartbeat_s=30, ping_s=30))
    async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
        await c.post("/orders/s1", json=push_body(ordered("old")))
        async with (
            sse_stream(c, "/orders/s1?startAfter=0") as s1,
            sse_stream(c, "/orders/s2?startAfter=0") as s2,
            trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as mux,
            trio_websocket.open_websocket_url(ws_url(base, "/orders/s1/ws")) as single,
        ):
            assert (await next_sse(s1)).event == "event"
            await mux.send_message(
                json.dumps({"kind": "subscribe", "sessions": [{"id": "s1"}, {"id": "s2"}]})
            )
            kinds = sorted([(await frame(mux))["kind"] for _ in range(3)])
            assert kinds == ["event", "subscribed", "subscribed"]
            assert (await frame(single))["kind"] == "event"
            await until(lambda: len(app.grants) == 5)

            def s1_lanes(request: Request, op: Operation) -> bool:
                return op.session_id == "s1"

            assert app.revoke(s1_lanes, "removed from the board") == 3
            error = error_of(await next_sse(s1))
            assert error == {"code": "FORBIDDEN", "message": "removed from the board"}
            assert await anext(s1, None) is None
            notice = await frame(mux)
            assert (notice["kind"], notice["sessionId"], notice["reason"]) == (
                "unsubscribed",
                "s1",
                "forbidden",
            )
            assert notice["error"]["code"] == "FORBIDDEN"
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await frame(single)
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1008
            # The others live on.
            await c.post("/orders/s2", json=push_body(ordered("new")))
            assert (await next_sse(s2)).event == "event"
            live = await frame(mux)
            assert (live["kind"], live["sessionId"]) == ("event", "s2")
            assert app.revoke(s1_lanes) == 0
        await until(lambda: len(app.grants) == 0)


@guarded(20)
async def test_open_streams_and_lanes_ask_authorize_again() -> None:
    server = a2trio.Server(orders, store=memory())
    policy = Policy("s1", "s2", "s3")
    app = asgi(server, authorize=policy, limits=QUICK)
    async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
        async with (
            sse_stream(c, "/orders/s1") as s1,
            trio_websocket.open_websocket_url(ws_url(base, "/orders/ws")) as mux,
        ):
            await mux.send_message(
                json.dumps({"kind": "subscribe", "sessions": [{"id": "s2"}, {"id": "s3"}]})
            )
            assert [(await frame(mux))["kind"] for _ in range(2)] == ["subscribed"] * 2
            policy.allowed -= {"s1", "s2"}
            error = error_of(await next_sse(s1))
            assert error["code"] == "FORBIDDEN"
            notice = await frame(mux)
            assert (notice["sessionId"], notice["reason"]) == ("s2", "forbidden")
            # Reconnecting is asked again, and refused.
            refused = await c.get("/orders/s1", headers=SSE)
            assert refused.status_code == 403
            # A policy that crashes ends what it guards, retryably.
            policy.broken = True
            notice = await frame(mux)
            assert (notice["sessionId"], notice["reason"]) == ("s3", "forbidden")
            assert notice["error"] == {"code": "STORE_UNAVAILABLE", "message": "internal error"}


def test_reauthorize_must_be_positive_or_none() -> None:
    assert Limits(reauthorize_s=None).reauthorize_s is None
    with pytest.raises(ValueError, match=r"^`reauthorize_s` must be positive seconds or None"):
        Limits(reauthorize_s=0)


def test_subscribe_operations_are_what_lanes_are_granted_for() -> None:
    assert SubscribeOperation("orders", "s1", 0).session_id == "s1"


async def test_the_policy_is_not_asked_without_a_reauthorize_interval() -> None:
    asked: list[str] = []

    def policy(request: Request, op: Operation) -> bool:
        asked.append(op.session_id)
        return True

    server = a2trio.Server(orders, store=memory())
    app = asgi(server, authorize=policy, limits=Limits(reauthorize_s=None, heartbeat_s=30))
    async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
        async with sse_stream(c, "/orders/s1") as s1:
            await c.post("/orders/s1", json=push_body(ordered("x")))
            assert (await next_sse(s1)).event == "event"
    assert asked == ["s1", "s1"]  # the stream's open and the push
