"""The Trio socket client against a real hypercorn."""

from __future__ import annotations

import functools
from typing import cast

import hypercorn.config
import hypercorn.trio
import hypercorn.typing
import msgspec
import pytest
import trio

import a2trio
from a2trio.stores import memory
from a2trio.transport import Operation, Request, asgi, wire
from a2trio.transport.client import open_client
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
    orders,
    serving,
    ws_url,
)

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


def ordered(item: str, id: str | None = None) -> dict[str, object]:
    event: dict[str, object] = {"type": "ordered", "payload": {"item": item}}
    if id is not None:
        event["id"] = id
    return event


def event_frame(event: wire.WireEvent) -> wire.EventFrame:
    return wire.EventFrame(**msgspec.structs.asdict(event))


def refuse_secret(request: Request, op: Operation) -> bool:
    return op.session_id != "secret"


@guarded(20)
async def test_push_subscribe_and_refusals() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server, authorize=refuse_secret)) as base,
        open_client(ws_url(base, "/orders/ws")) as client,
    ):
        [first] = await client.push("s1", ordered("book", "c-1"))
        assert (first.id, first.index, first.session_id) == ("c-1", 1, "s1")
        assert await client.push("s1", ordered("book", "c-1")) == [first]
        with pytest.raises(a2trio.A2Error) as unknown:
            await client.push("s1", {"type": "zap", "payload": {}})
        assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_EVENT_TYPE
        with pytest.raises(a2trio.A2Error) as forbidden:
            async with client.subscribe("secret"):
                pass
        assert forbidden.value.code is a2trio.ErrorCode.FORBIDDEN
        async with client.subscribe("s1") as one, client.subscribe("s2", start_after=0) as two:
            assert await one.receive() == event_frame(first)
            [second] = await client.push("s2", ordered("pen", "c-2"))
            assert await two.receive() == event_frame(second)
            with pytest.raises(RuntimeError, match=r"^this client already follows 's1'$"):
                async with client.subscribe("s1"):
                    pass


@guarded(20)
async def test_a_lost_socket_fails_lanes_and_pushes() -> None:
    server = a2trio.Server(orders, store=memory())
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.1
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        app = cast("hypercorn.typing.ASGIFramework", asgi(server))
        serve = functools.partial(hypercorn.trio.serve, app, config, shutdown_trigger=stop.wait)
        [base] = await nursery.start(serve)
        async with open_client(ws_url(base, "/orders/ws")) as client:
            async with client.subscribe("s1") as lane:
                stop.set()  # hypercorn shuts down and drops the socket
                with pytest.raises(a2trio.A2Error) as lost:
                    await lane.receive()
                assert lost.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
            with pytest.raises(a2trio.A2Error) as failed:
                await client.push("s1", ordered("x"))
            assert failed.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE


@guarded(20)
async def test_the_callers_error_is_not_a_group() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base:
        with pytest.raises(KeyError):
            async with open_client(ws_url(base, "/orders/ws")):
                raise KeyError("mine")
