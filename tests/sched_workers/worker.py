"""A scheduler worker process for the multi-process tests.

Usage: ``python worker.py TARGET``, a ``postgresql://`` DSN or a sqlite file
path. Serves the ``fleet`` contract on a memory store with a
:class:`DurableScheduler` on that target, prints ``ready`` once bound,
waits for a line on stdin (the test has queued every task), keeps delivering
until the shared queue is empty, then prints the ids of the events it
appended, as one JSON list.
"""

from __future__ import annotations

import sys

import msgspec
import trio

import a2trio
from a2trio.schedulers import DurableScheduler


class Tick(msgspec.Struct, frozen=True):
    n: int


fleet = a2trio.contract("fleet", events={"tick": Tick})
SESSIONS = 10
#: Small batches, so both processes take turns claiming.
MAX_IN_FLIGHT = 8


async def main(target: str) -> None:
    scheduler = (
        DurableScheduler.postgres(target, max_in_flight=MAX_IN_FLIGHT)
        if target.startswith("postgresql://")
        else DurableScheduler.sqlite(target, max_in_flight=MAX_IN_FLIGHT)
    )
    async with a2trio.Server(fleet, store=a2trio.stores.memory(), scheduler=scheduler) as server:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        # The other process's deletes signal nothing here: poll the shared table.
        while await scheduler.queued("fleet"):  # noqa: ASYNC110
            await trio.sleep(0.02)
        ids = [
            event.id for n in range(SESSIONS) for event in await server.session(f"s{n}").history()
        ]
    print(msgspec.json.encode(ids).decode(), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
