"""``python -m a2trio.serve --workers 2`` on Postgres, Redis and a SQLite file:
pushes through the one port reach both workers (their access lines say which)
and every follower, SSE and socket, on whichever worker it landed, sees every
event and every participant's presence live; each ping's handler runs once;
an actor's calls from both workers each commit once (a replayed message id
commits nothing); the inspector answers alike from both; SIGTERM stops both
workers cleanly. A worker killed with SIGKILL is reported
and started again; a store that lives in one process is refused."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from a2trio.transport.sse import SSEDecoder
from tests.backends import unreachable_port
from tests.backends.postgres import database_dsn, run_sql
from tests.backends.redis import REDIS_URL, delete_prefix, reachable
from tests.serve_kit import ROOT, Started, start_serve

PUSHES = 24
PARTICIPANTS = 6
SSE_FOLLOWERS = 3
SOCKET_FOLLOWERS = 3
GUARD_S = 60

# httpx's streaming responses cut off at the end of a test, as in test_serve.py.
pytestmark = pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")


@asynccontextmanager
async def _store_env(kind: str, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """The environment that points tests/workers_app.py at a fresh store."""
    if kind == "postgres":
        dsn = await database_dsn()
        schema = f"s_{secrets.token_hex(6)}"
        try:
            yield {"A2_TEST_WORKERS_PG": dsn, "A2_TEST_WORKERS_SCHEMA": schema}
        finally:
            await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
    elif kind == "redis":
        await reachable()
        prefix = f"a2t-{secrets.token_hex(6)}"
        try:
            yield {"A2_TEST_WORKERS_REDIS": REDIS_URL, "A2_TEST_WORKERS_PREFIX": prefix}
        finally:
            await delete_prefix(prefix)
    else:
        yield {"A2_STORE": f"sqlite:///{tmp_path / 'workers.db'}"}


class Seen:
    """What one follower saw: ping and pong numbers (pongs counted) and each
    participant's last status."""

    def __init__(self) -> None:
        self.pings: set[int] = set()
        self.pongs: Counter[int] = Counter()
        self.presence: dict[str, str] = {}

    def take(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "event" and data["type"] == "ping":
            self.pings.add(data["payload"]["n"])
        elif kind == "event" and data["type"] == "pong":
            self.pongs[data["payload"]["n"]] += 1
        elif kind == "presence" and data["values"].get("status"):
            self.presence[data["participant"]] = data["values"]["status"]

    def complete(self) -> bool:
        everyone = {f"p{n}": "here" for n in range(PARTICIPANTS)}
        numbers = set(range(PUSHES))
        return self.pings == numbers and set(self.pongs) == numbers and self.presence == everyone


async def _follow_sse(url: str, seen: Seen, task_status: Any) -> None:
    headers = {"accept": "text/event-stream"}
    async with (
        httpx.AsyncClient(base_url=url, timeout=None) as client,
        client.stream("GET", "/pings/s1?startAfter=0&presence=1", headers=headers) as stream,
    ):
        decoder = SSEDecoder()
        async for chunk in stream.aiter_raw():
            for frame in decoder.feed(chunk):
                if frame.event == "presence-snapshot":
                    task_status.started()
                elif frame.event in ("event", "presence"):
                    seen.take(frame.event, json.loads(frame.data))
            if seen.complete():
                return


async def _follow_socket(url: str, seen: Seen, task_status: Any) -> None:
    ws_url = "ws" + url.removeprefix("http") + "/pings/s1/ws?startAfter=0&presence=1"
    async with trio_websocket.open_websocket_url(ws_url) as ws:
        while not seen.complete():
            frame = json.loads(await ws.get_message())
            if frame["kind"] == "presence-snapshot":
                task_status.started()
            elif frame["kind"] in ("event", "presence"):
                seen.take(frame["kind"], frame)


async def _push(url: str, body: dict[str, Any]) -> None:
    """One push on a connection of its own, so the kernel picks a worker."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        pushed = await client.post("/pings/s1", json=body)
        assert pushed.status_code == 200, pushed.text


async def _stop(started: Started) -> list[str]:
    """SIGTERM the supervisor; its exit status must be 0. Returns every line
    it and its workers wrote (stdout and stderr are one pipe)."""
    process = started.process
    assert process.stdout is not None
    process.send_signal(signal.SIGTERM)
    rest = b""
    with trio.fail_after(GUARD_S):
        async for chunk in process.stdout:
            rest += chunk
        assert await process.wait() == 0, rest.decode()
    return (started.banner + rest.decode()).splitlines()


def _served_by(lines: list[str], method: str, path: str = "/pings/s1") -> Counter[str]:
    """How many of ``method``'s access lines on ``path`` each worker wrote."""
    line = re.compile(rf"\[worker (\d)\] a2trio\.access: {method} {re.escape(path)} ")
    found = (line.search(x) for x in lines)
    return Counter(match.group(1) for match in found if match)


CALLS = 20


async def _call(url: str, n: int) -> dict[str, Any]:
    """Actor call ``n`` (adds n + 1) on a connection of its own."""
    body = {"event": "add", "input": {"amount": n + 1}, "messageId": f"m-{n}"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        called = await client.post("/tally/t1", json=body)
        assert called.status_code == 200, called.text
        answer: dict[str, Any] = called.json()
        return answer


async def _get(url: str, path: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        got = await client.get(path)
        assert got.status_code == 200, got.text
        answer: dict[str, Any] = got.json()
        return answer


async def _actor_and_inspector(url: str) -> None:
    """Calls through both workers commit once each; the state and the
    inspector read the same from every connection."""
    indexes: dict[int, int] = {}

    async def call(n: int) -> None:
        indexes[n] = (await _call(url, n))["index"]

    async with trio.open_nursery() as nursery:
        for n in range(CALLS):
            nursery.start_soon(call, n)
    assert sorted(indexes.values()) == list(range(1, CALLS + 1))
    for n in range(0, CALLS, 4):  # a replayed message id answers, commits nothing
        assert (await _call(url, n))["index"] == indexes[n]
    everything = {"sum": sum(range(1, CALLS + 1)), "calls": CALLS}
    # Enough connections that both workers answer some (with 8, 1 run in 128 missed one).
    for _ in range(24):
        snapshot = await _get(url, "/tally/t1?snapshot=1")
        assert (snapshot["state"], snapshot["index"]) == (everything, CALLS)
        sessions = (await _get(url, "/_a2/inspect/pings"))["sessions"]
        assert [(s["sessionId"], s["eventCount"], s["pendingCount"]) for s in sessions] == [
            ("s1", 2 * PUSHES, 0)
        ]


@pytest.mark.parametrize("kind", ["postgres", "redis", "sqlite"])
async def test_two_workers_serve_one_port_on_one_store(kind: str, tmp_path: Path) -> None:
    async with _store_env(kind, tmp_path) as env:
        started = await start_serve(
            "tests.workers_app:app", "--port", "0", "--workers", "2", env=env
        )
        try:
            assert "(2 workers; pings: " in started.banner, started.banner
            assert "/_a2/inspect" in started.banner
            followers = [Seen() for _ in range(SSE_FOLLOWERS + SOCKET_FOLLOWERS)]
            with trio.fail_after(GUARD_S):
                async with trio.open_nursery() as nursery:
                    for n, seen in enumerate(followers):
                        follow = _follow_sse if n < SSE_FOLLOWERS else _follow_socket
                        await nursery.start(follow, started.url, seen)
                    # Every follower listens before the first push: what
                    # they see arrives live, from whichever worker took it.
                    async with trio.open_nursery() as pushes:
                        for n in range(PUSHES):
                            event = {"type": "ping", "payload": {"n": n}, "id": f"ping-{n}"}
                            pushes.start_soon(_push, started.url, {"events": [event]})
                        for n in range(PARTICIPANTS):
                            presence = {"participant": f"p{n}", "values": {"status": "here"}}
                            pushes.start_soon(_push, started.url, {"presence": presence})
            for seen in followers:
                # One pong per ping: each handler ran once across the workers.
                assert seen.pongs == Counter(range(PUSHES))
            with trio.fail_after(GUARD_S):
                await _actor_and_inspector(started.url)
        finally:
            lines = await _stop(started)
    pushed = _served_by(lines, "POST")
    assert sum(pushed.values()) == PUSHES + PARTICIPANTS
    assert set(pushed) == {"1", "2"}, pushed  # both workers took pushes
    assert set(_served_by(lines, "POST", "/tally/t1")) == {"1", "2"}
    assert set(_served_by(lines, "GET", "/_a2/inspect/pings")) == {"1", "2"}
    for worker in ("1", "2"):
        assert f"[worker {worker}] a2trio.serve: stopped" in "\n".join(lines)
    assert lines[-1] == "stopped"
    assert "shutting down 2 workers" in lines


def _children(pid: int) -> set[int]:
    tasks = Path(f"/proc/{pid}/task")
    return {int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()}


def _workers(pid: int) -> set[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    return {
        child
        for child in _children(pid)
        if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text()
    }


async def test_a_killed_worker_is_reported_and_started_again(tmp_path: Path) -> None:
    env = {"A2_STORE": f"sqlite:///{tmp_path / 'workers.db'}"}
    started = await start_serve("tests.workers_app:app", "--port", "0", "--workers", "2", env=env)
    assert started.process.stdout is not None
    try:
        workers = _workers(started.process.pid)
        assert len(workers) == 2
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        output = ""
        with trio.fail_after(GUARD_S):
            while "started again" not in output:
                output += (await started.process.stdout.receive_some()).decode()
        assert re.search(
            rf"worker \d \(pid {victim}\) was killed by SIGKILL; starting it again", output
        )
        assert len(_workers(started.process.pid) - {victim}) == 2
        for n in range(8):  # both workers, the new one too, still answer
            await _push(started.url, {"events": [{"type": "ping", "payload": {"n": n}}]})
    finally:
        await _stop(started)


async def test_a_store_in_one_process_is_refused_for_more_than_one_worker(
    tmp_path: Path,
) -> None:
    for store in ("memory:", "sqlite:///:memory:"):
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "a2trio.serve",
                "tests.workers_app:server",
                "--workers",
                "2",
                "--store",
                store,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_stderr=True,
            capture_stdout=True,
            check=False,
        )
        assert done.returncode == 1
        assert "each worker would have its own" in done.stderr.decode(), done.stderr


async def test_a_worker_that_cannot_start_stops_them_all_with_one_line() -> None:
    """The store does not answer: every worker's start-up check fails, and
    the command says so once, exit status 1."""
    with unreachable_port() as port:
        dsn = f"postgresql://root@127.0.0.1:{port}/nothing"
        command = [sys.executable, "-m", "a2trio.serve", "tests.workers_app:server"]
        done = await trio.run_process(
            [*command, "--port", "0", "--workers", "2", "--store", dsn],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_stderr=True,
            capture_stdout=True,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    errors = [x for x in done.stderr.decode().splitlines() if x.startswith("a2trio: ")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("a2trio: the store for 'pings' (PostgresStore(")
    assert b"a2trio serving on" not in done.stdout
