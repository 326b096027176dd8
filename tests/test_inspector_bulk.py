"""``POST /_a2/inspect/{contract}`` (issue 35): a bulk redrive or skip over
HTTP, authorized as a read of the contract and then per event as its single
action, with a dry run, refusals per event, and 4xx envelopes for a bad body."""

from __future__ import annotations

from typing import Any

import httpx

from a2trio.transport import InspectOperation, Operation, RedriveOperation, Request, asgi
from tests.test_inspector import OPERATOR, _Policy, _server
from tests.test_transport import (
    collect_client_garbage,
    guarded,
    ordered,
    push_body,
    pytestmark,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


class _NotS2(_Policy):
    """Operators read and act, but nobody acts on session s2."""

    def __call__(self, request: Request, op: Operation) -> bool:
        if isinstance(op, RedriveOperation) and op.session_id == "s2":
            self.seen.append(op)
            return False
        return super().__call__(request, op)


@guarded(30)
async def test_a_bulk_redrive_over_http_asks_the_policy_per_event() -> None:
    server = _server()
    policy = _NotS2()
    async with (
        serving(asgi(server, inspect=True, authorize=policy)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        for sid in ("s1", "s2", "s3"):
            await c.post(f"/orders/{sid}", json=push_body(ordered("broken"), ordered("pen")))
        await server.settle()
        dry: dict[str, Any] = {"action": "redrive", "by": "ann", "dryRun": True}
        dry["filter"] = {"errorContains": "no stock", "sessionPrefix": "s"}
        listed = await c.post("/_a2/inspect/orders", json=dry, headers=OPERATOR)
        assert listed.status_code == 200, listed.text
        shown = listed.json()
        assert [(i["sessionId"], i["outcome"]) for i in shown["items"]] == [
            ("s1", "matched"),
            ("s2", "matched"),
            ("s3", "matched"),
        ]
        assert (shown["dryRun"], shown["acted"], shown["limited"]) == (True, 0, False)
        assert policy.seen == [InspectOperation("orders")], "a dry run only reads"

        body = {"action": "redrive", "by": "ann", "reason": "restocked", "all": True}
        acted = await c.post("/_a2/inspect/orders", json=body, headers=OPERATOR)
        assert acted.status_code == 200, acted.text
        result = acted.json()
        assert (result["matched"], result["acted"], result["refused"]) == (3, 2, 1)
        s1, s2, _ = result["items"]
        assert s1["action"] == {
            "action": "redrive",
            "sessionId": "s1",
            "index": 1,
            "by": "ann",
            "reason": "restocked",
            "atMs": s1["action"]["atMs"],
        }
        assert (s2["outcome"], s2["refusal"], s2["action"]) == ("refused", "forbidden", None)
        assert RedriveOperation("orders", "s3", 1, "ann", "restocked") in policy.seen
        await server.settle()
        dead = (await c.get("/_a2/inspect/orders?view=dead-letters", headers=OPERATOR)).json()
        assert [d["event"]["sessionId"] for d in dead["deadLetters"]] == ["s2"]
        [first, _] = (await c.get("/_a2/inspect/orders/s1", headers=OPERATOR)).json()["events"]
        assert [(a["action"], a["by"]) for a in first["actions"]] == [("redrive", "ann")]

        guest = await c.post("/_a2/inspect/orders", json=body, headers={"x-role": "guest"})
        assert guest.status_code == 403


@guarded(20)
async def test_bad_bulk_requests_are_4xx_envelopes_and_write_nothing() -> None:
    server = _server()
    async with (
        serving(asgi(server, inspect=True, authorize=_Policy())) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await c.post("/orders/s1", json=push_body(ordered("broken")))
        await server.settle()
        bad: list[tuple[Any, str]] = [
            ({"action": "redrive", "by": "ann"}, "an empty filter would redrive"),
            (
                {
                    "action": "redrive",
                    "by": "ann",
                    "filter": {"deadLetteredFromMs": 5, "deadLetteredUntilMs": 1},
                },
                "ends before it starts",
            ),
            ({"action": "redrive", "by": "ann", "all": True, "limit": 0}, "limit is 1 to"),
            ({"action": "retry_now", "by": "ann", "all": True}, "Invalid enum value"),
            ({"action": "redrive", "by": "ann", "filter": {"nope": 1}}, "unknown field"),
            ({"action": "skip", "by": "ann", "all": True}, "`reason` must not be empty"),
        ]
        for body, message in bad:
            answer = await c.post("/_a2/inspect/orders", json=body, headers=OPERATOR)
            assert answer.status_code == 400, (body, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "INVALID_PAYLOAD"
            assert message in error["message"], (body, error)
        raw = await c.post("/_a2/inspect/orders", content=b"{", headers=OPERATOR)
        assert raw.status_code == 415, "no content-type: application/json"
        no_contract = {"action": "redrive", "by": "a", "all": True}
        missing = await c.post("/_a2/inspect/nope", json=no_contract, headers=OPERATOR)
        assert missing.status_code == 404
        dead = (await c.get("/_a2/inspect/orders?view=dead-letters", headers=OPERATOR)).json()
        assert dead["deadLetters"][0]["actions"] == []
