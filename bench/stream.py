"""Fan-out: append -> delivery latency to many live subscribers.

Two scenarios against a real hypercorn (trio worker) in a subprocess, on the
memory store (default) or Redis (``--store redis``: a fresh key prefix, its
keys deleted afterwards):

* **sse**: one session, ``--subscribers`` concurrent SSE streams (raw TCP
  clients, so the client's own parsing stays out of the figure). Each round
  POSTs one event and waits until every stream has it; latency is arrival
  minus the POST's start, per subscriber.
* **ws-mux**: one multiplexed socket following ``--subscribers`` sessions.
  Each round appends one event to every session (``--posters`` concurrent
  POSTs); latency is that event's arrival on the socket minus its POST's start.

Run::

    .venv/bin/python bench/stream.py [--subscribers 1000] [--rounds 10] [--versions]
    .venv/bin/python bench/stream.py --store redis [--redis-url redis://127.0.0.1:6379/0]

Figures are wall-clock on a shared machine: compare runs, not absolute values.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import httpx
import msgspec
import trio
import trio_websocket

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import a2trio  # noqa: E402


class Tick(msgspec.Struct, frozen=True):
    n: int


bench = a2trio.contract("bench", events={"tick": Tick})


def _served_store() -> a2trio.stores.Store:
    """The memory store, or Redis when the parent asks for it."""
    url = os.environ.get("A2_BENCH_REDIS_URL")
    if url:
        return a2trio.stores.redis(url, key_prefix=os.environ["A2_BENCH_REDIS_PREFIX"])
    return a2trio.stores.memory()


#: The app the subprocess serves (``python -m a2trio.serve bench.stream:server``
#: cannot import a script, so the script serves itself).
server = a2trio.Server(bench, store=_served_store())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def open_server(extra_env: dict[str, str]) -> tuple[trio.Process, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "a2trio.serve",
            "bench.stream:server",
            "--port",
            "0",
            "--store",
            "memory:",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    text = b""
    while b"Ctrl-C" not in text:
        chunk = await process.stdout.receive_some()
        if not chunk:
            raise RuntimeError(f"server did not start: {text.decode()}")
        text += chunk
    url = next(w for w in text.decode().split() if w.startswith("http://"))
    return process, url


async def sse_subscriber(
    host: str, port: int, rounds: list[Round], opened: Callable[[], None]
) -> None:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(
            b"GET /bench/s1 HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n"
        )
        tail = b""
        next_round = 0
        first = True
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            if first:
                first = False
                opened()
            window = tail + chunk
            while next_round < len(rounds) and rounds[next_round].marker in window:
                rounds[next_round].arrived(time.perf_counter())
                next_round += 1
            tail = window[-64:]


class Round:
    """One append and its arrivals; ``done`` is set when every subscriber has it."""

    def __init__(self, n: int, expected: int) -> None:
        self.marker = f'"payload":{{"n":{n}}}'.encode()
        self.expected = expected
        self.started = 0.0
        self.arrivals: list[float] = []
        self.done = trio.Event()

    def arrived(self, at: float) -> None:
        self.arrivals.append(at)
        if len(self.arrivals) == self.expected:
            self.done.set()


async def run_sse(url: str, subscribers: int, rounds: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    plan = [Round(n, subscribers) for n in range(rounds)]
    all_open = trio.Event()
    opened = 0

    def one_opened() -> None:
        nonlocal opened
        opened += 1
        if opened == subscribers:
            all_open.set()

    async with trio.open_nursery() as nursery:
        for _ in range(subscribers):
            nursery.start_soon(sse_subscriber, host, int(port), plan, one_opened)
        await all_open.wait()
        async with httpx.AsyncClient(base_url=url) as client:
            for n, round_ in enumerate(plan):
                round_.started = time.perf_counter()
                body = {"events": [{"type": "tick", "payload": {"n": n}}]}
                (await client.post("/bench/s1", json=body)).raise_for_status()
                with trio.fail_after(30):
                    await round_.done.wait()
        nursery.cancel_scope.cancel()
    return [(t - r.started) * 1000 for r in plan for t in r.arrivals]


async def run_ws_mux(url: str, subscribers: int, rounds: int, posters: int) -> list[float]:
    sessions = [f"m{i}" for i in range(subscribers)]
    latencies: list[float] = []
    started: dict[str, float] = {}
    limiter = trio.CapacityLimiter(posters)
    ws_url = "ws" + url.removeprefix("http") + "/bench/ws"
    subscribe = {"kind": "subscribe", "sessions": [{"id": s, "index": 0} for s in sessions]}

    async def post(client: httpx.AsyncClient, session: str, n: int) -> None:
        async with limiter:
            started[session] = time.perf_counter()
            body = {"events": [{"type": "tick", "payload": {"n": n}}]}
            (await client.post(f"/bench/{session}", json=body)).raise_for_status()

    async with trio_websocket.open_websocket_url(ws_url, max_message_size=2**20) as ws:
        await ws.send_message(json.dumps(subscribe))
        subscribed = 0
        while subscribed < subscribers:
            subscribed += json.loads(await ws.get_message())["kind"] == "subscribed"
        limits = httpx.Limits(max_connections=posters)
        async with httpx.AsyncClient(base_url=url, limits=limits) as client:
            for n in range(rounds):
                pending = set(sessions)
                async with trio.open_nursery() as nursery:
                    for session in sessions:
                        nursery.start_soon(post, client, session, n)
                    with trio.fail_after(60):
                        while pending:
                            frame = json.loads(await ws.get_message())
                            if frame["kind"] == "event":
                                arrival = time.perf_counter()
                                latencies.append((arrival - started[frame["sessionId"]]) * 1000)
                                pending.discard(frame["sessionId"])
    return latencies


async def main(args: argparse.Namespace) -> None:
    extra_env: dict[str, str] = {}
    if args.store == "redis":
        extra_env = {
            "A2_BENCH_REDIS_URL": args.redis_url,
            "A2_BENCH_REDIS_PREFIX": f"a2bench-{os.urandom(4).hex()}",
        }
    try:
        await _run(args, extra_env)
    finally:
        if extra_env:
            from drain import delete_redis_prefix

            await delete_redis_prefix(args.redis_url, extra_env["A2_BENCH_REDIS_PREFIX"])


async def _run(args: argparse.Namespace, extra_env: dict[str, str]) -> None:
    process, url = await open_server(extra_env)
    rows = []
    try:
        t0 = time.perf_counter()
        sse = await run_sse(url, args.subscribers, args.rounds)
        rows.append(("sse", args.subscribers, args.rounds, sse, time.perf_counter() - t0))
        t0 = time.perf_counter()
        mux = await run_ws_mux(url, args.subscribers, args.mux_rounds, args.posters)
        rows.append(("ws-mux", args.subscribers, args.mux_rounds, mux, time.perf_counter() - t0))
    finally:
        process.terminate()
        await process.wait()
    print(
        f"{'scenario':<8} {'subs':>5} {'rounds':>6} {'deliveries':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'wall s':>7}"
    )
    for name, subs, rounds, values, wall in rows:
        print(
            f"{name:<8} {subs:>5} {rounds:>6} {len(values):>10} "
            f"{statistics.median(values):>8.1f} {percentile(values, 0.99):>8.1f} "
            f"{max(values):>8.1f} {wall:>7.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10, help="SSE appends")
    parser.add_argument("--mux-rounds", type=int, default=2, help="appends per mux session")
    parser.add_argument("--posters", type=int, default=16, help="concurrent POSTs (mux)")
    parser.add_argument("--versions", action="store_true", help="print versions first")
    parser.add_argument("--store", choices=["memory", "redis"], default="memory")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    arguments = parser.parse_args()
    if arguments.versions:
        print(
            f"python {sys.version.split()[0]}, trio {trio.__version__}, "
            f"msgspec {msgspec.__version__}, hypercorn {metadata.version('hypercorn')}, "
            f"a2trio {a2trio.__version__}"
        )
    trio.run(main, arguments)
