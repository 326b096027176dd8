"""The Durable Streams lane's subscriptions (Sections 6 and 7; issue 37):
webhooks and pull-wake, what the protocol's suite cannot see — the events
in the store, a restart, two lane processes on one store, leases on the
mock clock, retries, limits and authorization.

The suite's own subscription tests run in
``tests/test_durable_streams_conformance.py``.
"""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

import a2trio
from a2trio.stores import memory, sqlite
from a2trio.stores.base import Store
from a2trio.transport import Limits, Request
from a2trio.transport.durable_streams import (
    DurableStreams,
    StreamOperation,
    SubscriptionOperation,
    durable_streams,
    webhooks,
)
from a2trio.transport.durable_streams.subscription_model import CONTRACT, SESSION, glob_match
from a2trio.transport.durable_streams.webhooks import Signer, WebhookRefused, check_url
from tests.test_transport import (  # the autouse collector keeps client garbage here
    collect_client_garbage,  # noqa: F401
    serving,
)

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning"),
]

JSON = {"content-type": "application/json"}
SUB = "/v1/stream/__ds/subscriptions"


@asynccontextmanager
async def lane_client(lane: DurableStreams) -> AsyncIterator[httpx.AsyncClient]:
    async with lane.opened():
        transport = httpx.ASGITransport(app=lane)
        async with httpx.AsyncClient(transport=transport, base_url="http://lane") as http:
            yield http


class Receiver:
    """A webhook endpoint on loopback: records each call, answers ``answers``
    in turn (then the last one again)."""

    def __init__(self, answers: list[tuple[int, Any]], hold: trio.Event | None = None) -> None:
        self.answers = answers
        self.hold = hold
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.called = trio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.calls.append((headers, body))
        self.called.set()
        if self.hold is not None:
            await self.hold.wait()
        status, answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        payload = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def next_call(self, count: int) -> dict[str, Any]:
        with trio.fail_after(10):
            while len(self.calls) < count:
                await self.called.wait()
                self.called = trio.Event()
        return dict(json.loads(self.calls[count - 1][1]))


async def log_kinds(store: Store) -> list[str]:
    return [row.type for row in await store.read(f"{CONTRACT.name}\x1f{SESSION}")]


async def wait_for(predicate: Any) -> None:
    """Poll the lane over HTTP, as a client sees it, until ``predicate``."""
    with trio.fail_after(10):
        while not await predicate():  # noqa: ASYNC110 - the state is the lane's, read over HTTP
            await trio.sleep(0.02)


# -- the pieces -------------------------------------------------------------------------


def test_glob_segments() -> None:
    assert glob_match("events/*", "events/a")
    assert not glob_match("events/*", "events/a/b")
    assert glob_match("events/**", "events/a/b")
    assert glob_match("events/**", "events")
    assert glob_match("**/log", "a/b/log")
    assert not glob_match("events/*", "other/a")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://example.com/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest",
        "https://192.168.1.1/",
        "https://[::1]/",
        "https://localhost/hook",
        "https://user:pw@example.com/",
        "ftp://example.com/",
        "not a url",
    ],
)
def test_unsafe_webhook_urls_are_refused(url: str) -> None:
    with pytest.raises(WebhookRefused):
        check_url(url, local=True)


def test_local_http_webhooks_need_the_option() -> None:
    check_url("https://example.com/hook", local=False)
    check_url("http://127.0.0.1:9000/hook", local=True)
    check_url("http://localhost/hook", local=True)
    with pytest.raises(WebhookRefused):
        check_url("http://127.0.0.1:9000/hook", local=False)


async def test_a_name_is_resolved_and_its_addresses_checked_before_connecting() -> None:
    with pytest.raises(WebhookRefused):
        await webhooks._resolve("localhost", 443, loopback=False)
    assert await webhooks._resolve("localhost", 80, loopback=True) in ("127.0.0.1", "::1")


def test_signatures_verify_with_the_published_key_and_tokens_bind_one_wake() -> None:
    signer = Signer(bytes(range(32)))
    jwk = signer.jwk()
    assert (jwk["kty"], jwk["crv"], jwk["alg"]) == ("OKP", "Ed25519", "EdDSA")
    assert jwk["kid"].startswith("ds_")
    header = signer.signature(b'{"a":1}', now_s=1700000000)
    stamp, kid, signature = (part.split("=", 1)[1] for part in header.split(","))
    assert (stamp, kid) == ("1700000000", jwk["kid"])
    public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(jwk["x"] + "="))
    public.verify(base64.urlsafe_b64decode(signature + "=="), b'1700000000.{"a":1}')
    token = signer.token("/r\x1fs1", 3, "w_1")
    assert signer.read_token(token) == ("/r\x1fs1", 3, "w_1")
    assert Signer(bytes(32)).read_token(token) is None
    claims, _, mac = token.partition(".")
    assert signer.read_token(f"{claims}.{mac[:-2]}AA") is None
    assert signer.read_token("garbage") is None


# -- webhooks ---------------------------------------------------------------------------


async def test_a_webhook_wake_is_signed_durable_and_acked_by_its_callback() -> None:
    store = memory()
    lane = durable_streams(store, local_webhooks=True)
    receiver = Receiver([(200, {})])
    async with serving(receiver) as url, lane_client(lane) as http:  # type: ignore[arg-type]
        hook = f"{url}/hook"
        spec = {"type": "webhook", "pattern": "events/*", "webhook": {"url": hook}}
        created = await http.put(f"{SUB}/s1", json=spec)
        assert created.status_code == 201
        jwks = (await http.get("/v1/stream/__ds/jwks.json")).json()
        await http.put("/v1/stream/events/a", headers=JSON, content=b'{"n": 1}')
        await http.put("/v1/stream/other/a", headers=JSON, content=b'{"n": 1}')
        wake = await receiver.next_call(1)
        headers, raw = receiver.calls[0]
        stamp, kid, signature = (
            p.split("=", 1)[1] for p in headers["webhook-signature"].split(",")
        )
        key = next(k for k in jwks["keys"] if k["kid"] == kid)
        Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(key["x"] + "=")).verify(
            base64.urlsafe_b64decode(signature + "=="), f"{stamp}.".encode() + raw
        )
        assert [s["path"] for s in wake["streams"]] == ["events/a"]
        tail = wake["streams"][0]["tail_offset"]
        assert wake["callback_url"] == "http://lane/v1/stream/__ds/subscriptions/s1/callback"
        ack = {"wake_id": wake["wake_id"], "generation": wake["generation"], "done": True}
        ack["acks"] = [{"stream": "events/a", "offset": tail}]
        bearer = {"authorization": f"Bearer {wake['callback_token']}"}
        assert (await http.post(f"{SUB}/s1/callback", json=ack)).status_code == 401
        forged = {"authorization": f"Bearer {wake['callback_token'][:-3]}AAA"}
        assert (await http.post(f"{SUB}/s1/callback", json=ack, headers=forged)).status_code == 401
        answer = await http.post(f"{SUB}/s1/callback", json=ack, headers=bearer)
        assert answer.json() == {"ok": True, "next_wake": False}
        stale = await http.post(f"{SUB}/s1/callback", json=ack, headers=bearer)
        assert (stale.status_code, stale.json()["error"]["code"]) == (409, "FENCED")
        # A second append wakes it again: a new generation.
        await http.post("/v1/stream/events/a", headers=JSON, content=b'{"n": 2}')
        again = await receiver.next_call(2)
        assert again["generation"] == wake["generation"] + 1
        assert again["streams"][0]["acked_offset"] == tail
    assert await log_kinds(store) == [
        "keyed", "subscribed", "linked", "woke", "acked", "woke",
    ]  # fmt: skip


async def test_a_failed_delivery_is_retried_with_backoff_and_done_acks_it() -> None:
    lane = durable_streams(memory(), local_webhooks=True)
    receiver = Receiver([(500, {}), (200, {"done": True})])
    async with serving(receiver) as url, lane_client(lane) as http:  # type: ignore[arg-type]
        spec = {"type": "webhook", "streams": ["jobs/1"], "webhook": {"url": f"{url}/h"}}
        assert (await http.put(f"{SUB}/r", json=spec)).status_code == 201
        await http.put("/v1/stream/jobs/1", headers=JSON, content=b"[1]")
        first = await receiver.next_call(1)

        async def failed() -> bool:
            return bool((await http.get(f"{SUB}/r")).json()["status"] == "failed")

        await wait_for(failed)
        second = await receiver.next_call(2)
        assert second["wake_id"] == first["wake_id"]

        async def acked() -> bool:
            body = (await http.get(f"{SUB}/r")).json()
            link = body["streams"][0]
            return bool(
                body["status"] == "active"
                and link["acked_offset"] == second["streams"][0]["tail_offset"]
            )

        await wait_for(acked)
        assert len(receiver.calls) == 2


async def test_a_slow_webhook_never_holds_up_an_append_and_times_out() -> None:
    lane = durable_streams(memory(), local_webhooks=True, webhook_timeout_s=3)
    hold = trio.Event()
    receiver = Receiver([(200, {})], hold=hold)
    async with serving(receiver) as url, lane_client(lane) as http:  # type: ignore[arg-type]
        spec = {"type": "webhook", "streams": ["s"], "webhook": {"url": f"{url}/h"}}
        await http.put(f"{SUB}/slow", json=spec)
        await http.put("/v1/stream/s", headers=JSON, content=b"[1]")
        await receiver.next_call(1)
        with trio.fail_after(2.5):  # the webhook is still waiting: appends are not
            answer = await http.post("/v1/stream/s", headers=JSON, content=b"[2]")
        assert answer.status_code == 204

        async def failed() -> bool:
            return bool((await http.get(f"{SUB}/slow")).json()["status"] == "failed")

        await wait_for(failed)
        hold.set()


# -- pull-wake, leases, processes -------------------------------------------------------


async def test_pull_wake_leases_expire_on_the_mock_clock_and_fence_the_old_holder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lane = durable_streams(memory(clock=a2trio.TrioClock()))
    async with lane_client(lane) as http:
        await http.put("/q/wake", headers=JSON, content=b"[]")
        spec = {
            "type": "pull-wake",
            "pattern": "jobs/**",
            "wake_stream": "wake",
            "lease_ttl_ms": 2000,
        }
        assert (await http.put("/q/__ds/subscriptions/p", json=spec)).status_code == 201
        await http.put("/q/jobs/a/b", headers=JSON, content=b'{"job": 1}')
        await trio.sleep(0.1)
        events = (await http.get("/q/wake", params={"offset": "-1"})).json()
        assert [(e["subscription_id"], e["stream"]) for e in events] == [("p", "jobs/a/b")]
        claim = await http.post("/q/__ds/subscriptions/p/claim", json={"worker": "w1"})
        held = claim.json()
        busy = await http.post("/q/__ds/subscriptions/p/claim", json={"worker": "w2"})
        assert busy.json()["error"] == {
            "code": "ALREADY_CLAIMED",
            "message": "Another worker holds the subscription",
            "current_holder": "w1",
            "generation": held["generation"],
        }
        await trio.sleep(1.5)  # a heartbeat (an ack without done) extends the lease
        bearer = {"authorization": f"Bearer {held['token']}"}
        beat = {"wake_id": held["wake_id"], "generation": held["generation"]}
        assert (
            await http.post("/q/__ds/subscriptions/p/ack", json=beat, headers=bearer)
        ).status_code == 200
        await trio.sleep(1.5)
        assert (
            await http.post("/q/__ds/subscriptions/p/claim", json={"worker": "w2"})
        ).status_code == 409
        await trio.sleep(2.5)  # the lease runs out: the wake ends and another is issued
        events = (await http.get("/q/wake", params={"offset": "-1"})).json()
        assert [e["generation"] for e in events] == [held["generation"], held["generation"] + 1]
        taken = (await http.post("/q/__ds/subscriptions/p/claim", json={"worker": "w2"})).json()
        assert taken["generation"] == held["generation"] + 1
        stale = await http.post("/q/__ds/subscriptions/p/ack", json=beat, headers=bearer)
        assert (stale.status_code, stale.json()["error"]["code"]) == (409, "FENCED")


async def test_subscriptions_survive_a_restart_and_fence_across_processes(tmp_path: Path) -> None:
    url = str(tmp_path / "subs.db")
    first = durable_streams(sqlite(url))
    async with lane_client(first) as http:
        await http.put("/w", headers=JSON, content=b"[]")
        await http.put("/events/old", headers=JSON, content=b"[1]")
        spec = {"type": "pull-wake", "pattern": "events/*", "wake_stream": "w"}
        assert (await http.put("/__ds/subscriptions/p", json=spec)).status_code == 201
        linked = (await http.get("/__ds/subscriptions/p")).json()["streams"]
        # A stream that existed is linked at its tail: no replay of its history.
        tail = (await http.head("/events/old")).headers["stream-next-offset"]
        assert linked == [{"path": "events/old", "link_type": "glob", "acked_offset": tail}]
        assert (await http.post("/__ds/subscriptions/p/claim", json={"worker": "a"})).json()[
            "error"
        ]["code"] == "NO_PENDING_WORK"
    second, third = durable_streams(sqlite(url)), durable_streams(sqlite(url))
    async with lane_client(second) as one, lane_client(third) as other:
        assert (await one.get("/__ds/subscriptions/p")).json()["streams"] == linked
        await one.post("/events/old", headers=JSON, content=b"[2]")
        held = await one.post("/__ds/subscriptions/p/claim", json={"worker": "a"})
        assert held.status_code == 200
        busy = await other.post("/__ds/subscriptions/p/claim", json={"worker": "b"})
        assert busy.json()["error"]["current_holder"] == "a"
        ack = {
            "wake_id": held.json()["wake_id"],
            "generation": held.json()["generation"],
            "done": True,
        }
        ack["acks"] = [{"stream": "events/old", "offset": held.json()["streams"][0]["tail_offset"]}]
        bearer = {"authorization": f"Bearer {held.json()['token']}"}
        # The token was made by the first process: the key is the store's.
        assert (await other.post("/__ds/subscriptions/p/ack", json=ack, headers=bearer)).json() == {
            "ok": True,
            "next_wake": False,
        }


# -- bad input, limits, authorization ---------------------------------------------------


async def test_bad_requests_answer_the_protocols_errors() -> None:
    lane = durable_streams(memory(), limits=Limits(max_body_bytes=200))
    async with lane_client(lane) as http:

        async def code(
            method: str, path: str, body: Any = None, **kw: Any
        ) -> tuple[int, str | None]:
            content = (
                body
                if isinstance(body, bytes)
                else None
                if body is None
                else json.dumps(body).encode()
            )
            r = await http.request(method, path, content=content, **kw)
            error = r.json().get("error") if r.content[:1] == b"{" else None
            return r.status_code, error["code"] if error else None

        pull = {"type": "pull-wake", "streams": ["a"], "wake_stream": "w"}
        assert await code("PUT", f"{SUB}/x", b"{nope") == (400, "INVALID_REQUEST")
        assert await code("PUT", f"{SUB}/x", {"type": "pull-wake", "wake_stream": "w"}) == (
            400,
            "INVALID_REQUEST",
        )
        assert await code("PUT", f"{SUB}/x", {**pull, "lease_ttl_ms": 999}) == (
            400,
            "INVALID_REQUEST",
        )
        assert await code("PUT", f"{SUB}/x", {**pull, "streams": ["__ds/x"]}) == (
            400,
            "INVALID_REQUEST",
        )
        hook = {"type": "webhook", "streams": ["a"], "webhook": {"url": "http://127.0.0.1:1/"}}
        assert await code("PUT", f"{SUB}/x", hook) == (400, "WEBHOOK_URL_REJECTED")
        assert await code("PUT", f"{SUB}/x", {**pull, "description": "x" * 300}) == (413, None)
        assert await code("GET", f"{SUB}/nope") == (404, "SUBSCRIPTION_NOT_FOUND")
        assert await code("GET", "/v1/stream/__ds/other") == (404, "SUBSCRIPTION_NOT_FOUND")
        assert await code("PUT", f"{SUB}/x", pull) == (201, None)
        assert await code("PUT", f"{SUB}/x", pull) == (200, None)
        assert await code("PUT", f"{SUB}/x", {**pull, "streams": ["b"]}) == (
            409,
            "SUBSCRIPTION_ALREADY_EXISTS",
        )
        assert await code("POST", f"{SUB}/x/ack", {}) == (401, "TOKEN_INVALID")
        assert await code("POST", f"{SUB}/x/claim", {}) == (400, "INVALID_REQUEST")
        assert await code("POST", f"{SUB}/x/claim", {"worker": "w"}) == (409, "NO_PENDING_WORK")
        assert await code(
            "POST", f"{SUB}/x/callback", {}, headers={"authorization": "Bearer x.y"}
        ) == (
            401,
            "TOKEN_INVALID",
        )
        assert (await http.delete(f"{SUB}/x")).status_code == 204
        assert await code("GET", f"{SUB}/x") == (404, "SUBSCRIPTION_NOT_FOUND")


async def test_authorize_is_asked_about_each_subscription_operation() -> None:
    asked: list[Any] = []

    def authorize(request: Request, operation: Any) -> bool:
        asked.append(operation)
        return not (
            isinstance(operation, SubscriptionOperation) and operation.action == "unsubscribe"
        )

    lane = durable_streams(memory(), authorize=authorize)
    async with lane_client(lane) as http:
        spec = {"type": "pull-wake", "pattern": "e/*", "wake_stream": "w"}
        assert (await http.put("/r/__ds/subscriptions/s", json=spec)).status_code == 201
        assert (await http.get("/r/__ds/subscriptions/s")).status_code == 200
        assert (
            await http.post("/r/__ds/subscriptions/s/streams", json={"streams": ["x"]})
        ).status_code == 204
        assert (await http.delete("/r/__ds/subscriptions/s")).status_code == 403
        assert (await http.get("/r/__ds/subscriptions/s")).status_code == 200
    assert [op for op in asked if not isinstance(op, StreamOperation)] == [
        SubscriptionOperation("subscribe", "/r", "s", pattern="e/*", wake_stream="w"),
        SubscriptionOperation("read", "/r", "s"),
        SubscriptionOperation("link", "/r", "s", streams=("x",)),
        SubscriptionOperation("unsubscribe", "/r", "s"),
        SubscriptionOperation("read", "/r", "s"),
    ]


# -- every store ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres", "redis"])
async def test_backfill_wake_claim_and_ack_on_each_store(backend: str) -> None:
    factory = importlib.import_module(f"tests.backends.{backend}")
    async with factory.open_store(a2trio.SYSTEM_CLOCK) as store:
        async with lane_client(durable_streams(store)) as http:
            await http.put("/r/wake", headers=JSON, content=b"[]")
            await http.put("/r/jobs/old", headers=JSON, content=b"[1]")
            await http.put("/r/jobs/empty", headers=JSON)
            await http.put("/r/other/x", headers=JSON, content=b"[1]")
            spec = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake"}
            assert (await http.put("/r/__ds/subscriptions/p", json=spec)).status_code == 201
            tail = (await http.head("/r/jobs/old")).headers["stream-next-offset"]
            body = (await http.get("/r/__ds/subscriptions/p")).json()
            assert body["streams"] == [
                {"path": "jobs/old", "link_type": "glob", "acked_offset": tail}
            ]
            await http.post("/r/jobs/new", headers=JSON, content=b"[2]")  # 404: no stream
            await http.put("/r/jobs/new", headers=JSON, content=b"[2]")

            async def woken() -> bool:
                return bool((await http.get("/r/wake", params={"offset": "-1"})).json())

            await wait_for(woken)
            claim = (await http.post("/r/__ds/subscriptions/p/claim", json={"worker": "w"})).json()
            pending = {s["path"]: s["has_pending"] for s in claim["streams"]}
            assert pending == {"jobs/old": False, "jobs/new": True}
            acks = [{"stream": s["path"], "offset": s["tail_offset"]} for s in claim["streams"]]
            done = {"wake_id": claim["wake_id"], "generation": claim["generation"], "done": True}
            bearer = {"authorization": f"Bearer {claim['token']}"}
            answer = await http.post(
                "/r/__ds/subscriptions/p/ack", json={**done, "acks": acks}, headers=bearer
            )
            assert answer.json() == {"ok": True, "next_wake": False}
        assert (await log_kinds(store))[-3:] == ["woke", "claimed", "acked"]
