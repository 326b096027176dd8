"""``/_a2/inspect`` (issue 18): the inspector page, dead letters, and the
operator's actions over HTTP, each behind ``authorize`` with its own
operation type (refused without a policy)."""

from __future__ import annotations

import importlib
from typing import Any, cast

import httpx
import pytest
import trio

import a2trio
from a2trio.stores import memory
from a2trio.stores.conformance import StoreFactory
from a2trio.transport import (
    InspectOperation,
    Operation,
    RedriveOperation,
    Request,
    RetryNowOperation,
    SkipOperation,
    asgi,
)
from a2trio.transport.server.inspector import page
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

JSON = {"content-type": "application/json", "x-role": "operator"}
OPERATOR = {"x-role": "operator"}


def _server(store: a2trio.Store | None = None) -> a2trio.Server:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.event.payload.item == "broken" and ctx.attempt == 1:
            raise RuntimeError("no stock")

    return a2trio.Server(
        orders,
        store=store or memory(),
        handlers={"ordered": a2trio.handler(ship, lane="stock")},
        timings=a2trio.Timings(max_failures=1),
        sweep=False,
    )


class _Policy:
    """Operators read and act; ``seen`` records every operator operation."""

    def __init__(self) -> None:
        self.seen: list[Operation] = []

    def __call__(self, request: Request, op: Operation) -> bool:
        if isinstance(op, InspectOperation | RedriveOperation | SkipOperation | RetryNowOperation):
            self.seen.append(op)
            return request.headers.get("x-role") == "operator"
        return True

    def last(self) -> Operation:
        return self.seen[-1]


async def _dead_letter(c: httpx.AsyncClient, server: a2trio.Server) -> None:
    await c.post("/orders/s1", json=push_body(ordered("broken"), ordered("pen")))
    await server.settle()


def test_the_page_names_the_contracts_and_nothing_can_close_its_script() -> None:
    html = page(["orders", "</script><b>x"]).decode()
    assert '["orders", "\\u003c/script>\\u003cb>x"]' in html
    assert "</script><b>" not in html


@guarded(20)
async def test_the_page_is_served_only_when_enabled() -> None:
    async with (
        serving(asgi(_server())) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        assert (await c.get("/_a2/inspect")).status_code == 404
    async with (
        serving(asgi(_server(), inspect=True)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        for path in ("/_a2/inspect", "/_a2/inspect/"):
            shown = await c.get(path)
            assert shown.status_code == 200
            assert shown.headers["content-type"] == "text/html; charset=utf-8"
            assert '<script id="a2-contracts" type="application/json">["orders"]' in shown.text
        assert (await c.post("/_a2/inspect")).status_code == 405
        refused = await c.get("/_a2/inspect/orders?view=dead-letters")
        assert refused.status_code == 403, "the data is behind authorize, the page is not"


@guarded(30)
async def test_dead_letters_redrive_skip_and_retry_now_over_http() -> None:
    server = _server()
    policy = _Policy()
    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await _dead_letter(c, server)
        dead = (await c.get("/_a2/inspect/orders?view=dead-letters", headers=OPERATOR)).json()
        assert [(d["event"]["sessionId"], d["event"]["index"]) for d in dead["deadLetters"]] == [
            ("s1", 1)
        ]
        assert dead["cursor"] is None
        assert "RuntimeError: no stock" in dead["deadLetters"][0]["status"]["lastError"]

        body = {"by": "ann", "reason": "restocked"}
        redriven = await c.post("/_a2/inspect/orders/s1/1/redrive", json=body, headers=OPERATOR)
        assert redriven.status_code == 200, redriven.text
        [action] = redriven.json()["actions"]
        assert (action["action"], action["sessionId"], action["index"], action["by"]) == (
            "redrive",
            "s1",
            1,
            "ann",
        )
        assert policy.last() == RedriveOperation("orders", "s1", 1, "ann", "restocked")
        await server.settle()
        events = (await c.get("/_a2/inspect/orders/s1", headers=OPERATOR)).json()["events"]
        assert [e["status"]["state"] for e in events] == ["processed", "processed"]
        assert [a["action"] for a in events[0]["actions"]] == ["redrive"]
        assert [e["traceId"] for e in events] == [None, None]  # this server traces nothing

        again = await c.post("/_a2/inspect/orders/s1/1/redrive", json=body, headers=OPERATOR)
        assert again.status_code == 409
        assert again.json()["error"] == {
            "code": "INVALID_PAYLOAD",
            "message": "event 1 of session 's1' is not dead-lettered: "
            "only a dead letter can be redriven",
            "details": {"reason": "not_dead_lettered"},
        }
        missing = await c.post("/_a2/inspect/orders/s1/9/skip", json=body, headers=OPERATOR)
        assert missing.status_code == 404
        assert missing.json()["error"]["details"] == {"reason": "no_event"}

        await c.post("/orders/s2", json=push_body({"type": "note", "payload": {"text": "x"}}))
        nothing = await c.post("/_a2/inspect/orders/s2/retry-now", json=body, headers=OPERATOR)
        assert nothing.status_code == 409
        assert nothing.json()["error"]["details"] == {"reason": "nothing_to_retry"}
        assert policy.last() == RetryNowOperation("orders", "s2", "ann", "restocked")

        await c.post("/orders/s3", json=push_body(ordered("broken")))
        await server.settle()
        no_reason = await c.post(
            "/_a2/inspect/orders/s3/1/skip", json={"by": "ann"}, headers=OPERATOR
        )
        assert no_reason.status_code == 400
        assert "`reason` must not be empty" in no_reason.json()["error"]["message"]
        skipped = await c.post("/_a2/inspect/orders/s3/1/skip", json=body, headers=OPERATOR)
        assert skipped.json()["actions"][0]["action"] == "skip"
        assert policy.last() == SkipOperation("orders", "s3", 1, "ann", "restocked")
        [shown] = (await c.get("/_a2/inspect/orders/s3", headers=OPERATOR)).json()["events"]
        assert shown["status"]["state"] == "skipped"


@guarded(20)
async def test_bad_action_requests_are_refused_and_write_nothing() -> None:
    server = _server()
    policy = _Policy()
    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await _dead_letter(c, server)
        body = {"by": "ann", "reason": "r"}
        cases: list[tuple[str, str, dict[str, str], Any, int]] = [
            ("POST", "/_a2/inspect/orders/s1/1/redrive", OPERATOR, None, 415),
            ("POST", "/_a2/inspect/orders/s1/1/redrive", {"x-role": "guest"}, body, 403),
            ("GET", "/_a2/inspect/orders/s1/1/redrive", OPERATOR, None, 405),
            ("POST", "/_a2/inspect/orders/s1/1/explode", OPERATOR, body, 404),
            ("POST", "/_a2/inspect/orders/s1/x/redrive", OPERATOR, body, 400),
            ("POST", "/_a2/inspect/orders/s1/0/redrive", OPERATOR, body, 400),
            ("POST", "/_a2/inspect/nope/s1/1/redrive", OPERATOR, body, 404),
            ("POST", "/_a2/inspect/orders/s1", OPERATOR, body, 405),
            ("GET", "/_a2/inspect/orders?view=bogus", OPERATOR, None, 400),
            ("GET", "/_a2/inspect/orders?view=dead-letters&cursor=x", OPERATOR, None, 400),
        ]
        for method, path, headers, json_body, status in cases:
            if json_body is not None:
                headers = {**headers, "content-type": "application/json"}
            answer = await c.request(method, path, json=json_body, headers=headers)
            assert answer.status_code == status, (method, path, answer.text)
            assert "error" in answer.json()
        for raw in (b"{", b'{"by": "ann", "extra": 1}', b'{"reason": "r"}', b'{"by": ""}'):
            answer = await c.post("/_a2/inspect/orders/s1/1/redrive", content=raw, headers=JSON)
            assert answer.status_code == 400, raw
            assert answer.json()["error"]["code"] == "INVALID_PAYLOAD"
        [dead] = (await c.get("/_a2/inspect/orders/s1", headers=OPERATOR)).json()["events"][:1]
        assert (dead["status"]["state"], dead["actions"]) == ("dead_lettered", [])

    server = _server()
    async with (
        serving(asgi(server, inspect=True)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        refused = await c.post("/_a2/inspect/orders/s1/retry-now", json={"by": "a"}, headers=JSON)
        assert refused.status_code == 403
        assert refused.json()["error"]["message"] == (
            "inspection needs an authorize policy that allows RetryNowOperation"
        )


@guarded(20)
async def test_a_store_without_operator_actions_answers_404() -> None:
    store = memory()
    cast("Any", store).operator = None  # a store without the capability
    server = _server(store)
    async with (
        serving(asgi(server, inspect=True, authorize=_Policy())) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        listed = await c.get("/_a2/inspect/orders?view=dead-letters", headers=OPERATOR)
        assert listed.status_code == 404
        assert "no operator actions" in listed.json()["error"]["message"]
        acted = await c.post("/_a2/inspect/orders/s1/retry-now", json={"by": "a"}, headers=JSON)
        assert acted.status_code == 404


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def open_store(request: pytest.FixtureRequest) -> StoreFactory:
    module = importlib.import_module(f"tests.backends.{request.param}")
    # Skips here, in a sync fixture, so the reason survives.
    if request.param == "postgres":
        trio.run(module.database_dsn)
    if request.param == "redis":
        trio.run(module.reachable)
    factory: StoreFactory = module.open_store
    return factory


@guarded(30)
async def test_a_cursor_index_past_the_safe_integers_is_a_400_on_every_store(
    open_store: StoreFactory,
) -> None:
    # Issue 29: SQLite answered 2**64 with a 503 naming its OverflowError.
    async with open_store(a2trio.TrioClock()) as store:
        server = _server(store)
        async with (
            serving(asgi(server, inspect=True, authorize=_Policy())) as base,
            httpx.AsyncClient(base_url=base) as c,
        ):
            await _dead_letter(c, server)
            for index in (2**53, 2**64, 10**30):
                answer = await c.get(
                    f"/_a2/inspect/orders?view=dead-letters&cursor={index}:s1", headers=OPERATOR
                )
                assert answer.status_code == 400, answer.text
                error = answer.json()["error"]
                assert error["code"] == "INVALID_PAYLOAD"
                assert "cursor" in error["message"]
            largest = await c.get(
                f"/_a2/inspect/orders?view=dead-letters&cursor={2**53 - 1}:s1", headers=OPERATOR
            )
            assert largest.status_code == 200, largest.text
            # The Python surface bounds its indexes too (SQLite's overflow was a 503).
            with pytest.raises(ValueError, match="up to 9007199254740991"):
                await server.session("s1").history(gte=2**64)
            with pytest.raises(ValueError, match="index of at most"):
                await server.inspect.list_dead_letters(cursor=f"{2**64}:s1")
