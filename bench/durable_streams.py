"""The Durable Streams lane against the protocol's reference server, side by side.

Each server runs in a subprocess: ``python -m a2trio.serve
bench.durable_streams:lane`` (the lane, on the store ``A2_BENCH_STORE`` names)
on each ``--stores`` store (memory; SQLite in a temporary file; Postgres in
a fresh database on ``--dsn``'s server, dropped afterwards; Redis at
``--redis-url`` under a fresh key prefix whose keys are deleted afterwards,
as ``bench/stream.py``), and ``@durable-streams/server`` (Node, in memory:
``conformance/durable-streams/reference-server.mjs``, installed by ``npm ci``
there). Three scenarios each:

* **append**: ``--writers`` concurrent writers, each its own stream,
  ``--appends`` appends of ``--payload`` bytes one after another:
  appends per second over the whole run, and each append's p50 / p99.
* **catch-up**: one stream of ``--catchup-appends`` appends of
  ``--catchup-payload`` bytes, written first (untimed), then read from the
  start to the tail, following ``Stream-Next-Offset``: MB/s.
* **fan-out**: ``--readers`` SSE readers of one stream (``offset=now&live=sse``,
  raw TCP connections on one epoll loop in a subprocess, so the client's
  parsing stays out of the figure); ``--rounds`` appends one at a time, each
  waiting until every reader has it: append-to-delivery p50 / p99 / max.

Run::

    .venv/bin/python bench/durable_streams.py --versions
    .venv/bin/python bench/durable_streams.py --stores memory,sqlite --readers 1000
    .venv/bin/python bench/durable_streams.py --stores memory,sqlite,postgres,redis
    .venv/bin/python bench/durable_streams.py --tiny        # a smoke run: seconds

It ends with the rows side by side (a column per server) and each lane's
figure against the reference server's (``1.5x``: half again as good; for
the fan-out latency, lower counts as better).

The clients share the machine with the servers: compare rows of one run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SUITE = ROOT / "conformance" / "durable-streams"

from a2trio import stores  # noqa: E402
from a2trio.transport.durable_streams import durable_streams  # noqa: E402

#: The stores a lane row can run on.
STORES = ("memory", "sqlite", "postgres", "redis")


def _served_store() -> stores.Store:
    """The lane subprocess's store: what ``A2_BENCH_STORE`` names (memory
    by default), with the ``A2_BENCH_*`` settings ``lane_server`` gives it."""
    kind = os.environ.get("A2_BENCH_STORE", "memory")
    if kind == "redis":
        return stores.redis(
            os.environ["A2_BENCH_REDIS_URL"], key_prefix=os.environ["A2_BENCH_REDIS_PREFIX"]
        )
    if kind == "postgres":
        return stores.postgres(os.environ["A2_BENCH_DSN"])
    if kind == "sqlite":
        return stores.sqlite(os.environ["A2_BENCH_SQLITE"])
    return stores.memory()


#: The app each lane subprocess serves (``python -m a2trio.serve
#: bench.durable_streams:lane``); construction does no I/O.
lane = durable_streams(_served_store())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Row:
    def __init__(self, server: str, scenario: str, value: float, unit: str, detail: str) -> None:
        self.server, self.scenario, self.value, self.unit, self.detail = (
            server,
            scenario,
            value,
            unit,
            detail,
        )

    def __str__(self) -> str:
        value = f"{self.value:>10.1f}"
        return f"{self.server:<16} {self.scenario:<9} {value} {self.unit:<10} {self.detail}"


# -- the servers ---------------------------------------------------------------------


async def _read_until(process: trio.Process, marker: bytes, timeout_s: float) -> str:
    assert process.stdout is not None
    output = b""
    with trio.fail_after(timeout_s):
        while marker not in output:
            chunk = await process.stdout.receive_some()
            if not chunk:
                raise RuntimeError(f"the server exited:\n{output.decode()}")
            output += chunk
    return output.decode()


@asynccontextmanager
async def store_env(store: str, args: argparse.Namespace) -> AsyncIterator[dict[str, str]]:
    """The lane subprocess's ``A2_BENCH_*`` settings for ``store``; creates
    and removes its data."""
    if store == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield {"A2_BENCH_STORE": "sqlite", "A2_BENCH_SQLITE": f"{tmp}/streams.db"}
        return
    from stream import backend_env

    async with backend_env(store, args) as env:
        yield env


@asynccontextmanager
async def lane_server(store: str, args: argparse.Namespace) -> AsyncIterator[tuple[str, int]]:
    """The lane on ``store`` (one of ``STORES``): its URL and pid."""
    async with store_env(store, args) as store_settings:
        env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
        env.update(store_settings, PYTHONPATH=str(ROOT))
        command = [sys.executable, "-m", "a2trio.serve", "bench.durable_streams:lane"]
        command += ["--port", "0", "--no-access-log", "--log-level", "warning"]
        process = await trio.lowlevel.open_process(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE
        )
        try:
            banner = await _read_until(process, b"Ctrl-C", 60)
            line = next(x for x in banner.splitlines() if x.startswith("a2trio serving on"))
            yield line.split()[3], process.pid
        finally:
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            process.kill()


@asynccontextmanager
async def reference_server() -> AsyncIterator[tuple[str, int]]:
    """``@durable-streams/server`` in memory: its URL and pid."""
    node = shutil.which("node")
    if node is None or not (SUITE / "node_modules" / "@durable-streams" / "server").is_dir():
        raise SystemExit(
            "the reference server needs node and `npm ci` in conformance/durable-streams"
        )
    env = {**os.environ, "PORT": "0"}
    process = await trio.lowlevel.open_process(
        [node, "reference-server.mjs"], cwd=SUITE, env=env, stdout=subprocess.PIPE
    )
    try:
        output = await _read_until(process, b"ready ", 60)
        url = output.split("ready ", 1)[1].split()[0]
        yield url, process.pid
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        process.kill()


# -- the scenarios ---------------------------------------------------------------------


async def run_appends(url: str, writers: int, appends: int, payload: int) -> list[Row]:
    body = b"x" * payload
    latencies: list[float] = []
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=writers)
    ) as http:
        for w in range(writers):
            (
                await http.put(f"/bench/append-{w}", headers={"content-type": "text/plain"})
            ).raise_for_status()

        async def writer(w: int) -> None:
            for _ in range(appends):
                started = time.perf_counter()
                r = await http.post(
                    f"/bench/append-{w}", content=body, headers={"content-type": "text/plain"}
                )
                r.raise_for_status()
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(writers):
                nursery.start_soon(writer, w)
        wall = time.perf_counter() - started
    detail = f"p50 {percentile(latencies, 0.5):.2f} ms, p99 {percentile(latencies, 0.99):.2f} ms"
    return [Row("", "append", writers * appends / wall, "appends/s", detail)]


async def run_catchup(url: str, appends: int, payload: int) -> list[Row]:
    body = bytes(range(256)) * (payload // 256 + 1)
    body = body[:payload]
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        headers = {"content-type": "application/octet-stream"}
        (await http.put("/bench/catchup", headers=headers)).raise_for_status()
        for _ in range(appends):
            (await http.post("/bench/catchup", content=body, headers=headers)).raise_for_status()
        total, requests, offset = 0, 0, "-1"
        started = time.perf_counter()
        while True:
            r = await http.get("/bench/catchup", params={"offset": offset})
            r.raise_for_status()
            total += len(r.content)
            requests += 1
            offset = r.headers["stream-next-offset"]
            if r.headers.get("stream-up-to-date") == "true":
                break
        wall = time.perf_counter() - started
    assert total == appends * payload, (total, appends * payload)
    return [
        Row("", "catch-up", total / wall / 1e6, "MB/s", f"{total / 1e6:.1f} MB in {requests} reads")
    ]


def raw_readers(host: str, port: int, path: str, count: int, rounds: int) -> None:
    """The readers' process: ``count`` SSE connections on one epoll loop.
    Prints ``open`` once every stream answered, ``done N`` when every reader
    has round N's marker, then one JSON line of arrival times."""
    selector = selectors.DefaultSelector()
    markers = [f"tick-{n}-end".encode() for n in range(rounds)]
    arrivals = [[0.0] * count for _ in range(rounds)]
    missing = [count] * rounds
    next_round = [0] * count
    tails = [b""] * count
    opened = [False] * count
    open_count = 0
    request = (
        f"GET {path}?offset=now&live=sse HTTP/1.1\r\nHost: bench\r\n"
        "Accept: text/event-stream\r\n\r\n"
    ).encode()

    def pump(timeout: float | None) -> None:
        nonlocal open_count
        for key, _ in selector.select(timeout):
            i = key.data
            data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            if not data:
                raise SystemExit(f"connection {i} closed")
            now = time.perf_counter()
            if not opened[i]:
                opened[i] = True
                open_count += 1
            window = tails[i] + data
            n = next_round[i]
            while n < rounds and markers[n] in window:
                arrivals[n][i] = now
                missing[n] -= 1
                if missing[n] == 0:
                    print(f"done {n}", flush=True)
                n += 1
            next_round[i] = n
            tails[i] = window[-64:]

    sockets = []
    for i in range(count):
        while i - open_count >= 50:  # batches: never overflow the accept backlog
            pump(1.0)
        conn = socket.create_connection((host, port))
        conn.sendall(request)
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ, i)
        sockets.append(conn)
    while open_count < count:
        pump(1.0)
    print("open", flush=True)
    while missing[-1]:
        pump(None)
    print(json.dumps(arrivals), flush=True)
    for conn in sockets:
        conn.close()


async def run_fanout(url: str, readers: int, rounds: int) -> list[Row]:
    host, port = url.removeprefix("http://").split(":")
    path = f"/bench/fanout-{readers}-{time.monotonic_ns()}"
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        (await http.put(path, headers={"content-type": "text/plain"})).raise_for_status()
        command = [
            sys.executable,
            __file__,
            "--raw-readers",
            json.dumps([host, int(port), path, readers, rounds]),
        ]
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
        assert process.stdout is not None
        buffer = b""

        async def line() -> str:
            nonlocal buffer
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some()  # type: ignore[union-attr]
                if not chunk:
                    raise RuntimeError("the readers' process exited")
                buffer += chunk
            text, buffer = buffer.split(b"\n", 1)
            return text.decode()

        started: list[float] = []
        try:
            with trio.fail_after(300):
                assert await line() == "open"
            wall_start = time.perf_counter()
            for n in range(rounds):
                started.append(time.perf_counter())
                r = await http.post(
                    path, content=f"tick-{n}-end".encode(), headers={"content-type": "text/plain"}
                )
                r.raise_for_status()
                with trio.fail_after(120):
                    assert await line() == f"done {n}"
            wall = time.perf_counter() - wall_start
            arrivals = json.loads(await line())
        finally:
            with trio.move_on_after(5):
                await process.wait()
            process.kill()
    latencies = [(t - started[n]) * 1000 for n, row in enumerate(arrivals) for t in row]
    detail = (
        f"p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms, "
        f"{len(latencies)} deliveries in {wall:.1f} s"
    )
    return [Row("", "fan-out", statistics.median(latencies), "ms p50", detail)]


async def run_server(
    name: str, server: Callable[[], object], args: argparse.Namespace
) -> list[Row]:
    rows: list[Row] = []
    async with server() as (url, _pid):  # type: ignore[attr-defined]
        rows += await run_appends(url, args.writers, args.appends, args.payload)
        rows += await run_catchup(url, args.catchup_appends, args.catchup_payload)
        rows += await run_fanout(url, args.readers, args.rounds)
    for row in rows:
        row.server = name
    return rows


def versions() -> str:
    node = shutil.which("node")
    node_version = (
        subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
        if node
        else "-"
    )
    reference = "-"
    package = SUITE / "node_modules" / "@durable-streams" / "server" / "package.json"
    if package.exists():
        reference = json.loads(package.read_text())["version"]
    parts = [
        f"python {sys.version.split()[0]}",
        *(f"{p} {metadata.version(p)}" for p in ("trio", "hypercorn", "msgspec", "a2trio")),
        f"node {node_version}",
        f"@durable-streams/server {reference}",
    ]
    return ", ".join(parts)


async def main(args: argparse.Namespace) -> None:
    print(versions())
    print(
        f"writers {args.writers} x {args.appends} appends of {args.payload} B; catch-up "
        f"{args.catchup_appends} x {args.catchup_payload} B; fan-out {args.readers} readers x "
        f"{args.rounds} rounds"
    )
    print(f"{'server':<16} {'scenario':<9} {'value':>10} {'unit':<10} detail")
    rows: list[Row] = []
    for store in args.stores:
        server = functools.partial(lane_server, store, args)
        for row in await run_server(f"a2trio/{store}", server, args):
            print(row, flush=True)
            rows.append(row)
    if args.reference:
        for row in await run_server(REFERENCE, reference_server, args):
            print(row, flush=True)
            rows.append(row)
    print()
    print(comparison(rows))


#: The reference server's name in the rows.
REFERENCE = "node reference"
#: Scenarios whose figure is better when lower (a latency).
LOWER_IS_BETTER = frozenset({"fan-out"})


def comparison(rows: list[Row]) -> str:
    """The rows side by side, a column per server, and each lane's figure
    against the reference server's (``2.0x``: twice as good, whichever way
    the scenario counts)."""
    servers = list(dict.fromkeys(row.server for row in rows))
    scenarios = list(dict.fromkeys(row.scenario for row in rows))
    by = {(row.server, row.scenario): row for row in rows}
    lanes = [s for s in servers if s != REFERENCE]
    header = [f"{'scenario':<9} {'unit':<10}", *(f"{s:>16}" for s in servers)]
    if REFERENCE in servers:
        header += [f"{s + ' vs ref':>22}" for s in lanes]
    lines = [" ".join(header)]
    for scenario in scenarios:
        unit = next(row.unit for row in rows if row.scenario == scenario)
        cells = [f"{scenario:<9} {unit:<10}"]
        cells += [
            f"{by[(s, scenario)].value:>16.1f}" if (s, scenario) in by else f"{'-':>16}"
            for s in servers
        ]
        reference = by.get((REFERENCE, scenario))
        for lane in lanes if reference is not None else []:
            ours = by.get((lane, scenario))
            if ours is None or reference is None or not ours.value or not reference.value:
                cells.append(f"{'-':>22}")
                continue
            ratio = (
                reference.value / ours.value
                if scenario in LOWER_IS_BETTER
                else ours.value / reference.value
            )
            cells.append(f"{ratio:>21.2f}x")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="memory,sqlite", type=lambda s: s.split(","))
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-reference", dest="reference", action="store_false")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--catchup-appends", type=int, default=2000)
    parser.add_argument("--catchup-payload", type=int, default=16384)
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a smoke run: a few of each")
    parser.add_argument("--versions", action="store_true", help="print the versions and exit")
    args = parser.parse_args(argv)
    unknown = [store for store in args.stores if store not in STORES]
    if unknown:
        parser.error(f"unknown stores {unknown}: choose from {', '.join(STORES)}")
    if args.tiny:
        args.writers, args.appends, args.catchup_appends = 2, 10, 20
        args.catchup_payload, args.readers, args.rounds = 1024, 5, 2
    return args


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-readers":
        raw_readers(*json.loads(sys.argv[2]))
    else:
        options = parse()
        if options.versions:
            print(versions())
        else:
            trio.run(main, options)
