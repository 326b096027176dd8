"""The actor lanes (``transport/server/actors.py``) against a real hypercorn:
calls, snapshots, SSE and socket state frames, authorize, views."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import pytest
import trio
import trio_websocket

import a2trio
from a2trio.stores import memory
from a2trio.transport import (
    CallOperation,
    Operation,
    Request,
    StateOperation,
    StreamOperation,
    asgi,
)
from examples.vault import public_view, vault
from tests.test_transport import (
    FAST,
    chunks_of,
    client,
    collect_client_garbage,
    frame,
    guarded,
    serving,
    sse_frames,
    ws_url,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


__all__ = ["collect_client_garbage"]  # the autouse fixture, in this module's filters too


def _app(**options: Any) -> a2trio.transport.App:
    return asgi(a2trio.Server(vault, store=memory()), limits=FAST, **options)


def _deposit(amount: int, message_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"event": "deposit", "input": {"amount": amount}}
    if message_id is not None:
        body["messageId"] = message_id
    return body


@guarded(20)
async def test_calls_and_snapshots_answer_state_and_index_uncached() -> None:
    async with serving(_app()) as base, client(base) as c:
        first = await c.post("/vault/alice", json=_deposit(50, "m1"))
        assert first.status_code == 200, first.text
        assert first.json() == {"state": {"balance": 50, "audit": ["+50"]}, "index": 1}
        assert first.headers["cache-control"] == "private, no-store"
        await c.post("/vault/alice", json=_deposit(1))
        retried = await c.post("/vault/alice", json=_deposit(50, "m1"))
        assert retried.json() == first.json(), "a retry answers the original"
        snapshot = await c.get("/vault/alice", params={"snapshot": "1"})
        assert snapshot.json() == {"state": {"balance": 51, "audit": ["+50", "+1"]}, "index": 2}
        assert snapshot.headers["cache-control"] == "private, no-store"


@guarded(20)
async def test_a_refusal_is_409_and_commits_nothing() -> None:
    async with serving(_app()) as base, client(base) as c:
        await c.post("/vault/bob", json=_deposit(5))
        refused = await c.post("/vault/bob", json={"event": "withdraw", "input": {"amount": 9}})
        assert refused.status_code == 409
        assert refused.json() == {
            "error": {"code": "CALL_REFUSED", "message": "insufficient funds: the balance is 5"}
        }
        snapshot = await c.get("/vault/bob?snapshot=1")
        assert snapshot.json()["index"] == 1


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/vault/a", {"event": "steal", "input": {}}, 400, "UNKNOWN_EVENT_TYPE"),
        ("POST", "/vault/a", _deposit(0), 400, "INVALID_PAYLOAD"),
        ("POST", "/vault/a", {"input": {"amount": 1}}, 400, "INVALID_PAYLOAD"),
        ("POST", "/vault/a", {"events": []}, 400, "INVALID_PAYLOAD"),
        ("POST", "/vault/a", {**_deposit(1), "messageId": ""}, 400, "INVALID_PAYLOAD"),
        ("POST", "/vault/a", {**_deposit(1), "messageId": "x\u0000"}, 400, "INVALID_PAYLOAD"),
        ("GET", "/vault/a", None, 400, "INVALID_PAYLOAD"),
        ("PUT", "/vault/a", None, 405, "INVALID_PAYLOAD"),
        ("GET", "/vault/a?snapshot=1&startAfter=x", None, 200, None),
    ],
)
@guarded(20)
async def test_bad_requests_answer_the_envelope_and_write_nothing(
    method: str, path: str, body: Any, status: int, code: str | None
) -> None:
    async with serving(_app()) as base, client(base) as c:
        response = await c.request(method, path, json=body)
        assert response.status_code == status, response.text
        if code is not None:
            assert response.json()["error"]["code"] == code
        assert (await c.get("/vault/a?snapshot=1")).json()["index"] == 0


@guarded(20)
async def test_malformed_json_is_400() -> None:
    async with serving(_app()) as base, client(base) as c:
        response = await c.post("/vault/a", content=b"{nope")
        assert response.status_code == 400
        assert "malformed call body" in response.json()["error"]["message"]


@guarded(20)
async def test_the_stream_sends_state_frames_and_resumes_from_an_index() -> None:
    async with serving(_app()) as base, client(base) as c:
        await c.post("/vault/carol", json=_deposit(1))
        async with c.stream("GET", "/vault/carol", headers={"accept": "text/event-stream"}) as r:
            assert r.headers["cache-control"] == "private, no-store"
            async with aclosing(sse_frames(r)) as frames:
                first = await anext(frames)
                assert (first.event, first.id) == ("state", "1")
                assert json.loads(first.data) == {
                    "state": {"balance": 1, "audit": ["+1"]},
                    "index": 1,
                }
                await c.post("/vault/carol", json=_deposit(2))
                second = await anext(frames)
                assert (second.id, json.loads(second.data)["state"]["balance"]) == ("2", 3)
        await c.post("/vault/carol", json=_deposit(3))
        for headers, params in (({"last-event-id": "2"}, {}), ({}, {"startAfter": "2"})):
            async with c.stream(
                "GET",
                "/vault/carol",
                headers={"accept": "text/event-stream", **headers},
                params=params,
            ) as r:
                async with aclosing(sse_frames(r)) as frames:
                    resumed = await anext(frames)
                    assert (resumed.id, json.loads(resumed.data)["index"]) == ("3", 3)


@guarded(20)
async def test_the_socket_sends_state_frames() -> None:
    async with serving(_app()) as base, client(base) as c:
        await c.post("/vault/dave", json=_deposit(4))
        async with trio_websocket.open_websocket_url(ws_url(base, "/vault/dave/ws")) as ws:
            assert await frame(ws) == {
                "kind": "state",
                "state": {"balance": 4, "audit": ["+4"]},
                "index": 1,
            }
            await ws.send_message('{"kind": "whatever"}')  # read and ignored
            await c.post("/vault/dave", json=_deposit(1))
            assert (await frame(ws))["index"] == 2
        async with trio_websocket.open_websocket_url(
            ws_url(base, "/vault/dave/ws?startAfter=2")
        ) as ws:
            await c.post("/vault/dave", json=_deposit(1))
            assert (await frame(ws))["index"] == 3
        with pytest.raises(trio_websocket.HandshakeError):
            async with trio_websocket.open_websocket_url(ws_url(base, "/vault/ws")):
                pass


@guarded(20)
async def test_a_view_hides_the_same_fields_on_every_lane() -> None:
    async with serving(_app(views={"vault": public_view})) as base, client(base) as c:
        seen: list[str] = []
        async with trio_websocket.open_websocket_url(ws_url(base, "/vault/erin/ws")) as ws:
            seen.append(json.dumps(await frame(ws)))
            answer = await c.post("/vault/erin", json=_deposit(7, "m"))
            seen.append(answer.text)
            seen.append(json.dumps(await frame(ws)))
            seen.append((await c.post("/vault/erin", json=_deposit(7, "m"))).text)
            seen.append((await c.get("/vault/erin?snapshot=1")).text)
            async with c.stream("GET", "/vault/erin", headers={"accept": "text/event-stream"}) as r:
                async with aclosing(sse_frames(r)) as frames:
                    seen.append((await anext(frames)).data)
        assert json.loads(seen[1]) == {"state": {"balance": 7}, "index": 1}
        for shown in seen:
            assert "audit" not in shown, shown
            assert "+7" not in shown, shown
            assert '"balance"' in shown


async def _async_view(state: Any, request: Request) -> dict[str, int]:
    await trio.lowlevel.checkpoint()
    return {"cents": state.balance * 100}


@guarded(20)
async def test_views_may_be_async_and_are_checked() -> None:
    async with serving(_app(views={"vault": _async_view})) as base, client(base) as c:
        answer = await c.post("/vault/f", json=_deposit(2))
        assert answer.json() == {"state": {"cents": 200}, "index": 1}
    server = a2trio.Server(vault, store=memory())
    with pytest.raises(ValueError, match="views= names 'nope', which is not a mounted actor"):
        asgi(server, views={"nope": public_view})
    with pytest.raises(TypeError, match="the view for 'vault' must be callable"):
        asgi(server, views={"vault": "public"})  # type: ignore[dict-item]
    orders = a2trio.Server(a2trio.contract("orders", events={"e": int}), store=memory())
    with pytest.raises(ValueError, match="not a mounted actor"):
        asgi(orders, views={"orders": public_view})


@guarded(20)
async def test_authorize_is_asked_for_state_stream_and_call() -> None:
    asked: list[Operation] = []
    allow = True

    def authorize(request: Request, operation: Operation) -> bool:
        asked.append(operation)
        return allow

    async with serving(_app(authorize=authorize)) as base, client(base) as c:
        await c.post("/vault/g", json=_deposit(3, "m"))
        await c.get("/vault/g?snapshot=1")
        async with c.stream(
            "GET", "/vault/g?startAfter=1", headers={"accept": "text/event-stream"}
        ) as r:
            assert r.status_code == 200
        async with trio_websocket.open_websocket_url(ws_url(base, "/vault/g/ws")) as ws:
            await ws.send_message("{}")
        assert asked[:4] == [
            CallOperation("vault", "g", "deposit", {"amount": 3}, "m"),
            StateOperation("vault", "g"),
            StreamOperation("vault", "g", 1),
            StreamOperation("vault", "g", 0),
        ]
        allow = False
        refused = [
            await c.post("/vault/g", json=_deposit(1)),
            await c.get("/vault/g?snapshot=1"),
            await c.get("/vault/g", headers={"accept": "text/event-stream"}),
        ]
        assert [r.status_code for r in refused] == [403, 403, 403]
        assert {r.json()["error"]["code"] for r in refused} == {"FORBIDDEN"}
        with pytest.raises(trio_websocket.HandshakeError):
            async with trio_websocket.open_websocket_url(ws_url(base, "/vault/g/ws")):
                pass
        allow = True
        assert (await c.get("/vault/g?snapshot=1")).json()["index"] == 1


@guarded(20)
async def test_revoking_access_ends_streams_and_sockets() -> None:
    app = _app()
    async with serving(app) as base, client(base) as c:
        async with c.stream("GET", "/vault/h", headers={"accept": "text/event-stream"}) as r:
            async with aclosing(sse_frames(r)) as frames:
                assert (await anext(frames)).event == "state"
                async with trio_websocket.open_websocket_url(ws_url(base, "/vault/h/ws")) as ws:
                    await frame(ws)
                    # Both register in their own tasks: no event to wait on.
                    while app.revoke(lambda request, op: True, "gone") < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                        await frame(ws)
                    assert closed.value.reason is not None
                    assert closed.value.reason.code == 1008
                ended = await anext(frames)
                assert ended.event == "error"
                assert json.loads(ended.data)["error"] == {"code": "FORBIDDEN", "message": "gone"}


def _failing_view(state: Any, request: Request) -> Any:
    if state.balance > 1:
        raise RuntimeError("the view broke")
    return {"balance": state.balance}


@guarded(20)
async def test_a_failing_view_ends_the_lanes_with_a_retryable_error() -> None:
    async with serving(_app(views={"vault": _failing_view})) as base, client(base) as c:
        await c.post("/vault/i", json=_deposit(1))
        headers = {"accept": "text/event-stream"}
        async with (
            c.stream("GET", "/vault/i", headers=headers) as r,
            aclosing(sse_frames(r)) as frames,
            trio_websocket.open_websocket_url(ws_url(base, "/vault/i/ws")) as ws,
        ):
            assert (await anext(frames)).event == "state"
            assert (await frame(ws))["index"] == 1
            failed = await c.post("/vault/i", json=_deposit(1))
            assert failed.status_code == 503  # committed: a retry with a messageId is safe
            ended = await anext(frames)
            assert ended.event == "error"
            assert json.loads(ended.data)["error"]["code"] == "STORE_UNAVAILABLE"
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await frame(ws)
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1011


@guarded(20)
async def test_idle_lanes_send_heartbeats() -> None:
    async with serving(_app()) as base, client(base) as c:
        headers = {"accept": "text/event-stream"}
        async with c.stream("GET", "/vault/j", headers=headers) as r:
            raw = b""
            async with chunks_of(r) as chunks:
                async for chunk in chunks:
                    raw += chunk
                    if b": ping" in raw:
                        break
        async with trio_websocket.open_websocket_url(ws_url(base, "/vault/j/ws")) as ws:
            kinds = {json.loads(await ws.get_message())["kind"] for _ in range(2)}
            assert kinds == {"state", "ping"}


async def test_a_socket_that_leaves_before_connecting_is_left_alone() -> None:
    from a2trio.transport.server.actors import serve_actor_socket

    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    server = a2trio.Server(vault, store=memory())
    request = Request("GET", "/vault/k/ws", {}, {})
    await serve_actor_socket(
        server,
        server.actor("k"),
        request,
        receive,
        send,
        authorize=None,
        limits=FAST,
        view=None,
        grants=a2trio.transport.App([server]).grants,
    )
    assert sent == []


@guarded(20)
async def test_a_call_checks_its_ids_once_on_each_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from a2trio import identifiers
    from a2trio.engine import actor_calls
    from a2trio.transport.server import actors

    checked: list[str] = []

    def counting(value: object) -> str:
        checked.append(str(value))
        return identifiers.check_message_id(value)

    monkeypatch.setattr(actors, "check_message_id", counting)
    monkeypatch.setattr(actor_calls, "check_message_id", counting)
    server = a2trio.Server(vault, store=memory())
    async with serving(asgi(server, limits=FAST)) as base, client(base) as c:
        answered = await c.post("/vault/carol", json=_deposit(5, "m-http"))
        assert answered.status_code == 200, answered.text
        assert checked == ["m-http"], "the HTTP lane checks the messageId at its edge only"
        await server.actor("carol").call("deposit", {"amount": 1}, message_id="m-api")
        assert checked == ["m-http", "m-api"], "an in-process call is checked by its handle"
