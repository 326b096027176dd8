"""Fan-out: append -> delivery latency to many live subscribers.

Scenarios against ``python -m a2trio.serve`` (hypercorn's trio worker) in a
subprocess, per store (``--store memory,postgres,redis``; Postgres in a fresh
database dropped afterwards, Redis under a fresh key prefix whose keys are
deleted):

* **sse**: one session, ``--subscribers`` concurrent SSE streams (raw TCP
  clients, so the client's own parsing stays out of the figure). Each round
  POSTs one event and waits until every stream has it; latency is arrival
  minus the POST's start, per subscriber.
* **ws**: the same over single-session sockets (``GET /bench/{session}/ws``),
  at most ``--ws-max`` of them (a trio-websocket client per socket is heavy).
* **ws-mux**: one multiplexed socket following ``--mux-sessions`` sessions.
  Each round appends one event to every session (``--posters`` concurrent
  POSTs); latency is that event's arrival on the socket minus its POST's start.

Run::

    .venv/bin/python bench/stream.py [--subscribers 1000,10000] [--rounds 10]
    .venv/bin/python bench/stream.py --store memory,postgres --scenarios sse
    .venv/bin/python bench/stream.py --profile /tmp/fanout   # py-spy the server
    .venv/bin/python bench/stream.py --baseline /tmp/before --repeat 3
    .venv/bin/python bench/stream.py --scenarios sse --floor   # against the floor

The client runs in this process, the server in another: on a 2-core machine
they share the cores, so compare rows of one run, not absolute values. The
``rss`` column is the server's resident memory after the scenario; ``srv
µs/dlv`` the server's CPU time (user + system) during the timed rounds per
delivery. ``--baseline DIR`` runs the same scenarios against the ``a2trio``
package of another checkout (``git worktree add --detach DIR REV``), before
this one's, ``--repeat`` times alternating. ``idle KiB`` is the server's
resident memory per follower once every stream is open, before the first
append.

``--floor`` runs the sse scenario against ``bench/sse_floor.py`` too (a raw
``trio.serve_tcp`` broadcaster writing the same bytes, no store and no
ASGI) and ends with a table of a2trio's figures against the floor's.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import gc
import json
import os
import secrets
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
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
    """The store the parent asked for (``A2_BENCH_STORE``), memory by default."""
    kind = os.environ.get("A2_BENCH_STORE", "memory")
    if kind == "redis":
        return a2trio.stores.redis(
            os.environ["A2_BENCH_REDIS_URL"], key_prefix=os.environ["A2_BENCH_REDIS_PREFIX"]
        )
    if kind == "postgres":
        return a2trio.stores.postgres(os.environ["A2_BENCH_DSN"])
    if kind == "sqlite":
        return a2trio.stores.sqlite(os.environ["A2_BENCH_SQLITE"])
    return a2trio.stores.memory()


def _log_collections(path: str) -> None:
    """Write the time spent in each generation's collections to ``path`` at exit."""
    spent = [0.0, 0.0, 0.0]
    counts = [0, 0, 0]
    began = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - began[0]
            counts[info["generation"]] += 1

    gc.callbacks.append(callback)
    atexit.register(lambda: Path(path).write_text(json.dumps({"s": spent, "n": counts})))


if os.environ.get("A2_BENCH_GC_LOG"):
    _log_collections(os.environ["A2_BENCH_GC_LOG"])

#: The app the subprocess serves (``python -m a2trio.serve bench.stream:server``
#: cannot import a script, so the script serves itself).
server = a2trio.Server(bench, store=_served_store())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def served(
    store: str, args: argparse.Namespace, source: Path | None = None
) -> AsyncIterator[tuple[trio.Process, str]]:
    """``python -m a2trio.serve`` over this script's server on ``store``, with
    the ``a2trio`` package of ``source`` (another checkout) when given."""
    async with backend_env(store, args) as extra_env, shadowing(source) as path:
        env = {**os.environ, "PYTHONPATH": path, **extra_env}
        # A long keep-alive: hypercorn closes a connection whose request it has
        # not read within it, which 10,000 opening streams on a loaded machine hit.
        command = [
            *(sys.executable, "-m", "a2trio.serve", "bench.stream:server"),
            *("--port", "0", "--keep-alive-timeout", "120"),
        ]
        # In the path's first folder: ``-m`` puts the working directory first on
        # ``sys.path``, which from ROOT would shadow the other checkout's package.
        process = await trio.lowlevel.open_process(
            command,
            cwd=path.split(os.pathsep)[0],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert process.stdout is not None
            text = b""
            while b"Ctrl-C" not in text:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"server did not start: {text.decode()}")
                text += chunk
            url = next(w for w in text.decode().split() if w.startswith("http://"))
            yield process, url
        finally:
            process.terminate()
            await process.wait()


@asynccontextmanager
async def served_floor() -> AsyncIterator[tuple[trio.Process, str]]:
    """``bench/sse_floor.py`` in a subprocess: the raw broadcaster."""
    command = [sys.executable, str(ROOT / "bench" / "sse_floor.py"), "--port", "0"]
    process = await trio.lowlevel.open_process(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        lines = LineReader(process.stdout)
        url = (await lines.next()).split()[-1]
        assert await lines.next() == "Ctrl-C to stop"
        yield process, url
    finally:
        process.terminate()
        await process.wait()


@asynccontextmanager
async def shadowing(source: Path | None) -> AsyncIterator[str]:
    """The server's ``PYTHONPATH``: this checkout, or a folder holding only
    ``source``'s ``a2trio`` package before it (this script and its app stay as
    they are, the package under them is the other checkout's)."""
    if source is None:
        yield str(ROOT)
        return
    with tempfile.TemporaryDirectory(prefix="a2bench-") as folder:
        link(source / "a2trio", Path(folder) / "a2trio")
        yield f"{folder}{os.pathsep}{ROOT}"


def link(target: Path, name: Path) -> None:
    name.symlink_to(target.resolve())


@asynccontextmanager
async def backend_env(store: str, args: argparse.Namespace) -> AsyncIterator[dict[str, str]]:
    """The server's environment for ``store``; creates and removes its data."""
    if store == "memory":
        yield {"A2_BENCH_STORE": "memory"}
    elif store == "redis":
        from drain import delete_redis_prefix

        prefix = f"a2bench-{secrets.token_hex(4)}"
        try:
            yield {
                "A2_BENCH_STORE": "redis",
                "A2_BENCH_REDIS_URL": args.redis_url,
                "A2_BENCH_REDIS_PREFIX": prefix,
            }
        finally:
            await delete_redis_prefix(args.redis_url, prefix)
    elif store == "postgres":
        async with fresh_postgres(args.dsn) as dsn:
            yield {"A2_BENCH_STORE": "postgres", "A2_BENCH_DSN": dsn}
    else:
        raise SystemExit(f"unknown store {store!r}: memory, postgres or redis")


@asynccontextmanager
async def fresh_postgres(dsn: str) -> AsyncIterator[str]:
    """A fresh database on ``dsn``'s server, dropped afterwards: its DSN."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    database = f"a2trio_bench_{secrets.token_hex(4)}"
    admin = make_conninfo(dsn, dbname="postgres")

    def run(sql: str) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql)

    await trio.to_thread.run_sync(run, f'create database "{database}"')
    params = conninfo_to_dict(dsn)
    params["dbname"] = database
    try:
        yield make_conninfo(**params)
    finally:
        await trio.to_thread.run_sync(run, f'drop database "{database}" with (force)')


def rss_mib(pid: int) -> float:
    """The process's resident memory now, MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def marker(n: int) -> bytes:
    """What identifies round ``n``'s event in an SSE frame or a socket frame."""
    return f'"payload":{{"n":{n}}}'.encode()


def raw_subscribers(host: str, port: int, request: bytes, count: int, rounds: int) -> None:
    """The subscribers' process: ``count`` raw TCP connections on one epoll loop.

    Cheaper per delivery than any client library, so the figure is the
    server's. Both SSE and socket frames carry the event's JSON verbatim
    (server-to-client socket frames are unmasked), so arrival is the round's
    marker showing up in a connection's bytes. Prints ``open`` once every
    stream answered, ``done N`` when every connection has round N, then one
    JSON line of arrival times (``time.perf_counter``, the system's monotonic
    clock, comparable across processes).
    """
    selector = selectors.DefaultSelector()
    markers = [marker(n) for n in range(rounds)]
    arrivals = [[0.0] * count for _ in range(rounds)]
    missing = [count] * rounds
    next_round = [0] * count
    tails = [b""] * count
    opened = [False] * count
    open_count = 0
    sockets: list[socket.socket] = []

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

    for i in range(count):
        # In batches, so hypercorn's accept backlog (100) never overflows.
        while i - open_count >= 50:
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


def subscribe_request(scenario: str, session: str) -> bytes:
    if scenario == "sse":
        return (
            f"GET /bench/{session} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /bench/{session}/ws HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


async def run_fanout(
    url: str,
    scenario: str,
    subscribers: int,
    rounds: int,
    timed: Callable[[], AbstractAsyncContextManager[None]],
    pid: int,
) -> tuple[list[float], float]:
    """``subscribers`` of one session in a subscribers' process; ``rounds``
    appends one at a time, each waiting until every subscriber has it. Returns
    the latencies and the server's resident KiB per idle subscriber."""
    host, port = url.removeprefix("http://").split(":")
    session = f"{scenario}-{subscribers}-{secrets.token_hex(2)}"
    request = subscribe_request(scenario, session)
    command = [
        sys.executable,
        __file__,
        "--raw-subscribers",
        json.dumps([host, int(port), request.decode(), subscribers, rounds]),
    ]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    assert process.stdout is not None
    lines = LineReader(process.stdout)
    started: list[float] = []
    before = rss_mib(pid)
    try:
        with trio.fail_after(300):
            assert await lines.next() == "open"
        idle_kib = (rss_mib(pid) - before) * 1024 / subscribers
        async with httpx.AsyncClient(base_url=url, timeout=120) as client, timed():
            for n in range(rounds):
                started.append(time.perf_counter())
                body = {"events": [{"type": "tick", "payload": {"n": n}}]}
                (await client.post(f"/bench/{session}", json=body)).raise_for_status()
                with trio.fail_after(120):
                    assert await lines.next() == f"done {n}"
        arrivals = json.loads(await lines.next())
    finally:
        with trio.move_on_after(5):
            await process.wait()
        process.kill()
    return [(t - started[n]) * 1000 for n, row in enumerate(arrivals) for t in row], idle_kib


class LineReader:
    """Lines from a subprocess's stdout."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some(1 << 20)
            if not chunk:
                raise RuntimeError("the subscribers' process ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


async def run_ws_mux(
    url: str,
    subscribers: int,
    rounds: int,
    posters: int,
    timed: Callable[[], AbstractAsyncContextManager[None]],
) -> list[float]:
    tag = secrets.token_hex(2)
    sessions = [f"m{tag}-{i}" for i in range(subscribers)]
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
        async with httpx.AsyncClient(base_url=url, limits=limits) as client, timed():
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


Row = tuple[str, str, str, int, int, list[float], float, float, float, float]


async def run_store(
    store: str, args: argparse.Namespace, rows: list[Row], label: str, source: Path | None
) -> None:
    async with served(store, args, source) as (process, url):
        for scenario in args.scenarios:
            counts = [args.mux_sessions] if scenario == "ws-mux" else args.subscribers
            for subs in counts:
                if scenario == "ws" and subs > args.ws_max:
                    continue
                await run_scenario(process, url, args, rows, (label, store, scenario, subs))


async def run_floor(args: argparse.Namespace, rows: list[Row]) -> None:
    """The sse scenario against the raw broadcaster (``bench/sse_floor.py``)."""
    async with served_floor() as (process, url):
        for subs in args.subscribers:
            await run_scenario(process, url, args, rows, ("floor", "-", "sse", subs))


async def run_scenario(
    process: trio.Process,
    url: str,
    args: argparse.Namespace,
    rows: list[Row],
    what: tuple[str, str, str, int],
) -> None:
    import pyspy

    label, store, scenario, subs = what
    name = f"{label}-{store}-{scenario}-{subs}.txt"
    profile = args.profile / name if args.profile else None
    cpu: list[float] = []

    @asynccontextmanager
    async def timed() -> AsyncIterator[None]:
        async with pyspy.recording(process.pid, profile):
            cpu.append(cpu_s(process.pid))
            yield
            cpu.append(cpu_s(process.pid))

    t0 = time.perf_counter()
    idle = float("nan")
    if scenario in ("sse", "ws"):
        values, idle = await run_fanout(url, scenario, subs, args.rounds, timed, process.pid)
        rounds = args.rounds
    else:
        values = await run_ws_mux(url, subs, args.mux_rounds, args.posters, timed)
        rounds = args.mux_rounds
    wall = time.perf_counter() - t0
    per_delivery = (cpu[1] - cpu[0]) / len(values) * 1e6
    rss = rss_mib(process.pid)
    row = (label, store, scenario, subs, rounds, values, wall, rss, per_delivery, idle)
    rows.append(row)
    print("row:", format_row(row), flush=True)
    if profile is not None:
        print(pyspy.summary(profile), flush=True)


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(args: argparse.Namespace) -> None:
    rows: list[Row] = []
    sides: list[tuple[str, Path | None]] = [("this", None)]
    if args.baseline is not None:
        sides = [("base", args.baseline), *sides]
    for _ in range(args.repeat):
        for store in args.store:
            for label, source in sides:
                await run_store(store, args, rows, label, source)
        if args.floor:
            await run_floor(args, rows)
    print(
        f"{'code':<5} {'store':<9} {'scenario':<8} {'subs':>6} {'rounds':>6} {'deliveries':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'wall s':>7} {'rss MiB':>8} "
        f"{'srv µs/dlv':>10} {'idle KiB':>8}"
    )
    for row in rows:
        print(format_row(row))
    if args.floor:
        print_against_floor(rows)


def format_row(row: Row) -> str:
    label, store, name, subs, rounds, values, wall, rss, per_delivery, idle = row
    return (
        f"{label:<5} {store:<9} {name:<8} {subs:>6} {rounds:>6} {len(values):>10} "
        f"{statistics.median(values):>8.1f} {percentile(values, 0.99):>8.1f} "
        f"{max(values):>8.1f} {wall:>7.1f} {rss:>8.1f} {per_delivery:>10.1f} {idle:>8.1f}"
    )


def print_against_floor(rows: list[Row]) -> None:
    """Each sse row's p50, p99, server µs per delivery and KiB per idle
    follower beside the floor's (medians over ``--repeat``), and the ratio."""

    def figures(picked: list[Row]) -> list[float]:
        return [
            statistics.median(statistics.median(r[5]) for r in picked),
            statistics.median(percentile(r[5], 0.99) for r in picked),
            statistics.median(r[8] for r in picked),
            statistics.median(r[9] for r in picked),
        ]

    print(f"\n{'':<20} {'p50 ms':>14} {'p99 ms':>14} {'srv µs/dlv':>14} {'idle KiB':>14}")
    for subs in sorted({r[3] for r in rows if r[0] == "floor"}):
        floor = figures([r for r in rows if r[0] == "floor" and r[3] == subs])
        print(f"{f'floor {subs}':<20} " + " ".join(f"{v:>14.1f}" for v in floor))
        for label, store in sorted({(r[0], r[1]) for r in rows if r[0] != "floor"}):
            picked = [r for r in rows if (r[0], r[1], r[2], r[3]) == (label, store, "sse", subs)]
            if picked:
                cells = [
                    f"{v:.1f} ({v / f:.2f}x)" for v, f in zip(figures(picked), floor, strict=True)
                ]
                print(f"{f'{label} {store} {subs}':<20} " + " ".join(f"{c:>14}" for c in cells))


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=lambda s: s.split(","), default=["memory"])
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=["sse", "ws", "ws-mux"])
    parser.add_argument("--subscribers", type=_ints, default=[1000], help="e.g. 1000,10000")
    parser.add_argument("--rounds", type=int, default=10, help="appends per sse/ws run")
    parser.add_argument("--ws-max", type=int, default=1000, help="most single-session sockets")
    parser.add_argument("--mux-sessions", type=int, default=1000)
    parser.add_argument("--mux-rounds", type=int, default=2, help="appends per mux session")
    parser.add_argument("--posters", type=int, default=16, help="concurrent POSTs (mux)")
    parser.add_argument("--profile", type=Path, help="py-spy the server into this folder")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout: its a2trio runs first, side by side"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every configuration")
    parser.add_argument("--floor", action="store_true", help="sse against bench/sse_floor.py too")
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--versions", action="store_true", help="print versions first")
    parser.add_argument("--raw-subscribers", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.raw_subscribers:
        host, port, request, count, rounds = json.loads(arguments.raw_subscribers)
        raw_subscribers(host, port, request.encode(), count, rounds)
        raise SystemExit(0)
    if arguments.versions:
        print(
            f"python {sys.version.split()[0]}, trio {trio.__version__}, "
            f"msgspec {msgspec.__version__}, hypercorn {metadata.version('hypercorn')}, "
            f"a2trio {a2trio.__version__}"
        )
    trio.run(main, arguments)
