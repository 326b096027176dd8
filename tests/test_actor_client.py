"""The Trio actor client (``transport/client/actor_client.py``) against a real hypercorn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import a2trio
from a2trio.stores import memory, sqlite
from a2trio.transport import (
    ActorRequestError,
    Closed,
    Connecting,
    Live,
    Operation,
    Paused,
    Request,
    asgi,
    open_actor_client,
)
from examples.vault import PublicVault, public_view, vault
from tests.test_client_restart import QUICK, Proxy
from tests.test_transport import FAST, collect_client_garbage, guarded, serving

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]
__all__ = ["collect_client_garbage"]


def _app(**options: Any) -> a2trio.transport.App:
    server = a2trio.Server(vault, store=memory())
    return asgi(server, limits=FAST, views={"vault": public_view}, **options)


def pause(actor_id: str, error: a2trio.A2Error | None, attempt: int) -> bool:
    return False


@guarded(20)
async def test_typed_calls_reads_and_on_snapshot() -> None:
    seen: list[a2trio.ActorState[PublicVault]] = []
    async with (
        serving(_app()) as base,
        open_actor_client(
            base, "vault", "alice", state_type=PublicVault, on_snapshot=seen.append
        ) as alice,
    ):
        first = await alice.call("deposit", {"amount": 5}, id="d-1")
        assert first == a2trio.ActorState(PublicVault(5), 1)
        assert alice.latest == first
        second = await alice.call("deposit", {"amount": 1})
        # The retried call answers its original, older answer; on_snapshot sees
        # it, the live view stays on the newer state.
        assert await alice.call("deposit", {"amount": 5}, id="d-1") == first
        assert alice.latest == second
        assert await alice.state() == second
        assert [s.index for s in seen] == [1, 2, 1, 2]


@guarded(20)
async def test_errors_carry_the_status_and_the_servers_error() -> None:
    def authorize(request: Request, operation: Operation) -> bool:
        return request.headers.get("x-user") != "mallory"

    async with serving(_app(authorize=authorize)) as base:
        async with open_actor_client(base, "vault", "bob") as bob:
            with pytest.raises(ActorRequestError) as refused:
                await bob.call("withdraw", {"amount": 1})
            assert refused.value.status == 409
            assert refused.value.error is not None
            assert refused.value.error.code is a2trio.ErrorCode.CALL_REFUSED
            with pytest.raises(ActorRequestError) as unknown:
                await bob.call("steal")
            assert unknown.value.status == 400
            assert bob.latest is None, "a refusal changes nothing"
        headers = {"x-user": "mallory"}
        async with (
            httpx.AsyncClient(base_url=base, headers=headers) as http,
            open_actor_client("", "vault", "bob", http=http, reconnect=pause) as mallory,
        ):
            for attempt in (mallory.state(), mallory.call("deposit", {"amount": 1})):
                with pytest.raises(ActorRequestError) as forbidden:
                    await attempt
                assert forbidden.value.status == 403
            async with mallory.follow() as states:
                with pytest.raises(a2trio.A2Error) as stream:
                    await states.wait_live()
            assert stream.value.code is a2trio.ErrorCode.FORBIDDEN
    async with open_actor_client(base, "vault", "bob") as gone:
        with pytest.raises(ActorRequestError) as lost:
            await gone.call("deposit", {"amount": 1}, id="d")
        assert lost.value.status is None, "no answer: whether it committed is unknown"


@guarded(20)
async def test_follow_moves_forward_only_and_resumes() -> None:
    async with (
        serving(_app()) as base,
        open_actor_client(base, "vault", "carol", state_type=PublicVault) as carol,
    ):
        async with (
            carol.follow() as states,
            open_actor_client(base, "vault", "carol") as other,
        ):
            assert await states.receive() == a2trio.ActorState(PublicVault(0), 0)
            await carol.call("deposit", {"amount": 2})  # adopted first, by the answer
            await other.call("deposit", {"amount": 3})
            # Frame 1 is not newer than the answer already adopted: skipped.
            assert await states.receive() == a2trio.ActorState(PublicVault(5), 2)
            assert carol.latest == a2trio.ActorState(PublicVault(5), 2)
            await other.call("deposit", {"amount": 10})
        async with carol.follow() as states:
            assert await states.receive() == a2trio.ActorState(PublicVault(15), 3)


@guarded(20)
async def test_a_stream_error_frame_is_the_connections_error() -> None:
    app = _app()
    async with (
        serving(app) as base,
        open_actor_client(base, "vault", "dave", reconnect=pause) as dave,
        dave.follow() as states,
    ):
        await states.receive()
        while app.revoke(lambda request, op: True, "gone") < 1:  # noqa: ASYNC110
            await trio.sleep(0.01)
        with pytest.raises(a2trio.A2Error, match="gone") as ended:
            await states.connection.wait_for(lambda s: isinstance(s, Paused))
            await states.wait_live()
        assert ended.value.code is a2trio.ErrorCode.FORBIDDEN
        # Not refused again: reconnect() resumes the stream.
        states.reconnect()
        assert await states.wait_live() == Live(1)
    assert states.state == Closed()


@guarded(20)
async def test_a_stream_that_ends_is_followed_again_from_latest() -> None:
    asked: list[str | None] = []

    async def frames(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("startAfter")
        asked.append(after)
        index = 1 if after is None else int(after) + 1
        body = f'id: {index}\nevent: state\ndata: {{"state": {index}, "index": {index}}}\n\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    transport = httpx.MockTransport(frames)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
        open_actor_client("", "a", "b", http=http, reconnect=QUICK) as client,
        client.follow() as states,
    ):
        assert [await states.receive() for _ in range(3)] == [
            a2trio.ActorState(n, n) for n in (1, 2, 3)
        ]
        assert asked[:3] == [None, "1", "2"]


@guarded(20)
async def test_network_failures_and_bad_frames_lose_the_stream() -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("startAfter")
        if after == "1":
            raise httpx.ConnectError("refused", request=request)

        async def body() -> Any:
            yield b'event: state\ndata: {"state": 1, "index": 1}\n\n'
            raise httpx.ReadError("reset", request=request)

        if after == "2":
            return httpx.Response(
                200, content=b'event: state\ndata: {"state": "x", "index": 3}\n\n'
            )
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    transport = httpx.MockTransport(broken)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
        open_actor_client("", "a", "b", http=http, reconnect=pause, state_type=int) as client,
        client.follow() as states,
    ):
        assert await states.receive() == a2trio.ActorState(1, 1)
        lost = await states.connection.wait_for(lambda s: isinstance(s, Paused))
        assert isinstance(lost, Paused)
        assert lost.error is not None
        assert lost.error.code is a2trio.ErrorCode.STORE_UNAVAILABLE
        assert "ReadError" in lost.error.message
        states.reconnect()
        refused = await states.connection.wait_for(lambda s: s != lost and isinstance(s, Paused))
        assert isinstance(refused, Paused)
        assert refused.error is not None
        assert "ConnectError" in refused.error.message
        client.latest = a2trio.ActorState(2, 2)
        states.reconnect()
        unreadable = await states.connection.wait_for(
            lambda s: s != refused and isinstance(s, Paused)
        )
        assert isinstance(unreadable, Paused)
        assert unreadable.error is not None
        assert "unreadable answer" in unreadable.error.message


@guarded(20)
async def test_a_silent_stream_trips_the_watchdog() -> None:
    # heartbeat_s far above the watchdog: the stream is silent after its first frame.
    server = a2trio.Server(vault, store=memory())
    app = asgi(server, limits=a2trio.transport.Limits(heartbeat_s=60))
    async with (
        serving(app) as base,
        open_actor_client(base, "vault", "gus", reconnect=pause, watchdog_s=0.2) as gus,
        gus.follow() as states,
    ):
        await states.receive()
        silent = await states.connection.wait_for(lambda s: isinstance(s, Paused))
        assert isinstance(silent, Paused)
        assert silent.error is not None
        assert silent.error.message == "stream lost: no frame for 0.2 s"


@guarded(30)
async def test_follow_reconnects_after_a_cut_stream_and_resumes_from_latest() -> None:
    asked: list[tuple[str, a2trio.ErrorCode | None, int]] = []

    def policy(actor_id: str, error: a2trio.A2Error | None, attempt: int) -> bool:
        asked.append((actor_id, error.code if error else None, attempt))
        return False  # paused: the test writes while the stream is down, then resumes it

    proxy = Proxy()
    async with serving(_app()) as base, trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        proxy.target = int(base.rsplit(":", 1)[1])
        async with (
            open_actor_client(
                f"http://127.0.0.1:{proxy.port}",
                "vault",
                "erin",
                state_type=PublicVault,
                reconnect=policy,
            ) as erin,
            open_actor_client(base, "vault", "erin", state_type=PublicVault) as other,
            erin.follow() as states,
        ):
            assert await states.receive() == a2trio.ActorState(PublicVault(0), 0)
            assert states.state == Live(0)
            proxy.drop_next_answer = True  # the next heartbeat never arrives: cut
            down = await states.connection.wait_for(lambda s: isinstance(s, Paused))
            assert isinstance(down, Paused)
            assert down.error is not None
            assert down.error.code is a2trio.ErrorCode.STORE_UNAVAILABLE
            await other.call("deposit", {"amount": 4})  # committed while the stream is down
            states.reconnect()
            assert await states.receive() == a2trio.ActorState(PublicVault(4), 1)
            assert states.state == Live(1)
            await other.call("deposit", {"amount": 1})
            assert await states.receive() == a2trio.ActorState(PublicVault(5), 2)
        nursery.cancel_scope.cancel()
    assert asked == [("erin", a2trio.ErrorCode.STORE_UNAVAILABLE, 1)]


async def serve_until(
    app: a2trio.transport.App, stop: trio.Event, *, task_status: trio.TaskStatus[str]
) -> None:
    async with serving(app) as base:
        task_status.started(base)
        await stop.wait()


@guarded(30)
async def test_follow_rides_out_a_server_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "a2.db")

    def app() -> a2trio.transport.App:
        server = a2trio.Server(vault, store=sqlite(db))
        return asgi(server, limits=FAST, views={"vault": public_view})

    proxy, stop = Proxy(), trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        base = await nursery.start(serve_until, app(), stop)
        proxy.target = int(base.rsplit(":", 1)[1])
        async with (
            open_actor_client(
                f"http://127.0.0.1:{proxy.port}",
                "vault",
                "fay",
                state_type=PublicVault,
                reconnect=QUICK,
            ) as fay,
            fay.follow() as states,
        ):
            assert await states.receive() == a2trio.ActorState(PublicVault(0), 0)
            # Adopted from the answer: the stream resumes after it.
            assert await fay.call("deposit", {"amount": 2}) == fay.latest
            proxy.target = None  # while the server is down, the proxy refuses
            stop.set()
            await states.connection.wait_for(
                lambda s: isinstance(s, Connecting) and s.reconnects > 0
            )
            again = await nursery.start(serve_until, app(), trio.Event())
            async with open_actor_client(again, "vault", "fay", state_type=PublicVault) as other:
                await other.call("deposit", {"amount": 3})
            proxy.target = int(again.rsplit(":", 1)[1])
            assert await states.receive() == a2trio.ActorState(PublicVault(5), 2)
            assert isinstance(states.state, Live)
            assert states.state.reconnects > 0
        nursery.cancel_scope.cancel()


@guarded(20)
async def test_an_unreadable_answer_is_an_actor_request_error() -> None:
    async def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"state": "x"}')

    transport = httpx.MockTransport(garbage)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
        open_actor_client("", "a", "b", http=http, state_type=int) as client,
    ):
        with pytest.raises(ActorRequestError, match="unreadable answer"):
            await client.state()
