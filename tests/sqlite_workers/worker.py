"""A worker process: its own ``a2trio.Server`` on the shared file, draining
every session that has pending events until it is terminated.

Usage: ``python -m tests.sqlite_workers.worker DB DIR``

``job`` returns a ``done`` event. ``slow`` hangs on its first attempt after
writing this process's pid to ``DIR/victim.pid`` (the test then SIGKILLs it),
and returns ``done`` on any later attempt.
"""

from __future__ import annotations

import os
import sys

import trio

import a2trio
from a2trio.stores.sqlite import sqlite

from .app import TIMINGS, VICTIM_FILE, Done, Job, jobs


async def job(ctx: a2trio.HandlerContext[Job]) -> a2trio.Returned:
    return jobs.event("done", Done(ctx.event.payload.n, os.getpid()))


def make_slow(folder: str) -> a2trio.HandlerSpec:
    async def slow(ctx: a2trio.HandlerContext[Job]) -> a2trio.Returned:
        if ctx.attempt == 1:
            await trio.Path(folder, VICTIM_FILE).write_text(str(os.getpid()))
            await trio.sleep_forever()
        return jobs.event("done", Done(ctx.event.payload.n, os.getpid()))

    return a2trio.handler(slow)


async def main(path: str, folder: str) -> None:
    store = sqlite(path)
    server = a2trio.Server(
        jobs, store=store, handlers={"job": job, "slow": make_slow(folder)}, timings=TIMINGS
    )
    prefix = f"{jobs.name}\x1f"  # every session key of the contract starts so

    async def drain(session_id: str) -> None:
        await server.drain(session_id)

    async with server:
        while True:
            page = await store.inspect.list_sessions(prefix=prefix, limit=1000)
            pending = [s.session_id[len(prefix) :] for s in page.sessions if s.pending_count]
            # Sessions drain side by side, as background drains would: a hung
            # handler in one must not starve the others.
            async with trio.open_nursery() as nursery:
                for session_id in pending:
                    nursery.start_soon(drain, session_id)
                nursery.start_soon(trio.sleep, 0.02)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
