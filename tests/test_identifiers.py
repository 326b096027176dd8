"""Session and event ids: one rule at the surface, the same on every store (issue 17).

The regression this pins: PostgreSQL ends text at the first NUL, so
``/orders/victim%00x`` was authorized as ``victim\\x00x`` and then wrote to and
read from ``victim``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio_websocket

import a2trio
from a2trio.identifiers import MAX_ID_LENGTH, check_event_id, check_session_id
from a2trio.stores.base import Store
from a2trio.transport import Operation, Request, asgi
from tests.backends import postgres as pg_backend
from tests.test_transport import (
    Ordered,
    collect_client_garbage,
    guarded,
    ordered,
    orders,
    push_body,
    pytestmark,
    serving,
    ws_url,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

REFUSED = [
    "victim\x00anything",
    "a\x1fb",
    "line\nbreak",
    "tab\there",
    "del\x7f",
    "c1\x85",
    "surrogate\ud800",
    "x" * (MAX_ID_LENGTH + 1),
]
ACCEPTED = ["s1", "name@owner", "a/b c", "ünïcödé", "🙂" * MAX_ID_LENGTH, "%00"]


@pytest.mark.parametrize("value", REFUSED)
def test_refused_ids(value: str) -> None:
    with pytest.raises(ValueError, match=r"^session id "):
        check_session_id(value)
    with pytest.raises(ValueError, match=r"^event id "):
        check_event_id(value)
    server = a2trio.Server(orders, store=a2trio.stores.memory())
    with pytest.raises(ValueError, match=r"^session id "):
        server.session(value)
    with pytest.raises(ValueError, match=r"^event id "):
        orders.event("ordered", Ordered("x"), id=value)


@pytest.mark.parametrize("value", ["", 3, None, b"s1"])
def test_ids_must_be_non_empty_strings(value: object) -> None:
    with pytest.raises(TypeError, match=r"^session id must be a non-empty string"):
        check_session_id(value)


@asynccontextmanager
async def open_backend(name: str) -> AsyncIterator[Store]:
    if name == "postgres":
        async with pg_backend.open_store(a2trio.clock.SYSTEM_CLOCK) as store:
            yield store
        return
    if name == "sqlite":
        async with a2trio.stores.sqlite(":memory:") as sqlite_store:
            yield sqlite_store
        return
    async with a2trio.stores.memory() as memory_store:
        yield memory_store


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_every_accepted_id_is_kept_exactly(backend: str) -> None:
    """The longest ids of the widest characters round-trip on every store
    (on Postgres the session key rides in a NOTIFY payload)."""
    async with open_backend(backend) as store, a2trio.Server(orders, store=store) as server:
        for n, value in enumerate(ACCEPTED):
            session = server.session(value)
            [event] = await session.append(orders.event("ordered", Ordered(str(n)), id=value))
            assert (event.id, event.session_id) == (value, value)
            [read] = await session.history()
            assert (read.id, read.session_id, read.payload) == (value, value, Ordered(str(n)))


def owner_suffix(request: Request, op: Operation) -> bool:
    """The policy the bypass beat: a user may touch only sessions ``*@<user>``."""
    return op.session_id.endswith("@" + request.headers.get("x-user", "?"))


@guarded(30)
async def test_nul_in_a_session_id_is_refused_on_every_lane_on_postgres() -> None:
    async with pg_backend.open_store(a2trio.clock.SYSTEM_CLOCK) as store:
        server = a2trio.Server(orders, store=store)
        async with (
            serving(asgi(server, authorize=owner_suffix)) as base,
            httpx.AsyncClient(base_url=base, headers={"x-user": "mallory"}) as c,
        ):
            victim = {"x-user": "victim"}
            first = await c.post(
                "/orders/board@victim", json=push_body(ordered("mine")), headers=victim
            )
            assert first.status_code == 200
            path = "/orders/board@victim%00x@mallory"
            for response in (
                await c.post(path, json=push_body(ordered("stolen"))),
                await c.get(path),
                await c.get(path, headers={"accept": "text/event-stream"}),
            ):
                assert response.status_code == 400, response.text
                error = response.json()["error"]
                assert error["code"] == "INVALID_PAYLOAD"
                assert "U+0000" in error["message"]
            with pytest.raises(trio_websocket.ConnectionRejected) as refused:
                async with trio_websocket.open_websocket_url(
                    ws_url(base, path + "/ws"), extra_headers=[(b"x-user", b"mallory")]
                ):
                    pass
            assert refused.value.status_code == 400
            async with trio_websocket.open_websocket_url(
                ws_url(base, "/orders/ws"), extra_headers=[(b"x-user", b"mallory")]
            ) as ws:
                tagged = "board@victim\x00x@mallory"
                await ws.send_message(
                    json.dumps({"kind": "subscribe", "sessions": [{"id": tagged}]})
                )
                notice = json.loads(await ws.get_message())
                assert (notice["reason"], notice["error"]["code"]) == ("refused", "INVALID_PAYLOAD")
                await ws.send_message(
                    json.dumps(
                        {
                            "kind": "push",
                            "req": 1,
                            "sessionId": tagged,
                            "events": [ordered("stolen")],
                        }
                    )
                )
                ack = json.loads(await ws.get_message())
                assert (ack["req"], ack["error"]["code"]) == (1, "INVALID_PAYLOAD")
            history = (await c.get("/orders/board@victim", headers=victim)).json()["events"]
            assert [e["payload"]["item"] for e in history] == ["mine"]


@guarded(20)
async def test_percent_decoding_is_strict() -> None:
    """``%FF`` was decoded to U+FFFD, so ``%FF``, ``%FE`` and ``%EF%BF%BD`` were one session."""
    server = a2trio.Server(orders, store=a2trio.stores.memory())
    async with (
        serving(asgi(server)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        for path in ("/orders/%FF", "/orders/%FE", "/orders/a%C3"):
            response = await c.post(path, json=push_body(ordered("x")))
            assert response.status_code == 400, path
            assert response.json()["error"]["code"] == "INVALID_PAYLOAD"
        with pytest.raises(trio_websocket.ConnectionRejected) as refused:
            async with trio_websocket.open_websocket_url(ws_url(base, "/orders/%FF/ws")):
                pass
        assert refused.value.status_code == 400
        accepted = await c.post("/orders/%EF%BF%BD", json=push_body(ordered("x")))
        assert accepted.status_code == 200
        assert accepted.json()["events"][0]["sessionId"] == "\ufffd"


@guarded(20)
async def test_a_malformed_percent_escape_is_refused() -> None:
    """``%G1`` was taken literally, so ``/notes/%G1`` and ``/notes/%25G1`` were
    one session (issue 29)."""
    server = a2trio.Server(orders, store=a2trio.stores.memory())
    async with (
        serving(asgi(server)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        for path in ("/orders/%G1", "/orders/a%", "/orders/a%4", "/orders/%%41", "/orders/%4G"):
            for response in (
                await c.post(path, json=push_body(ordered("x"))),
                await c.get(path),
            ):
                assert response.status_code == 400, path
                assert response.json()["error"]["code"] == "INVALID_PAYLOAD"
                assert "percent-escape" in response.json()["error"]["message"]
        with pytest.raises(trio_websocket.ConnectionRejected) as refused:
            async with trio_websocket.open_websocket_url(ws_url(base, "/orders/%G1/ws")):
                pass
        assert refused.value.status_code == 400
        accepted = await c.post("/orders/%25G1", json=push_body(ordered("x")))
        assert accepted.status_code == 200
        assert accepted.json()["events"][0]["sessionId"] == "%G1"


rooms = a2trio.contract("rooms", events={"ordered": Ordered}, presence={"typing": bool})


@pytest.mark.parametrize("value", REFUSED)
async def test_refused_participants(value: str) -> None:
    async with a2trio.Server(rooms, store=a2trio.stores.memory()) as server:
        with pytest.raises(ValueError, match=r"^presence participant "):
            await server.session("r1").set_presence(value, {"typing": True})
        assert await server.session("r1").presence() == {}
