"""The vault example: its behaviour in process, and the documented command
(``python -m a2trio.serve examples.vault:app``) over HTTP on SQLite, with
exactly-once answers under retries and across a server restart."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import a2trio
from a2trio.serve import lanes
from a2trio.stores import memory
from a2trio.transport import asgi, open_actor_client
from examples.vault import PublicVault, app, public_view, review, vault
from tests.serve_kit import start_serve


def test_the_banner_names_the_actor_lanes() -> None:
    text = "\n".join(lanes(app, "http://h:1"))
    assert "POST http://h:1/vault/{id}" in text
    assert "?snapshot=1" in text
    assert "ws://h:1/vault/{id}/ws" in text
    assert "multiplexed" not in text


async def test_large_deposits_are_flagged_and_stay_private(autojump_clock: trio.abc.Clock) -> None:
    server = a2trio.Server(
        vault, store=memory(clock=a2trio.TrioClock()), handlers={"deposited": review}
    )
    async with server:
        answer = await server.actor("alice").call("deposit", {"amount": 20_000})
        assert answer.state.audit == ("+20000",)
        await server.settle()
        state = await server.actor("alice").state()
        assert state.state.audit == ("+20000", "flagged: large deposit at #1")
        assert public_view(state.state, None) == PublicVault(20_000)  # type: ignore[arg-type]
    assert asgi(server, views={"vault": public_view}).views["vault"] is public_view


@asynccontextmanager
async def serving_the_example(cwd: Path) -> AsyncIterator[str]:
    """Run the documented command in ``cwd`` (its SQLite file lives there);
    yield its URL; stop it with Ctrl-C."""
    started = await start_serve("examples.vault:app", "--port", "0", cwd=cwd, timeout_s=30)
    process = started.process
    assert process.stdout is not None
    try:
        yield started.url
        process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            async for _ in process.stdout:
                pass
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _call(event: str, amount: int, message_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"event": event, "input": {"amount": amount}}
    if message_id is not None:
        body["messageId"] = message_id
    return body


@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
async def test_the_served_example_answers_exactly_once_across_a_restart(tmp_path: Path) -> None:
    async with serving_the_example(tmp_path) as url, httpx.AsyncClient(base_url=url) as c:
        first = await c.post("/vault/alice", content=json.dumps(_call("deposit", 50, "m1")))
        assert first.status_code == 200, first.text
        assert first.json() == {"state": {"balance": 50}, "index": 1}
        assert first.headers["cache-control"] == "private, no-store"
        retries = [
            await c.post("/vault/alice", content=json.dumps(_call("deposit", 50, "m1")))
            for _ in range(3)
        ]
        assert [r.json() for r in retries] == [first.json()] * 3
        refused = await c.post("/vault/alice", content=json.dumps(_call("withdraw", 80)))
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "CALL_REFUSED"
        async with open_actor_client(url, "vault", "alice", state_type=PublicVault) as alice:
            second = await alice.call("withdraw", {"amount": 20}, id="m2")
            assert second == a2trio.ActorState(PublicVault(30), 2)
    assert (tmp_path / ".a2" / "dev.db").exists()

    # A new process on the same SQLite file: the original answers, not the current state.
    async with serving_the_example(tmp_path) as url, httpx.AsyncClient(base_url=url) as c:
        again = await c.post("/vault/alice", content=json.dumps(_call("deposit", 50, "m1")))
        assert again.json() == {"state": {"balance": 50}, "index": 1}
        async with open_actor_client(url, "vault", "alice", state_type=PublicVault) as alice:
            assert await alice.call("withdraw", {"amount": 20}, id="m2") == second
            assert await alice.state() == a2trio.ActorState(PublicVault(30), 2)
        snapshot = await c.get("/vault/alice", params={"snapshot": "1"})
        assert "audit" not in snapshot.text
