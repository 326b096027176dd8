"""Append jobs to the shared file, then exit.

Usage: ``python -m tests.sqlite_workers.writer DB COUNT SESSIONS`` appends
``COUNT`` jobs round-robin across ``SESSIONS`` sessions;
``python -m tests.sqlite_workers.writer DB slow`` appends one ``slow`` job
(id ``slow-1``) to the session ``slow``.

The writer binds the same handlers as the workers so the jobs are stored
pending, and appends with ``dispatch`` to a scheduler that does nothing: this
process never runs a handler, the workers find the work on their own.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

import a2trio
from a2trio.scheduler import SchedulerTask
from a2trio.stores.sqlite import sqlite

from .app import TIMINGS, Job, jobs


class _NoScheduler:
    async def schedule(self, task: SchedulerTask) -> None:
        await trio.lowlevel.checkpoint()

    @asynccontextmanager
    async def bind(self, server: a2trio.SchedulerTarget) -> AsyncIterator[None]:
        yield


async def _never(ctx: a2trio.HandlerContext[Job]) -> a2trio.Returned:
    raise AssertionError("the writer never runs handlers")


async def main(path: str, args: list[str]) -> None:
    server = a2trio.Server(
        jobs,
        store=sqlite(path),
        handlers={"job": _never, "slow": _never},
        scheduler=_NoScheduler(),
        timings=TIMINGS,
    )
    async with server:
        if args == ["slow"]:
            await server.session("slow").dispatch(jobs.event("slow", Job(-1), id="slow-1"))
            return
        count, sessions = int(args[0]), int(args[1])
        for n in range(count):
            session = server.session(f"s{n % sessions:02d}")
            await session.dispatch(jobs.event("job", Job(n), id=f"job-{n}"))


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2:])
