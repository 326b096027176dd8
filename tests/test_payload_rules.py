"""Payload values every store keeps faithfully, or a 400 (issue 17).

PostgreSQL's jsonb cannot hold U+0000, so a NUL in a payload string answered
503 on every retry there while SQLite stored it; and payloads nested about a
thousand levels deep raised ``RecursionError`` (503 "internal error" over HTTP,
a 1011 socket close). Both are now ``INVALID_PAYLOAD`` on every store, before
anything is written.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import pytest
import trio_websocket

import a2trio
from a2trio.contract import MAX_DEPTH
from a2trio.transport import asgi
from tests.test_identifiers import open_backend
from tests.test_transport import (
    collect_client_garbage,
    frame,
    guarded,
    pytestmark,
    serving,
    ws_url,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


class Blob(msgspec.Struct, frozen=True):
    data: Any
    label: str = ""


blobs = a2trio.contract("blobs", events={"blob": Blob}, presence={"note": Any})


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


UNSTORABLE = [
    ({"data": "a\x00b"}, "$.data", "strings may not contain U+0000"),
    ({"data": {"k\x00": 1}}, "$.data", "keys may not contain U+0000"),
    ({"data": 1, "label": "\x00"}, "$.label", "strings may not contain U+0000"),
    ({"data": nested(MAX_DEPTH)}, None, f"nested deeper than {MAX_DEPTH} levels"),
    ({"data": nested(5_000)}, "$", f"nested deeper than {MAX_DEPTH} levels"),
]


@pytest.mark.parametrize(("payload", "path", "message"), UNSTORABLE)
def test_unstorable_payloads_are_invalid(payload: Any, path: str | None, message: str) -> None:
    with pytest.raises(a2trio.A2Error) as info:
        blobs.event("blob", payload)
    assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
    assert info.value.details is not None
    assert info.value.details["message"] == message
    if path is not None:
        assert info.value.details["path"] == path


def test_the_deepest_allowed_payload_is_accepted() -> None:
    assert blobs.event("blob", {"data": nested(MAX_DEPTH - 1)}).payload.data == nested(
        MAX_DEPTH - 1
    )


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_every_store_refuses_the_same_values_and_keeps_the_rest(backend: str) -> None:
    kept = {"data": {"text": "tab\tand ünïcödé 🙂", "deep": nested(MAX_DEPTH - 2)}}
    async with open_backend(backend) as store:
        async with a2trio.Server(blobs, store=store) as server:
            session = server.session("s1")
            for payload, _, _ in UNSTORABLE:
                with pytest.raises(a2trio.A2Error) as info:
                    await session.append(a2trio.PushedEvent("blob", payload))
                assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
                with pytest.raises(a2trio.A2Error) as info:
                    await session.set_presence("ann", {"note": payload})
                assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
            assert await session.history() == []
            assert await session.presence() == {}
            [event] = await session.append(blobs.event("blob", kept))
            [read] = await session.history()
            assert read.payload == event.payload == Blob(kept["data"])


@guarded(30)
async def test_deep_and_nul_payloads_answer_400_over_http_and_an_error_ack_on_sockets() -> None:
    async with open_backend("postgres") as store:
        server = a2trio.Server(blobs, store=store)
        async with serving(asgi(server)) as base, httpx.AsyncClient(base_url=base) as c:
            bodies = [
                json.dumps({"events": [{"type": "blob", "payload": p}]}).encode()
                for p, _, _ in UNSTORABLE[:4]
            ]
            # Deeper than msgspec's decoder recurses: refused while decoding.
            bodies.append(b'{"events": [{"type": "blob", "payload": {"data": ' + b"[" * 5_000)
            for body in bodies:
                response = await c.post("/blobs/s1", content=body)
                assert response.status_code == 400, response.text
                assert response.json()["error"]["code"] == "INVALID_PAYLOAD"
            async with trio_websocket.open_websocket_url(ws_url(base, "/blobs/s1/ws")) as ws:
                deep = b'{"kind": "push", "req": 1, "events": ' + b"[" * 5_000 + b"]" * 5_000
                await ws.send_message(deep + b"}")
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await frame(ws)
                assert closed.value.reason is not None
                assert closed.value.reason.code == 1007  # unreadable frame, not 1011
            async with trio_websocket.open_websocket_url(ws_url(base, "/blobs/s1/ws")) as ws:
                event = {"type": "blob", "payload": {"data": "a\x00"}}
                await ws.send_message(json.dumps({"kind": "push", "req": 2, "events": [event]}))
                ack = await frame(ws)
                assert (ack["req"], ack["error"]["code"]) == (2, "INVALID_PAYLOAD")
            history = await c.get("/blobs/s1")
            assert history.json() == {"events": []}
