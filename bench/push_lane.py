"""The HTTP push lane against hypercorn's own floor, per store, in one run.

For each store (``--store memory,sqlite,postgres``) two servers run at once,
each on a fresh store, and take the same load in turns (``--slices``
alternations of ``--slice`` seconds each, after a ``--warmup``), for
``--repeat`` rounds of fresh servers:

* **a2trio**: ``python -m a2trio.serve bench.push_lane:server`` (hypercorn's trio
  worker), ``POST /bench/{session}`` with ``{"events": [{"type": "tick",
  "payload": {"n": N}}]}``: routing, body limits, ``authorize``
  (none configured), ``validate_push``, the contract's schema, the append
  and the ``{"events": [...]}`` answer;
* **bare**: a minimal ASGI app on the same hypercorn worker and config that
  reads the same body, decodes it with msgspec, calls ``store.append`` on the
  same kind of store (a fresh one) and answers the same JSON: the floor of
  a push on this machine (no validation, no routing, no authorization).

The load is ``wrk`` (Debian's package: ``apt-get install wrk``) on loopback:
``--connections`` keep-alive connections over ``--sessions`` sessions. Each
row gives pushes/s over the round's slices, the median of the slices' wrk
latency percentiles, the server's CPU per push, and the ratio of a2trio to
the bare floor from the same round::

    .venv/bin/python bench/push_lane.py [--store memory,sqlite,postgres] [--repeat 3]
    .venv/bin/python bench/push_lane.py --store memory --profile /tmp/http   # py-spy a2trio
    .venv/bin/python bench/push_lane.py --store sqlite,postgres --workers 2
    .venv/bin/python bench/push_lane.py --no-access-log   # serve --no-access-log

With ``--workers N`` a2trio runs as ``serve --workers N`` and the floor as N
bare processes on the one port (each binding it with ``SO_REUSEPORT``, as
a2trio's workers do); the CPU per push is that of every process of the
server (a2trio's supervisor too), and ``--profile`` samples a2trio's first
worker. A memory store cannot be shared by processes, so N > 1 needs
``sqlite`` or ``postgres``.

Compare the ratios of one run (the machine has 2 cores shared by the server
and wrk), not absolute figures.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import a2trio  # noqa: E402
from a2trio.stores.base import AppendEvent, Store  # noqa: E402
from a2trio.transport.wire import iso_ms  # noqa: E402


class Tick(msgspec.Struct, frozen=True):
    n: int


bench = a2trio.contract("bench", events={"tick": Tick})


def _served_store() -> Store:
    """The store the parent asked for (``A2_BENCH_STORE``: a store URL)."""
    return a2trio.stores.from_url(os.environ.get("A2_BENCH_STORE", "memory:"))


#: What ``python -m a2trio.serve bench.push_lane:server`` serves.
server = a2trio.Server(bench, store=_served_store())


# -- the bare floor -------------------------------------------------------------------


class _PushedEvent(msgspec.Struct, frozen=True):
    type: str
    payload: Any = None
    id: str | None = None


class _Push(msgspec.Struct, frozen=True):
    events: list[_PushedEvent]


_decode_push = msgspec.json.Decoder(_Push).decode
_encode = msgspec.json.Encoder().encode
_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]


def bare_app(store: Store) -> Any:
    """The floor: an ASGI app that appends a push's events to ``store`` as they
    came and answers them back, with nothing else in between."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            # Entered for the app's lifetime, as a2trio's server enters it (the
            # Postgres store's listener and group commits live in its nursery).
            async with store:
                await send({"type": "lifespan.startup.complete"})
                await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        push = _decode_push(body)
        session = scope["path"].rpartition("/")[2]
        # Settled, as a2trio writes an event type that no handler takes.
        events = [AppendEvent(e.type, e.payload, e.id, settled=True) for e in push.events]
        result = await store.append("bare:" + session, events)
        answer = _encode(
            {
                "events": [
                    {
                        "id": row.id,
                        "type": row.type,
                        "payload": row.payload,
                        "index": row.index,
                        "sessionId": session,
                        "createdAt": iso_ms(row.created_at_ms),
                    }
                    for row in result.events
                ]
            }
        )
        headers = [*_HEADERS, (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


def serve_bare(port: int, workers: int) -> None:
    """The bare floor's process: hypercorn's trio worker, configured as
    ``a2trio.serve`` configures it, with the same collector tuning; one of
    ``workers`` on the port (``SO_REUSEPORT`` when more than one)."""
    import warnings

    import hypercorn.config
    import hypercorn.trio

    app = bare_app(_served_store())
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 5.0
    config.worker_class = "trio"
    # hypercorn binds with SO_REUSEPORT for more than one worker; its serve()
    # warns that it starts none itself, which is meant.
    config.workers = workers
    warnings.filterwarnings("ignore", "The config `workers` has no affect", Warning)
    a2trio.tune_gc()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn.trio.serve, app, config)
            for url in binds:
                print(f"bare serving on {url}", flush=True)
            print("Ctrl-C to stop", flush=True)

    trio.run(run)


# -- driving --------------------------------------------------------------------------


@asynccontextmanager
async def fresh_store(name: str, dsn: str) -> AsyncIterator[str]:
    """A store URL for ``name`` whose data is new, removed afterwards."""
    if name == "memory":
        yield "memory:"
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
    elif name == "postgres":
        import psycopg
        from psycopg.conninfo import make_conninfo

        database = f"a2trio_bench_{secrets.token_hex(4)}"
        admin = make_conninfo(dsn, dbname="postgres")

        def run(sql: str) -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql)

        await trio.to_thread.run_sync(run, f'create database "{database}"')
        try:
            yield urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))
        finally:
            await trio.to_thread.run_sync(run, f'drop database "{database}" with (force)')
    else:
        raise SystemExit(f"unknown store {name!r}: memory, sqlite or postgres")


class Served:
    """A running server: its processes (a2trio's supervisor first) and URL."""

    def __init__(self, processes: list[trio.Process], url: str) -> None:
        self.processes = processes
        self.url = url

    def pids(self) -> list[int]:
        """Every process serving: the started ones and their children
        (``serve --workers``' workers)."""
        started = [p.pid for p in self.processes]
        return started + [c for pid in started for c in children(pid)]

    def profiled(self) -> int:
        """The process to sample: a2trio's first worker, or the only one."""
        spawned = children(self.processes[0].pid)
        workers = [pid for pid in spawned if b"spawn_main" in _cmdline(pid)]
        return min(workers) if workers else self.processes[0].pid


def children(pid: int) -> list[int]:
    """A process's children (Linux)."""
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


@asynccontextmanager
async def served(
    kind: str, store_url: str, workers: int = 1, access_log: bool = True
) -> AsyncIterator[tuple[Served, str]]:
    """The a2trio or the bare server on a free port, with its URL: a2trio as
    ``serve --workers N`` (``--no-access-log`` without ``access_log``), the
    floor as N bare processes on the port."""
    port = free_port()
    if kind == "a2trio":
        command = [
            sys.executable,
            "-m",
            "a2trio.serve",
            "bench.push_lane:server",
            "--port",
            str(port),
            "--workers",
            str(workers),
            *([] if access_log else ["--no-access-log"]),
        ]
        commands = [command]
    else:
        bare = [sys.executable, __file__, "--serve-bare", str(port), "--workers", str(workers)]
        commands = [bare] * workers
    env = {**os.environ, "PYTHONPATH": str(ROOT), "A2_BENCH_STORE": store_url}
    processes: list[trio.Process] = []
    try:
        for command in commands:
            process = await trio.lowlevel.open_process(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            processes.append(process)
            assert process.stdout is not None
            text = b""
            while b"Ctrl-C" not in text:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"{kind} server did not start: {text.decode()}")
                text += chunk
        yield Served(processes, f"http://127.0.0.1:{port}"), f"http://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            with trio.move_on_after(20):
                await process.wait()
            process.kill()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


WRK_SCRIPT = """
local n = 0
request = function()
  n = n + 1
  local path = "/bench/s" .. (n % {sessions})
  local body = '{{"events":[{{"type":"tick","payload":{{"n":' .. n .. '}}}}]}}'
  return wrk.format("POST", path, {{["Content-Type"] = "application/json"}}, body)
end
"""


class Result(msgspec.Struct):
    pushes_s: float
    p50_ms: float
    p99_ms: float
    cpu_us: float


class Slice(msgspec.Struct):
    pushes: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float


def combined(slices: list[Slice]) -> Result:
    """Slices of one server as one result: total rate and CPU per push, the
    median of the slices' percentiles."""
    pushes = sum(s.pushes for s in slices)
    return Result(
        pushes / sum(s.seconds for s in slices),
        statistics.median(s.p50_ms for s in slices),
        statistics.median(s.p99_ms for s in slices),
        sum(s.cpu_s for s in slices) / max(pushes, 1) * 1e6,
    )


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


async def load(url: str, server: Served, args: argparse.Namespace, seconds: int) -> Slice:
    """``wrk`` against ``url`` for ``seconds``, and the server's CPU meanwhile
    (every process of it)."""
    command = ["wrk", "-t1", f"-c{args.connections}", f"-d{seconds}s", "--latency"]
    script = args.script
    pids = server.pids()
    before = sum(cpu_s(pid) for pid in pids)
    done = await trio.run_process([*command, "-s", str(script), url], capture_stdout=True)
    spent = sum(cpu_s(pid) for pid in pids) - before
    out = done.stdout.decode()
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw failures:\n{out}")
    found = re.search(r"(\d+) requests in ([\d.]+)(ms|s)", out)
    assert found is not None, out
    elapsed = float(found.group(2)) / (1000 if found.group(3) == "ms" else 1)
    # Anchored: the stdev column ("71.50%") must not pass for the 50% row.
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    return Slice(int(found.group(1)), elapsed, p50, p99, spent)


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(store: str, args: argparse.Namespace, round_: int) -> tuple[Result, Result]:
    """Both servers up at once on fresh stores; ``wrk`` alternates between them
    ``--slices`` times, so both see the same machine load."""
    import pyspy

    async with (
        fresh_store(store, args.dsn) as bare_url,
        fresh_store(store, args.dsn) as ours_url,
        served("bare", bare_url, args.workers) as (bare, bare_base),
        served("a2trio", ours_url, args.workers, args.access_log) as (ours, ours_base),
    ):
        await load(bare_base, bare, args, args.warmup)
        await load(ours_base, ours, args, args.warmup)
        out = args.profile / f"a2trio-{store}-{round_}.txt" if args.profile else None
        slices: dict[str, list[Slice]] = {"bare": [], "a2trio": []}
        async with pyspy.recording(ours.profiled(), out):
            for _ in range(args.slices):
                slices["bare"].append(await load(bare_base, bare, args, args.slice))
                slices["a2trio"].append(await load(ours_base, ours, args, args.slice))
        if out is not None:
            print(pyspy.summary(out), flush=True)
        return combined(slices["bare"]), combined(slices["a2trio"])


async def main(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("bench/push_lane.py needs wrk: apt-get install wrk")
    if args.workers > 1 and "memory" in args.store:
        raise SystemExit("--workers needs a store the processes share: --store sqlite,postgres")
    rows: list[tuple[str, int, Result, Result]] = []
    with tempfile.TemporaryDirectory(prefix="a2bench-") as folder:
        args.script = Path(folder) / "push.lua"
        args.script.write_text(WRK_SCRIPT.format(sessions=args.sessions))
        for round_ in range(1, args.repeat + 1):
            for store in args.store:
                bare, ours = await measure(store, args, round_)
                rows.append((store, round_, bare, ours))
                print(f"{store} round {round_}: bare {bare}, a2trio {ours}", flush=True)
    print(f"\n{args.workers} worker(s) per server")
    print(
        f"{'store':<9} {'run':>3} {'bare push/s':>11} {'a2trio push/s':>13} {'ratio':>6} "
        f"{'bare p50/p99 ms':>16} {'a2trio p50/p99 ms':>18} {'bare µs':>8} {'a2trio µs':>9}"
    )
    for store, round_, bare, ours in rows:
        print(
            f"{store:<9} {round_:>3} {bare.pushes_s:>11,.0f} {ours.pushes_s:>13,.0f} "
            f"{ours.pushes_s / bare.pushes_s:>6.2f} "
            f"{f'{bare.p50_ms:.2f} / {bare.p99_ms:.2f}':>16} "
            f"{f'{ours.p50_ms:.2f} / {ours.p99_ms:.2f}':>18} "
            f"{bare.cpu_us:>8.0f} {ours.cpu_us:>9.0f}"
        )
    for store in args.store:
        ratios = [o.pushes_s / b.pushes_s for s, _, b, o in rows if s == store]
        print(
            f"{store}: a2trio / bare {min(ratios):.2f}-{max(ratios):.2f} "
            f"(median {statistics.median(ratios):.2f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=lambda s: s.split(","), default=["memory"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slices", type=int, default=5, help="alternations per round")
    parser.add_argument("--slice", type=int, default=2, help="seconds of each slice")
    parser.add_argument("--warmup", type=int, default=2, help="untimed seconds first")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--workers", type=int, default=1, help="server processes on the port, for both servers"
    )
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="serve a2trio without its access log (one record per request, on by default)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the a2trio server into this folder")
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_bare is not None:
        serve_bare(arguments.serve_bare, arguments.workers)
        raise SystemExit(0)
    trio.run(main, arguments)
