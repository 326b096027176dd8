"""A worker process for the pacing test: a throttled, a debounced and a
retried handler, no scheduler.

    python -m tests.flow_workers.paced BACKEND STORE SCHEMA FOLDER NAME

Each attempt writes a line to ``FOLDER/<NAME>.log``: what (``tick``,
``burst``, ``fail`` or ``retried``), the event id, the attempt and
``time.monotonic()`` (one clock for every process of the machine). BACKEND is
``postgres`` (STORE a DSN, SCHEMA its schema) or ``sqlite`` (STORE a file).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

import a2trio
from tests.flow_workers.worker import open_store


class Tick(msgspec.Struct, frozen=True):
    n: int


class Burst(msgspec.Struct, frozen=True):
    doc: str
    n: int


class Flaky(msgspec.Struct, frozen=True):
    n: int


paced = a2trio.contract("paced", events={"tick": Tick, "burst": Burst, "flaky": Flaky})

#: At most this many ticks start per period, across the workers.
TICKS_PER_PERIOD = 2
TICK_PERIOD_S = 1.0
#: Quiet before the last burst event of a document runs.
QUIET_S = 1.5
#: The wait before a flaky event's retry.
RETRY_AFTER_S = 1.0
TIMINGS = a2trio.Timings(claim_ttl_s=5.0, heartbeat_s=1.0, sweep_s=0.25)


def doc(event: a2trio.AppendInput) -> str:
    burst: Burst = event.payload
    return burst.doc


Fn = Callable[[a2trio.HandlerContext[Any]], Awaitable[None]]


def specs(tick: Fn, burst: Fn, flaky: Fn) -> dict[str, a2trio.HandlerSpec]:
    """The handlers with their pacing: the test's API tier needs the same
    options (a debounce key is resolved when the event is appended)."""
    return {
        "tick": a2trio.handler(tick, throttle=a2trio.Throttle(TICKS_PER_PERIOD, TICK_PERIOD_S)),
        "burst": a2trio.handler(burst, debounce=a2trio.Debounce(QUIET_S, key=doc)),
        "flaky": a2trio.handler(flaky, retry=a2trio.Retry(3, backoff=lambda n: RETRY_AFTER_S)),
    }


async def main(backend: str, url: str, schema: str, folder: str, name: str) -> None:
    log = Path(folder) / f"{name}.log"

    def write(what: str, ctx: a2trio.HandlerContext[Any]) -> None:
        with log.open("a") as out:
            out.write(f"{what} {ctx.event.id} {ctx.attempt} {time.monotonic()}\n")

    async def tick(ctx: a2trio.HandlerContext[Any]) -> None:
        write("tick", ctx)

    async def burst(ctx: a2trio.HandlerContext[Any]) -> None:
        write("burst", ctx)

    async def flaky(ctx: a2trio.HandlerContext[Any]) -> None:
        if ctx.attempt == 1:
            write("fail", ctx)
            raise RuntimeError("the first attempt fails")
        write("retried", ctx)

    server = a2trio.Server(
        paced,
        store=open_store(backend, url, schema),
        handlers=specs(tick, burst, flaky),
        timings=TIMINGS,
    )
    async with server:
        (Path(folder) / f"{name}.ready").write_text("ok")
        await trio.sleep_forever()


if __name__ == "__main__":
    backend, url, schema, folder, name = sys.argv[1:6]
    trio.run(main, backend, url, schema, folder, name)
