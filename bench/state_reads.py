"""Concurrent ``state()`` calls: coalesced into one ``read_states`` (issue 23).

    .venv/bin/python bench/state_reads.py [--dsn postgresql://...] [--sessions 100]

On a fresh Postgres schema, ``--sessions`` sessions of 10 events each; then,
``--rounds`` times, every session's state at once: through ``session.state()``
(same-round calls coalesce into one ``read_states``) and, side by side, the
same reads as one ``store.read_state`` per session (what ``state()`` did
before). Prints the median time per round and the store round trips.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from typing import Any

import msgspec
import psycopg
import trio

import a2trio

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/postgres"


class Note(msgspec.Struct, frozen=True):
    n: int


notes = a2trio.contract("statebench", events={"note": Note})


async def run(args: argparse.Namespace) -> None:
    schema = f"sb_{secrets.token_hex(4)}"
    store = a2trio.stores.postgres(args.dsn, schema=schema)
    count = a2trio.Reducer("count", 0, lambda n, event: n + 1)
    try:
        async with a2trio.Server(notes, store=store) as server:
            sessions = [f"s{n}" for n in range(args.sessions)]
            for sid in sessions:
                await server.session(sid).append(*(notes.event("note", Note(i)) for i in range(10)))
            timings: dict[str, list[float]] = {"coalesced": [], "one read per session": []}

            async def coalesced() -> None:
                async with trio.open_nursery() as nursery:
                    for sid in sessions:
                        nursery.start_soon(server.session(sid).state, count)

            async def separate() -> None:
                async with trio.open_nursery() as nursery:
                    for sid in sessions:
                        nursery.start_soon(store.read_state, server.key(sid), "count")

            for _ in range(args.rounds):
                for name, fn in (("coalesced", coalesced), ("one read per session", separate)):
                    started = time.perf_counter()
                    await fn()
                    timings[name].append(time.perf_counter() - started)
                await server.settle()
        print(f"# bench/state_reads.py --sessions {args.sessions} --rounds {args.rounds}")
        print("| reads | store round trips | median ms per round |\n| --- | ---: | ---: |")
        trips: dict[str, Any] = {"coalesced": 1, "one read per session": args.sessions}
        for name, values in timings.items():
            print(f"| {name} | {trips[name]} | {statistics.median(values) * 1000:.2f} |")
    finally:
        await store.aclose()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'drop schema if exists "{schema}" cascade')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
