"""``GET /_a2/inspect/...`` (issue 18): off by default, behind ``authorize``
with its own operation (refused without a policy), JSON of ``server.inspect``."""

from __future__ import annotations

from typing import Any, cast

import httpx

import a2trio
from a2trio.stores import memory
from a2trio.transport import InspectOperation, Operation, Request, asgi
from tests.test_transport import (
    collect_client_garbage,
    guarded,
    ordered,
    orders,
    push_body,
    pytestmark,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


def operators_only(request: Request, op: Operation) -> bool:
    if isinstance(op, InspectOperation):
        return request.headers.get("x-role") == "operator"
    return True


@guarded(20)
async def test_inspection_routes_are_off_refused_without_a_policy_and_answer_json() -> None:
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server)) as base, httpx.AsyncClient(base_url=base) as c:
        assert (await c.get("/_a2/inspect/orders")).status_code == 404
    server = a2trio.Server(orders, store=memory())
    async with serving(asgi(server, inspect=True)) as base, httpx.AsyncClient(base_url=base) as c:
        refused = await c.get("/_a2/inspect/orders")
        assert refused.status_code == 403
        assert refused.json()["error"]["message"] == (
            "inspection needs an authorize policy that allows InspectOperation"
        )
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, inspect=True, authorize=operators_only)
    operator = {"x-role": "operator"}
    async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
        await c.post("/orders/s1", json=push_body(ordered("a"), ordered("b")))
        assert (await c.get("/_a2/inspect/orders")).status_code == 403
        listed = (await c.get("/_a2/inspect/orders", headers=operator)).json()
        assert [s["sessionId"] for s in listed["sessions"]] == ["s1"]
        page = (await c.get("/_a2/inspect/orders/s1?limit=1", headers=operator)).json()
        assert [e["event"]["index"] for e in page["events"]] == [1]
        assert page["events"][0]["status"]["state"] == "settled"
        assert page["events"][0]["event"]["payload"] == {"item": "a", "qty": 1}
        assert (page["throughIndex"], page["nextIndex"]) == (2, 1)
        for path in ("/_a2/inspect/orders/s1?limit=0", "/_a2/inspect/orders/s1?after=x"):
            bad = await c.get(path, headers=operator)
            assert bad.status_code == 400, path
            assert bad.json()["error"]["code"] == "INVALID_PAYLOAD"
        assert (await c.post("/_a2/inspect/orders", headers=operator)).status_code == 415
        assert (await c.get("/_a2/inspect/nope", headers=operator)).status_code == 404


@guarded(20)
async def test_a_store_without_inspection_answers_404() -> None:
    blind = memory()
    cast("Any", blind).inspect = None
    server = a2trio.Server(orders, store=blind)
    app = asgi(server, inspect=True, authorize=operators_only)
    async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
        answer = await c.get("/_a2/inspect/orders", headers={"x-role": "operator"})
        assert answer.status_code == 404
        assert "does not support inspection" in answer.json()["error"]["message"]
