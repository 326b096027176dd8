"""Retention over ``/_a2/inspect`` (issue 35): a session exported as JSON
lines, archived (export, then an erasure that expects its index), erased and
trimmed over HTTP, each behind ``authorize`` with its own operation type;
refusals and bad bodies answer the error envelope with a 4xx."""

from __future__ import annotations

import json
from typing import Any

import httpx

import a2trio
from a2trio.stores import memory
from a2trio.transport import (
    EraseOperation,
    InspectOperation,
    Operation,
    Request,
    TrimOperation,
    asgi,
)
from tests.test_transport import (
    collect_client_garbage,
    guarded,
    orders,
    push_body,
    pytestmark,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

OPERATOR = {"x-role": "operator"}


def _count(state: int, event: a2trio.Event[Any]) -> int:
    return state + 1


COUNT = a2trio.Reducer("count", 0, _count)


class _Policy:
    """Operators read, erase and trim; ``seen`` records those operations."""

    def __init__(self) -> None:
        self.seen: list[Operation] = []

    def __call__(self, request: Request, op: Operation) -> bool:
        if isinstance(op, InspectOperation | EraseOperation | TrimOperation):
            self.seen.append(op)
            return request.headers.get("x-role") == "operator"
        return True

    def last(self) -> Operation:
        return self.seen[-1]


def _notes(*texts: str) -> dict[str, Any]:
    return push_body(*({"type": "note", "payload": {"text": t}} for t in texts))


@guarded(30)
async def test_export_then_an_erasure_that_expects_its_index_archives_over_http() -> None:
    server = a2trio.Server(orders, store=memory(), sweep=False)
    policy = _Policy()
    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await c.post("/orders/s1", json=_notes("a", "b"))
        assert (await c.get("/_a2/inspect/orders/s1?view=export")).status_code == 403
        exported = await c.get("/_a2/inspect/orders/s1?view=export", headers=OPERATOR)
        assert exported.status_code == 200
        assert exported.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in exported.text.splitlines()]
        assert [line["kind"] for line in lines] == ["session", "event", "event"]
        assert (lines[0]["sessionId"], lines[0]["index"]) == ("s1", 2)
        assert policy.last() == InspectOperation("orders", "s1")

        await c.post("/orders/s1", json=_notes("c"))  # appended after the export
        body = {"by": "ann", "reason": "closed", "expectedIndex": 2}
        moved = await c.post("/_a2/inspect/orders/s1/erase", json=body, headers=OPERATOR)
        assert moved.status_code == 409
        assert moved.json()["error"]["details"] == {"reason": "changed"}
        assert len((await c.get("/orders/s1")).json()["events"]) == 3, "nothing removed"
        body["expectedIndex"] = 3
        erased = await c.post("/_a2/inspect/orders/s1/erase", json=body, headers=OPERATOR)
        assert erased.status_code == 200, erased.text
        answer = erased.json()["erased"]
        assert (answer["sessionId"], answer["events"], answer["snapshots"]) == ("s1", 3, 0)
        assert policy.last() == EraseOperation("orders", "s1", "ann", "closed")
        assert (await c.get("/orders/s1")).json()["events"] == []


@guarded(30)
async def test_trim_over_http_and_the_reads_below_it() -> None:
    server = a2trio.Server(orders, store=memory(), sweep=False)
    policy = _Policy()
    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await c.post("/orders/s1", json=_notes("a", "b", "c", "d"))
        body = {"by": "ann", "reason": "compact", "reducer": "count"}
        none = await c.post("/_a2/inspect/orders/s1/trim", json=body, headers=OPERATOR)
        assert none.status_code == 409
        assert none.json()["error"]["details"] == {"reason": "no_snapshot"}
        assert await server.session("s1").state(COUNT) == (4, 4)
        await server.settle()
        refused = await c.post("/_a2/inspect/orders/s1/trim", json=body)
        assert refused.status_code == 403
        trimmed = await c.post("/_a2/inspect/orders/s1/trim", json=body, headers=OPERATOR)
        assert trimmed.status_code == 200, trimmed.text
        answer = trimmed.json()["trimmed"]
        assert (answer["throughIndex"], answer["events"], answer["reducerName"]) == (3, 3, "count")
        assert policy.last() == TrimOperation("orders", "s1", "count", "ann", "compact")
        below = await c.get("/orders/s1")
        assert below.status_code == 410
        assert below.json()["error"]["code"] == "TRIMMED"
        assert below.json()["error"]["details"] == {"trimmedThrough": 3}
        after = await c.get("/orders/s1", params={"gte": 4})
        assert [e["index"] for e in after.json()["events"]] == [4]
        page = (await c.get("/_a2/inspect/orders/s1", headers=OPERATOR)).json()
        assert [e["event"]["index"] for e in page["events"]] == [4]


@guarded(30)
async def test_bad_bodies_and_methods_answer_4xx() -> None:
    server = a2trio.Server(orders, store=memory(), sweep=False)
    async with (
        serving(asgi(server, inspect=True, authorize=_Policy())) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await c.post("/orders/s1", json=_notes("a"))
        cases: list[tuple[str, Any, int]] = [
            ("erase", {"by": "ann"}, 400),  # no reason
            ("erase", {"by": "ann", "reason": " "}, 400),
            ("erase", {"by": "ann", "reason": "r", "expectedIndex": -1}, 400),
            ("erase", {"by": "ann", "reason": "r", "extra": 1}, 400),
            ("trim", {"by": "ann", "reason": "r"}, 400),  # no reducer
            ("trim", {"by": "ann", "reason": "r", "reducer": ""}, 400),
        ]
        for action, body, status in cases:
            answer = await c.post(f"/_a2/inspect/orders/s1/{action}", json=body, headers=OPERATOR)
            assert answer.status_code == status, (action, body, answer.text)
            assert answer.json()["error"]["code"] == "INVALID_PAYLOAD"
        assert (await c.get("/_a2/inspect/orders/s1/erase", headers=OPERATOR)).status_code == 405
        plain = await c.post(
            "/_a2/inspect/orders/s1/erase",
            content=b'{"by": "ann", "reason": "r"}',
            headers={**OPERATOR, "content-type": "text/plain"},
        )
        assert plain.status_code == 415
        assert len((await c.get("/orders/s1")).json()["events"]) == 1, "nothing removed"


@guarded(30)
async def test_a_stream_from_below_the_trim_point_ends_with_the_trimmed_error() -> None:
    server = a2trio.Server(orders, store=memory(), sweep=False)
    async with serving(asgi(server)) as base, httpx.AsyncClient(base_url=base) as c:
        await c.post("/orders/s1", json=_notes("a", "b", "c", "d"))
        await server.session("s1").state(COUNT)
        await server.settle()
        await server.retention.trim("s1", COUNT, by="ann", reason="compact")
        sse = {"accept": "text/event-stream"}
        async with c.stream("GET", "/orders/s1", headers=sse) as stream:
            body = b"".join([chunk async for chunk in stream.aiter_bytes()])
        [frame] = [f for f in body.decode().split("\n\n") if f.startswith("event: error")]
        error = json.loads(frame.partition("data: ")[2])["error"]
        assert (error["code"], error["details"]) == ("TRIMMED", {"trimmedThrough": 3})
