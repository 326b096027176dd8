"""``/_a2/inspect``'s wake and cancel of a handler suspended in a durable
wait (issue 34): 200 with the recorded action, 409 ``not_waiting`` for an
event no suspended wait holds, each behind its own operation."""

from __future__ import annotations

from collections import defaultdict

import httpx
import trio

import a2trio
from a2trio.stores import memory
from a2trio.transport import (
    CancelOperation,
    InspectOperation,
    Operation,
    Request,
    WakeOperation,
    asgi,
)
from tests.test_transport import (
    Ordered,
    collect_client_garbage,
    guarded,
    ordered,
    orders,
    push_body,
    pytestmark,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

OPERATOR = {"x-role": "operator"}


@guarded(30)
async def test_wake_and_cancel_a_suspended_wait_over_http() -> None:
    runs: list[tuple[str, int]] = []
    arrived: defaultdict[tuple[str, int], trio.Event] = defaultdict(trio.Event)

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        runs.append((ctx.session.id, ctx.attempt))
        arrived[ctx.session.id, ctx.attempt].set()
        await ctx.wait_for("note")

    server = a2trio.Server(orders, store=memory(), handlers={"ordered": ship}, sweep=False)
    seen: list[Operation] = []

    def policy(request: Request, op: Operation) -> bool:
        if not isinstance(op, InspectOperation | WakeOperation | CancelOperation):
            return True
        seen.append(op)
        return request.headers.get("x-role") == "operator"

    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        for session_id in ("s1", "s2"):
            await c.post(f"/orders/{session_id}", json=push_body(ordered("pen")))
        await server.settle()
        events = (await c.get("/_a2/inspect/orders/s1", headers=OPERATOR)).json()["events"]
        status = events[0]["status"]
        assert (status["state"], status["waitingFor"], status["claimHolder"]) == (
            "waiting",
            "note",
            None,
        )
        body = {"by": "ann", "reason": "by hand"}
        woke = await c.post("/_a2/inspect/orders/s1/1/wake", json=body, headers=OPERATOR)
        assert woke.status_code == 200, woke.text
        [action] = woke.json()["actions"]
        assert (action["action"], action["sessionId"], action["index"]) == ("wake", "s1", 1)
        assert seen[-1] == WakeOperation("orders", "s1", 1, "ann", "by hand")
        with trio.fail_after(5):
            await arrived["s1", 2].wait()
        # Suspended again (its rerun found no note); a note wakes and answers it.
        await c.post("/orders/s1", json=push_body({"type": "note", "payload": {"text": "x"}}))
        with trio.fail_after(5):
            await arrived["s1", 3].wait()
        await server.settle()
        again = await c.post("/_a2/inspect/orders/s1/1/wake", json=body, headers=OPERATOR)
        assert (again.status_code, again.json()["error"]["details"]) == (
            409,
            {"reason": "not_waiting"},
        ), "processed: not waiting"
        cancelled = await c.post("/_a2/inspect/orders/s2/1/cancel", json=body, headers=OPERATOR)
        assert cancelled.status_code == 200, cancelled.text
        assert [a["action"] for a in cancelled.json()["actions"]] == ["skip"]
        assert CancelOperation("orders", "s2", 1, "ann", "by hand") in seen
        twice = await c.post("/_a2/inspect/orders/s2/1/cancel", json=body, headers=OPERATOR)
        assert (twice.status_code, twice.json()["error"]["details"]) == (
            409,
            {"reason": "not_waiting"},
        )
        guest = await c.post("/_a2/inspect/orders/s1/1/wake", json=body, headers={"x-role": "x"})
        assert guest.status_code == 403
    assert sorted(runs) == [("s1", 1), ("s1", 2), ("s1", 3), ("s2", 1)]
