"""Upcasting over the network lanes (issue 35): HTTP readers get the current
payload in the seed's wire format (no version field), and an event that cannot
be upcast answers the unexpected-failure envelope, logged."""

from __future__ import annotations

import logging

import pytest

import a2trio
from a2trio.stores import memory
from a2trio.transport import asgi
from tests.test_transport import client, collect_client_garbage, pytestmark, serving
from tests.test_upcasting import Ordered, current, written_by_the_first_version

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


async def test_http_readers_get_the_current_payload_in_the_seeds_wire_format(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = memory()
    await written_by_the_first_version(store, "s1", "pen")
    server = a2trio.Server(current, store=store, run_handlers=False)
    app = asgi(server, inspect=True, authorize=lambda request, op: True)
    async with serving(app) as base, client(base) as c:
        pushed = await c.post(
            "/orders/s1",
            json={"events": [{"type": "ordered", "payload": {"sku": "INK", "quantity": 2}}]},
        )
        assert pushed.status_code == 200, pushed.text
        response = await c.get("/orders/s1")
        assert response.status_code == 200, response.text
        events = response.json()["events"]
        assert [e["payload"] for e in events] == [
            {"sku": "PEN", "quantity": 1, "note": ""},
            {"sku": "INK", "quantity": 2, "note": ""},
        ]
        # The seed's WireEvent keys: the version is no wire field.
        keys = {"id", "type", "payload", "index", "sessionId", "createdAt"}
        assert all(set(e) == keys for e in events)
        assert [r.version for r in await store.read(server.key("s1"))] == [None, 3]
        assert server.contract.decode("ordered", events[0]["payload"]) == Ordered("PEN", 1)
        await written_by_the_first_version(store, "s1", "cursed")
        with caplog.at_level(logging.ERROR, logger="a2trio"):
            broken = await c.get("/orders/s1")
        assert broken.status_code == 503
        assert broken.json()["error"] == {"code": "STORE_UNAVAILABLE", "message": "internal error"}
        [error] = [r.exc_info[1] for r in caplog.records if r.exc_info]
        assert isinstance(error, a2trio.UpcastError)
        assert error.index == 3
        # The inspector still shows every event, the unreadable one as stored.
        inspected = await c.get("/_a2/inspect/orders/s1")
        assert inspected.status_code == 200, inspected.text
        rows = inspected.json()["events"]
        assert [(r["version"], r["event"]["payload"]) for r in rows] == [
            (1, {"sku": "PEN", "quantity": 1, "note": ""}),
            (3, {"sku": "INK", "quantity": 2, "note": ""}),
            (1, {"item": "cursed"}),
        ]
        assert [r["upcastError"] is None for r in rows] == [True, True, False]
        assert rows[2]["upcastError"].startswith("event 3 (")
