"""A worker process for the concurrency-limit test: runs ``job`` under
``Concurrency(LIMIT, key=customer)``, no scheduler.

    python -m tests.flow_workers.worker BACKEND STORE SCHEMA FOLDER NAME

Each attempt writes ``start`` and ``end`` lines to ``FOLDER/<NAME>.log``
(event id, attempt, customer, ``time.monotonic()``: one clock for every
process of the machine), so the test can count the attempts running at once
across processes. A job whose payload asks for it hangs on its first attempt
so that the test can SIGKILL this process mid-handler. BACKEND is
``postgres`` (STORE a DSN, SCHEMA its schema) or ``sqlite`` (STORE a file).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import msgspec
import trio

import a2trio


class Job(msgspec.Struct, frozen=True):
    customer: str
    hang: bool = False


jobs = a2trio.contract("jobs", events={"job": Job})

#: At most this many jobs of one customer at once, across the workers.
LIMIT = 2
#: How long a job's handler runs (real time).
JOB_S = 0.15
#: Short leases, so a killed worker's slots lapse in seconds.
TIMINGS = a2trio.Timings(claim_ttl_s=2.0, heartbeat_s=0.5, sweep_s=0.5)


def customer(event: a2trio.AppendInput) -> str:
    job: Job = event.payload
    return job.customer


LIMITED = a2trio.Concurrency(LIMIT, key=customer)


def open_store(backend: str, url: str, schema: str) -> a2trio.Store:
    if backend == "postgres":
        return a2trio.stores.postgres(url, schema=schema)
    return a2trio.stores.sqlite(url)


async def main(backend: str, url: str, schema: str, folder: str, name: str) -> None:
    log = Path(folder) / f"{name}.log"

    def write(what: str, ctx: a2trio.HandlerContext[Job]) -> None:
        line = f"{what} {ctx.event.id} {ctx.attempt} {ctx.event.payload.customer}"
        with log.open("a") as out:
            out.write(f"{line} {time.monotonic()}\n")

    async def job(ctx: a2trio.HandlerContext[Job]) -> None:
        write("start", ctx)
        if ctx.event.payload.hang and ctx.attempt == 1:
            (Path(folder) / "hanging").write_text(str(os.getpid()))
            await trio.sleep_forever()
        await trio.sleep(JOB_S)
        write("end", ctx)

    spec = a2trio.handler(job, concurrency=LIMITED)
    server = a2trio.Server(
        jobs, store=open_store(backend, url, schema), handlers={"job": spec}, timings=TIMINGS
    )
    async with server:
        (Path(folder) / f"{name}.ready").write_text("ok")
        await trio.sleep_forever()


if __name__ == "__main__":
    backend, url, schema, folder, name = sys.argv[1:6]
    trio.run(main, backend, url, schema, folder, name)
