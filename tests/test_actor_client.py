"""The Trio actor client (``transport/actor_client.py``) against a real hypercorn."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

import a2trio
from a2trio.stores import memory
from a2trio.transport import ActorRequestError, Operation, Request, asgi, open_actor_client
from examples.vault import PublicVault, public_view, vault
from tests.test_transport import FAST, collect_client_garbage, guarded, serving

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]
__all__ = ["collect_client_garbage"]


def _app(**options: Any) -> a2trio.transport.App:
    server = a2trio.Server(vault, store=memory())
    return asgi(server, limits=FAST, views={"vault": public_view}, **options)


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
            open_actor_client("", "vault", "bob", http=http) as mallory,
        ):
            for attempt in (mallory.state(), mallory.call("deposit", {"amount": 1})):
                with pytest.raises(ActorRequestError) as forbidden:
                    await attempt
                assert forbidden.value.status == 403
            with pytest.raises(ActorRequestError) as stream:
                async with mallory.follow():
                    pass
            assert stream.value.status == 403
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
async def test_a_stream_error_frame_is_an_actor_request_error() -> None:
    app = _app()
    async with serving(app) as base, open_actor_client(base, "vault", "dave") as dave:
        async with dave.follow() as states:
            await states.receive()
            while app.revoke(lambda request, op: True, "gone") < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
            with pytest.raises(ActorRequestError, match="the stream ended: gone") as ended:
                await states.receive()
            assert ended.value.error is not None
            assert ended.value.error.code is a2trio.ErrorCode.FORBIDDEN


@guarded(20)
async def test_a_stream_that_ends_ends_the_feed() -> None:
    async def one_frame(request: httpx.Request) -> httpx.Response:
        body = b'id: 1\nevent: state\ndata: {"state": 1, "index": 1}\n\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    transport = httpx.MockTransport(one_frame)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
        open_actor_client("", "a", "b", http=http) as client,
        client.follow() as states,
    ):
        assert await states.receive() == a2trio.ActorState(1, 1)
        with pytest.raises(StopAsyncIteration):
            await states.receive()


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


@guarded(20)
async def test_network_failures_on_the_stream_are_actor_request_errors() -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        if "startAfter" in str(request.url):
            raise httpx.ConnectError("refused", request=request)

        async def body() -> Any:
            yield b'event: state\ndata: {"state": 1, "index": 1}\n\n'
            raise httpx.ReadError("reset", request=request)

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    transport = httpx.MockTransport(broken)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
        open_actor_client("", "a", "b", http=http) as client,
    ):
        async with client.follow() as states:
            assert await states.receive() == a2trio.ActorState(1, 1)
            with pytest.raises(ActorRequestError, match="the stream failed") as lost:
                await states.receive()
            assert lost.value.status is None
        with pytest.raises(ActorRequestError, match=r"\(stream\) failed") as refused:
            async with client.follow():
                pass
        assert refused.value.status is None
