"""The Trio socket client against a real hypercorn (in process, memory store)."""

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
from a2trio.transport import (
    Closed,
    Connecting,
    ConnectionState,
    Lane,
    Live,
    Operation,
    Paused,
    Request,
    SubscribeOperation,
    asgi,
    open_client,
    wire,
)
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    guarded,
    orders,
    rooms,
    serving,
    ws_url,
)

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


def state_of(lane: Lane) -> ConnectionState:
    """The lane's state, read fresh (mypy would narrow a property across awaits)."""
    return lane.connection.state


def ordered(item: str, id: str | None = None) -> dict[str, object]:
    event: dict[str, object] = {"type": "ordered", "payload": {"item": item}}
    if id is not None:
        event["id"] = id
    return event


def event_frame(event: wire.WireEvent) -> wire.EventFrame:
    return wire.EventFrame(**msgspec.structs.asdict(event))


def refuse_secret(request: Request, op: Operation) -> bool:
    """Nobody follows 'secret'; anyone may write to it."""
    return not (isinstance(op, SubscribeOperation) and op.session_id == "secret")


def pause(session_id: str, error: a2trio.A2Error | None, attempt: int) -> bool:
    return False


@guarded(20)
async def test_push_replays_by_id_and_surfaces_refusals_at_once() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_client(ws_url(base, "/orders/ws")) as client,
    ):
        [first] = await client.push("s1", ordered("book", "c-1"))
        assert (first.id, first.index, first.session_id) == ("c-1", 1, "s1")
        assert await client.push("s1", ordered("book", "c-1")) == [first]
        # An event without an id gets a client-generated one.
        [second] = await client.push("s1", ordered("pen"))
        assert (second.index, len(second.id)) == (2, 36)
        with pytest.raises(a2trio.A2Error) as unknown:
            await client.push("s1", {"type": "zap", "payload": {}})
        assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_EVENT_TYPE
        assert [e.id for e in await server.session("s1").history()] == ["c-1", second.id]


@guarded(20)
async def test_lanes_go_live_follow_and_close() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_client(ws_url(base, "/orders/ws")) as client,
    ):
        [first] = await client.push("s1", ordered("book", "c-1"))
        async with client.subscribe("s1") as one, client.subscribe("s2", start_after=0) as two:
            assert state_of(one) == Connecting(0, None)
            assert await one.wait_live() == Live(0)
            assert await one.receive() == event_frame(first)
            assert one.index == 1
            [second] = await client.push("s2", ordered("pen", "c-2"))
            assert await two.receive() == event_frame(second)
            with pytest.raises(RuntimeError, match=r"^this client already follows 's1'$"):
                async with client.subscribe("s1"):
                    pass
        assert state_of(one) == state_of(two) == Closed()
        with pytest.raises(StopAsyncIteration):
            await one.receive()
        with pytest.raises(trio.ClosedResourceError):
            await one.wait_live()
        one.reconnect()  # nothing to restart
        assert state_of(one) == Closed()


@guarded(20)
async def test_a_refused_lane_goes_to_the_policy_and_pauses() -> None:
    calls: list[tuple[str, str | None, int]] = []

    def policy(session_id: str, error: a2trio.A2Error | None, attempt: int) -> bool:
        calls.append((session_id, error.code if error else None, attempt))
        return False

    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server, authorize=refuse_secret)) as base,
        open_client(ws_url(base, "/orders/ws"), reconnect=policy) as client,
        client.subscribe("secret") as secret,
        client.subscribe("s1") as open_lane,
    ):
        with pytest.raises(a2trio.A2Error) as forbidden:
            await secret.wait_live()
        assert forbidden.value.code is a2trio.ErrorCode.FORBIDDEN
        assert state_of(secret) == Paused(1, forbidden.value)
        assert calls == [("secret", a2trio.ErrorCode.FORBIDDEN, 1)]
        # Pushes and other lanes do not resume it.
        await open_lane.wait_live()
        await client.push("secret", ordered("x"))
        assert isinstance(state_of(secret), Paused)
        # reconnect() tries again, attempt 1 again.
        client.reconnect("secret")
        with pytest.raises(a2trio.A2Error):
            await secret.wait_live()
        assert calls[-1] == ("secret", a2trio.ErrorCode.FORBIDDEN, 1)
        assert state_of(open_lane) == Live(0)


@guarded(20)
async def test_reconnect_resubscribes_only_that_lane_on_the_same_socket() -> None:
    server = a2trio.Server(orders, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_client(ws_url(base, "/orders/ws")) as client,
        client.subscribe("s1") as one,
        client.subscribe("s2") as two,
    ):
        await one.wait_live()
        await two.wait_live()
        [a] = await client.push("s1", ordered("a"))
        assert await one.receive() == event_frame(a)
        # A write the client did not make: reconnect() picks it up from index 1.
        [b] = await server.session("s1").append(orders.event("ordered", {"item": "b"}))
        client.reconnect("s1")
        state = await one.connection.wait_for(lambda s: s == Live(1))
        assert state == Live(1)
        assert (await one.receive()).index == b.index == 2  # type: ignore[union-attr]
        assert state_of(two) == Live(0)  # the other lane never noticed
        [c] = await client.push("s2", ordered("c"))
        assert await two.receive() == event_frame(c)


@guarded(20)
async def test_follow_folds_forward_and_presence_repaints() -> None:
    reducer = a2trio.Reducer("count", 0, lambda n, e: n + 1)
    server = a2trio.Server(rooms, store=memory())
    async with (
        serving(asgi(server)) as base,
        open_client(ws_url(base, "/rooms/ws?presence=1")) as client,
        client.follow("r1", reducer, contract=rooms) as fold,
    ):
        await fold.lane.wait_live()
        await client.push("r1", {"type": "note", "payload": {"text": "hi"}})
        await client.push("r1", {"type": "note", "payload": {"text": "ho"}})
        assert [await anext(fold), await anext(fold)] == [
            a2trio.transport.Folded(1, 1),
            a2trio.transport.Folded(2, 2),
        ]
        assert (fold.state, fold.index) == (2, 2)
        await client.set_presence("r1", "ann", {"cursor": {"x": 1, "y": 2}})
        while "ann" not in fold.lane.presence:
            await fold.lane.receive()
        assert fold.lane.presence["ann"]["cursor"].value == {"x": 1, "y": 2}
        # After a reconnect the map is repainted from the new stream's snapshot.
        fold.lane.presence.clear()
        fold.lane.reconnect()
        while "ann" not in fold.lane.presence:
            assert not isinstance(await fold.lane.receive(), wire.EventFrame)
        await client.set_presence("r1", "ann", {"cursor": None})
        while "ann" in fold.lane.presence:
            await fold.lane.receive()


@guarded(20)
async def test_a_lost_socket_reconnects_and_resumes() -> None:
    store = memory()
    server = a2trio.Server(orders, store=store)
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.1
    errors: list[a2trio.A2Error | None] = []

    def policy(session_id: str, error: a2trio.A2Error | None, attempt: int) -> float:
        errors.append(error)
        return 0.05

    app = cast("hypercorn.typing.ASGIFramework", asgi(server))
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        serve = functools.partial(hypercorn.trio.serve, app, config, shutdown_trigger=stop.wait)
        [base] = await nursery.start(serve)
        config.bind = [base.removeprefix("http://")]
        async with (
            open_client(ws_url(base, "/orders/ws"), reconnect=policy) as client,
            client.subscribe("s1") as lane,
        ):
            [a] = await client.push("s1", ordered("a"))
            assert await lane.receive() == event_frame(a)
            stop.set()  # hypercorn shuts down and drops the socket
            await lane.connection.wait_for(lambda s: isinstance(s, Connecting) and s.reconnects > 0)
            stop = trio.Event()
            # A new server process, as it were: a new Server on the same store.
            again = cast("hypercorn.typing.ASGIFramework", asgi(a2trio.Server(orders, store=store)))
            serve = functools.partial(
                hypercorn.trio.serve, again, config, shutdown_trigger=stop.wait
            )
            await nursery.start(serve)
            await client.push("s1", ordered("after"))
            frame = await lane.receive()
            assert isinstance(frame, wire.EventFrame)
            assert (frame.index, frame.payload) == (2, {"item": "after", "qty": 1})
            live = state_of(lane)
            assert isinstance(live, Live)
            assert live.reconnects >= 1
            assert errors[0] is not None
            assert errors[0].code is a2trio.ErrorCode.STORE_UNAVAILABLE
        stop.set()


@guarded(20)
async def test_the_callers_error_is_not_a_group() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base:
        with pytest.raises(KeyError):
            async with open_client(ws_url(base, "/orders/ws")) as client:
                async with client.subscribe("s1", start_after=0):
                    raise KeyError("mine")
