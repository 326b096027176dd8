"""SQLite append latency against the session's length (issue 17).

    python bench/sqlite_append.py                              # 1k, 10k, 50k, 60k
    python bench/sqlite_append.py --lengths 1000,60000 --samples 500

For each length a fresh file in a temporary folder gets three sessions, each
filled to that many handled events (``--fill`` events per append, settled, so
the history is processed as a long-lived session's is). Then, on the real
clock, one store and no server:

* ``append 1``: ``--samples`` sequential one-event appends of an unhandled
  event, after ``WARM_UP`` untimed ones; p50 and p99;
* ``append 1, claimed``: the same with a ``ClaimRequest``, as a server's
  inline append asks (the claimed rows stay claimed: the claim check sees the
  same few live rows at every length);
* ``push 100``: ``--pushes`` appends of ``--batch`` events each (a 100-event
  ``session.push``), after one untimed one; p50 and max. An append holds the
  file's write lock for its whole transaction, so this is also how long it
  keeps other writers, in this process or another, waiting.

``--floor`` measures instead appends per second against the floor (issue 30):
``--appends`` one-event appends from one task, then spread over ``--tasks``
tasks (one session each), on a fresh file; beside them, in the same run, the
same count of raw ``BEGIN IMMEDIATE``/``INSERT``/``COMMIT`` transactions on one
``sqlite3`` connection through ``trio.to_thread`` (behind a ``trio.Lock``, as
a store with one writer connection must be), and the same without Trio,
in-thread. The store's rows also say how its writer's thread group-committed
them (writes per transaction).

Each measurement has its own session, so the length it names is the length
it ran at (plus at most a few hundred events). ``--rounds`` repeats the whole
set (every length, a fresh file each time) and prints each figure's median
over the rounds, which irons out a busy neighbour on a shared machine. The
last row divides the last length's figures by the first's: constant time in
the session's length means about 1x.

Running it against an older checkout (``git worktree add /tmp/old <commit>``,
then ``python bench/sqlite_append.py --source /tmp/old``) measures that
code with this script.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import msgspec
import trio


def _source_from_argv(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--source" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--source="):
            return arg.split("=", 1)[1]
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# `--source` picks the a2trio checkout to measure, so it must act before the import.
sys.path.insert(0, os.path.abspath(_source_from_argv(sys.argv[1:])))

import a2trio  # noqa: E402
from a2trio.stores.base import AppendEvent, ClaimRequest  # noqa: E402
from a2trio.stores.sqlite import SqliteStore  # noqa: E402

#: Untimed appends before each timed series: the first uses of a connection
#: prepare statements and warm the page cache.
WARM_UP = 20

HOLDER = "bench-holder"
#: Long enough that no claim lapses during a run.
TTL_MS = 3_600_000


def _event(n: int, *, settled: bool = False) -> AppendEvent:
    return AppendEvent(type="tick", payload={"n": n}, settled=settled)


async def _fill(store: SqliteStore, session_id: str, length: int, per_append: int) -> None:
    done = 0
    while done < length:
        batch = min(per_append, length - done)
        await store.append(session_id, [_event(done + i, settled=True) for i in range(batch)])
        done += batch


async def _timed(
    store: SqliteStore, session_id: str, count: int, size: int, claim: ClaimRequest | None
) -> list[float]:
    """Milliseconds per append of ``size`` events, ``count`` of them in a row."""
    gaps: list[float] = []
    for n in range(count):
        events = [_event(n * size + i) for i in range(size)]
        before = time.perf_counter()
        await store.append(session_id, events, claim=claim)
        gaps.append((time.perf_counter() - before) * 1000)
    return gaps


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def measure(length: int, args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, float] = {}
    claim = ClaimRequest(holder=HOLDER, ttl_ms=TTL_MS)
    with tempfile.TemporaryDirectory() as folder:
        store = a2trio.stores.sqlite(os.path.join(folder, "bench.db"))
        try:
            for sid in ("single", "claimed", "push"):
                await _fill(store, sid, length, args.fill)
            await _timed(store, "single", WARM_UP, 1, None)
            gaps = await _timed(store, "single", args.samples, 1, None)
            row["append 1 p50"], row["append 1 p99"] = statistics.median(gaps), _p99(gaps)
            await _timed(store, "claimed", WARM_UP, 1, claim)
            gaps = await _timed(store, "claimed", args.samples, 1, claim)
            row["claimed p50"], row["claimed p99"] = statistics.median(gaps), _p99(gaps)
            await _timed(store, "push", 1, args.batch, None)
            gaps = await _timed(store, "push", args.pushes, args.batch, None)
            row["push p50"], row["push max"] = statistics.median(gaps), max(gaps)
        finally:
            await store.aclose()
    return row


COLUMNS = (
    ("append 1 p50", "append 1 p50 ms"),
    ("append 1 p99", "append 1 p99 ms"),
    ("claimed p50", "append 1, claimed p50 ms"),
    ("claimed p99", "append 1, claimed p99 ms"),
    ("push p50", "push {batch} p50 ms"),
    ("push max", "push {batch} max ms"),
)


FLOOR_TABLE = (
    "create table floor_rows (session_id text, idx integer, body text,"
    " primary key (session_id, idx))"
)
FLOOR_INSERT = "insert into floor_rows values (?, ?, ?)"


def _floor_connection(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("pragma journal_mode = wal")
    conn.execute("pragma synchronous = normal")
    conn.execute(FLOOR_TABLE)
    return conn


def _floor_transaction(conn: sqlite3.Connection, session_id: str, n: int) -> None:
    conn.execute("begin immediate")
    conn.execute(FLOOR_INSERT, (session_id, n, '{"n": 0}'))
    conn.execute("commit")


async def _spread(tasks: int, count: int, one: Callable[[str, int], Awaitable[object]]) -> float:
    """Appends/s of ``count`` calls of ``one`` spread over ``tasks`` tasks."""
    per_task = count // tasks

    async def writer(k: int) -> None:
        for n in range(per_task):
            await one(f"t{k}", n)

    before = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(writer, k)
    return per_task * tasks / (time.perf_counter() - before)


async def floor(tasks: int, args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = a2trio.stores.sqlite(os.path.join(folder, "bench.db"))
        try:
            await _timed(store, "warm", WARM_UP, 1, None)

            async def append(session_id: str, n: int) -> None:
                await store.append(session_id, [_event(n)])

            before = store.group_statistics() if hasattr(store, "group_statistics") else None
            row["store"] = await _spread(tasks, args.appends, append)
            if before is not None:
                after = store.group_statistics()
                row["per commit"] = (after.members - before.members) / max(
                    1, after.groups - before.groups
                )
        finally:
            await store.aclose()
        conn = _floor_connection(os.path.join(folder, "floor.db"))
        lock = trio.Lock()

        async def raw(session_id: str, n: int) -> None:
            async with lock:
                await trio.to_thread.run_sync(_floor_transaction, conn, session_id, n)

        try:
            row["to_thread"] = await _spread(tasks, args.appends, raw)
            before_raw = time.perf_counter()
            for n in range(args.appends):
                _floor_transaction(conn, "raw", n)
            row["raw"] = args.appends / (time.perf_counter() - before_raw)
        finally:
            conn.close()
    return row


def floors(args: argparse.Namespace, versions: str) -> None:
    source = os.path.dirname(os.path.abspath(a2trio.__file__))
    print(
        f"# bench/sqlite_append.py --floor: medians of {args.rounds} rounds of "
        f"{args.appends:,} appends; a2trio from {source}; {versions}"
    )
    print(
        "| tasks | store appends/s | writes per commit | raw via to_thread/s | raw/s"
        " | store / to_thread |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for tasks in (1, args.tasks):
        found = [trio.run(floor, tasks, args) for _ in range(args.rounds)]
        med = {key: statistics.median(r.get(key, 0.0) for r in found) for key in found[0]}
        per_commit = f"{med['per commit']:.1f}" if "per commit" in med else "n/a"
        print(
            f"| {tasks} | {med['store']:,.0f} | {per_commit} | {med['to_thread']:,.0f} | "
            f"{med['raw']:,.0f} | {med['store'] / med['to_thread']:.2f}x |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lengths", default="1000,10000,50000,60000", help="comma-separated session lengths"
    )
    parser.add_argument("--samples", type=int, default=300, help="timed one-event appends")
    parser.add_argument("--pushes", type=int, default=10, help="timed multi-event appends")
    parser.add_argument("--batch", type=int, default=100, help="events per push")
    parser.add_argument("--fill", type=int, default=1000, help="events per append when filling")
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many runs")
    parser.add_argument("--source", default=None, help="the a2trio checkout to measure")
    parser.add_argument("--floor", action="store_true", help="appends/s against the raw floor")
    parser.add_argument("--appends", type=int, default=3000, help="appends per --floor figure")
    parser.add_argument("--tasks", type=int, default=10, help="appending tasks, --floor")
    parser.add_argument("--versions", action="store_true", help="print versions and exit")
    args = parser.parse_args(argv)
    versions = (
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
        f"trio {trio.__version__}, msgspec {msgspec.__version__}"
    )
    if args.versions:
        print(versions)
        return
    if args.floor:
        floors(args, versions)
        return
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    runs: dict[int, list[dict[str, float]]] = {length: [] for length in lengths}
    for _ in range(args.rounds):
        for length in lengths:
            runs[length].append(trio.run(measure, length, args))
    rows = {
        length: {key: statistics.median(run[key] for run in found) for key, _ in COLUMNS}
        for length, found in runs.items()
    }
    heads = [head.format(batch=args.batch) for _, head in COLUMNS]
    source = os.path.dirname(os.path.abspath(a2trio.__file__))
    print(
        f"# bench/sqlite_append.py: medians of {args.rounds} rounds of {args.samples} samples "
        f"and {args.pushes} pushes of {args.batch}; a2trio from {source}; {versions}"
    )
    print("| session length | " + " | ".join(heads) + " |")
    print("| ---: | " + " | ".join("---:" for _ in heads) + " |")
    for length, row in rows.items():
        cells = " | ".join(f"{row[key]:.3f}" for key, _ in COLUMNS)
        print(f"| {length:,} | {cells} |")
    if len(lengths) > 1:
        first, last = rows[lengths[0]], rows[lengths[-1]]
        cells = " | ".join(f"{last[key] / first[key]:.2f}x" for key, _ in COLUMNS)
        print(f"| {lengths[-1]:,} / {lengths[0]:,} | {cells} |")


if __name__ == "__main__":
    main()
