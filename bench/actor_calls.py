"""What an actor call costs beside a plain append (issue 19).

    .venv/bin/python bench/actor_calls.py [--calls 500] [--dsn postgresql://...]

On each store (memory, SQLite in a temporary file, and Postgres in a fresh
schema when ``--dsn`` is given), ``--calls`` sequential operations on one
session, side by side:

* ``append + state``: ``session.append`` then ``session.state()``, what an app
  would do by hand to answer with the new state (no conditional commit);
* ``call``: ``actor.call`` (read the state, run the call, conditional append);
* ``call + messageId``: the same with a ``messageId`` (derived event ids, and
  the lookup that finds nothing);
* ``retry``: the same ``messageId`` again (the lookup finds the committed
  call and rebuilds its answer from the log; nothing runs).

Prints the median time per operation in milliseconds.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import psycopg
import trio

import a2trio


class Added(msgspec.Struct, frozen=True):
    n: int


def fold(total: int, event: a2trio.Event[Added]) -> int:
    return total + event.payload.n


async def add(total: int, n: int) -> a2trio.AppendInput:
    return counter.event("added", Added(n))


counter = a2trio.actor(
    "counter",
    events={"added": Added},
    state=a2trio.Reducer("total", 0, fold),
    calls={"add": a2trio.call(int, add)},
)


@asynccontextmanager
async def stores(dsn: str | None) -> AsyncIterator[list[tuple[str, a2trio.Store]]]:
    folder = tempfile.mkdtemp(prefix="a2trio-actor-bench-")
    schema = f"ab_{secrets.token_hex(4)}"
    found: list[tuple[str, a2trio.Store]] = [
        ("memory", a2trio.stores.memory()),
        ("sqlite", a2trio.stores.sqlite(str(Path(folder) / "bench.db"))),
    ]
    if dsn is not None:
        found.append(("postgres", a2trio.stores.postgres(dsn, schema=schema)))
    try:
        yield found
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if dsn is not None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'drop schema if exists "{schema}" cascade')


async def timed(calls: int, operation: Callable[[int], Awaitable[object]]) -> float:
    samples = []
    for n in range(calls):
        started = time.perf_counter()
        await operation(n)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


async def measure(server: a2trio.Server, calls: int) -> list[float]:
    session = server.session("plain")
    actor = server.actor("called")
    keyed = server.actor("keyed")

    async def append_and_state(n: int) -> object:
        await session.append(counter.event("added", Added(n)))
        return await session.state(counter.reducer)

    return [
        await timed(calls, append_and_state),
        await timed(calls, lambda n: actor.call("add", n)),
        await timed(calls, lambda n: keyed.call("add", n, message_id=f"m{n}")),
        await timed(calls, lambda n: keyed.call("add", n, message_id=f"m{n}")),
    ]


async def run(args: argparse.Namespace) -> None:
    rows = []
    async with stores(args.dsn) as found:
        for name, store in found:
            async with a2trio.Server(counter, store=store) as server:
                rows.append((name, await measure(server, args.calls)))
    print(f"median ms per operation, {args.calls} sequential operations on one session")
    print(f"{'store':<10}{'append + state':>16}{'call':>10}{'call + messageId':>18}{'retry':>10}")
    for name, figures in rows:
        a, b, c, d = figures
        print(f"{name:<10}{a:>16.3f}{b:>10.3f}{c:>18.3f}{d:>10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--dsn", default=None, help="also measure Postgres")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
