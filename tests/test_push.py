"""A push is all or nothing, and ``validate_push`` fails closed (issue 17).

The regression: a push with events and presence whose presence half
``validate_push`` refused stored the events and answered 403, so each retry
without ids added another copy.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import a2trio
from a2trio.stores import memory
from a2trio.transport import asgi
from tests.test_transport import (
    collect_client_garbage,
    guarded,
    push_body,
    pytestmark,
    rooms,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


def refuse_presence(validation: a2trio.PushValidation) -> bool:
    return validation.presence is None


@guarded(20)
async def test_a_push_whose_presence_half_is_refused_writes_nothing() -> None:
    server = a2trio.Server(rooms, store=memory(), validate_push=refuse_presence)
    async with serving(asgi(server)) as base, httpx.AsyncClient(base_url=base) as c:
        body = push_body(
            {"type": "note", "payload": {"text": "hi"}},
            presence={"participant": "ann", "values": {"cursor": {"x": 1, "y": 2}}},
        )
        for _ in range(3):
            refused = await c.post("/rooms/r1", json=body)
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "FORBIDDEN"
        assert (await c.get("/rooms/r1")).json() == {"events": []}
        alone = await c.post(
            "/rooms/r1", json=push_body({"type": "note", "payload": {"text": "x"}})
        )
        assert alone.status_code == 200


async def test_session_push_checks_both_halves_before_writing() -> None:
    asked: list[tuple[int, str | None]] = []

    def refuse_mallory(validation: a2trio.PushValidation) -> bool:
        participant = validation.presence.participant if validation.presence else None
        asked.append((len(validation.events), participant))
        return participant != "mallory"

    async with a2trio.Server(rooms, store=memory(), validate_push=refuse_mallory) as server:
        room = server.session("r1")
        note = a2trio.PushedEvent("note", {"text": "hi"})
        cursor = {"cursor": {"x": 1, "y": 1}}
        with pytest.raises(a2trio.A2Error, match="FORBIDDEN"):
            await room.push([note], a2trio.PushedPresence("mallory", cursor))
        with pytest.raises(a2trio.A2Error, match="UNKNOWN_PRESENCE_FIELD"):
            await room.push([note], a2trio.PushedPresence("ann", {"mood": None}))
        with pytest.raises(a2trio.A2Error, match="INVALID_PAYLOAD"):
            await room.push([a2trio.PushedEvent("note", {})], a2trio.PushedPresence("ann", cursor))
        assert await room.history() == []
        assert await room.presence() == {}
        with pytest.raises(TypeError, match="push needs events, presence or both"):
            await room.push([])
        [event] = await room.push([note], a2trio.PushedPresence("ann", cursor))
        assert event.index == 1
        assert set(await room.presence()) == {"ann"}
    assert asked == [(1, None), (0, "mallory")] + [(1, None), (0, "ann")] * 3


@pytest.mark.parametrize("verdict", [None, 0, "", "yes", 1])
async def test_validate_push_fails_closed(verdict: Any) -> None:
    async def hook(validation: a2trio.PushValidation) -> Any:
        return verdict

    async with a2trio.Server(rooms, store=memory(), validate_push=hook) as server:
        with pytest.raises(a2trio.A2Error) as info:
            await server.session("r1").append(a2trio.PushedEvent("note", {"text": "x"}))
        assert info.value.code == a2trio.ErrorCode.FORBIDDEN
        assert await server.session("r1").history() == []
