"""A worker process for the sweep test: runs the ``tick`` handler, no scheduler.

    python -m tests.sweep_workers.worker BACKEND STORE SCHEMA FOLDER NAME

The handler records each attempt in ``FOLDER/<NAME>.attempts`` (one line per
attempt: ``<event id> <attempt>``) and, on an event whose payload asks for it,
hangs so that the test can SIGKILL this process mid-handler. BACKEND is
``postgres`` (STORE a DSN, SCHEMA its schema) or ``sqlite`` (STORE a file).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec
import trio

import a2trio


class Tick(msgspec.Struct, frozen=True):
    hang: bool = False


ticks = a2trio.contract("ticks", events={"tick": Tick})

#: Short leases, so the test waits seconds, not half a minute.
TIMINGS = a2trio.Timings(claim_ttl_s=2.0, heartbeat_s=0.5, sweep_s=0.5)


def open_store(backend: str, url: str, schema: str) -> a2trio.Store:
    if backend == "postgres":
        return a2trio.stores.postgres(url, schema=schema)
    return a2trio.stores.sqlite(url)


async def main(backend: str, url: str, schema: str, folder: str, name: str) -> None:
    log = Path(folder) / f"{name}.attempts"

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        with log.open("a") as out:
            out.write(f"{ctx.event.id} {ctx.attempt}\n")
        if ctx.event.payload.hang and ctx.attempt == 1:
            (Path(folder) / "hanging").write_text(str(os.getpid()))
            await trio.sleep_forever()

    server = a2trio.Server(
        ticks, store=open_store(backend, url, schema), handlers={"tick": tick}, timings=TIMINGS
    )
    async with server:
        (Path(folder) / f"{name}.ready").write_text("ok")
        await trio.sleep_forever()


if __name__ == "__main__":
    backend, url, schema, folder, name = sys.argv[1:6]
    trio.run(main, backend, url, schema, folder, name)
