"""A worker process for the durable-handler crash test (issue 34).

    python -m tests.durable_workers.worker BACKEND STORE SCHEMA FOLDER NAME

Runs ``checkout``: step ``charge``, then step ``ship``, then returns
``done``; and ``nap``: step ``before``, a durable sleep of :data:`NAP_S`
(past the claim ttl: the attempt suspends, and writes its pid to
``FOLDER/napping`` first), then returns ``woke``. Each step's effect is one
row in a side table (``effects`` in ``FOLDER/effects.db``, SQLite,
autocommit: the outside world, which the journal does not roll back), so the
test counts how often each ran. On its first attempt ``checkout`` stops
between its two steps and writes its pid to ``FOLDER/between``, so that the
test can SIGKILL this process there. And ``wait``: a durable ``wait_for``
of an ``arrived`` event without a timeout (the attempt suspends with no wake
time, and writes its pid to ``FOLDER/waiting`` first), then returns
``answered`` with the index found.
BACKEND is ``postgres`` (STORE a DSN, SCHEMA its schema) or ``sqlite``
(STORE a file).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import msgspec
import trio

import a2trio


class Order(msgspec.Struct, frozen=True):
    item: str


class Done(msgspec.Struct, frozen=True):
    charge: str
    parcel: str
    by: int


class Woke(msgspec.Struct, frozen=True):
    by: int


class Answered(msgspec.Struct, frozen=True):
    index: int
    by: int


orders = a2trio.contract(
    "durable_orders",
    events={
        "order": Order,
        "done": Done,
        "nap": Order,
        "woke": Woke,
        "wait": Order,
        "arrived": Order,
        "answered": Answered,
    },
)

#: The durable sleep of ``nap``: longer than the claim ttl, so it suspends.
NAP_S = 3.0

#: Short leases, so a killed worker's claim lapses in seconds.
TIMINGS = a2trio.Timings(claim_ttl_s=2.0, heartbeat_s=0.5, sweep_s=0.5)


def open_store(backend: str, url: str, schema: str) -> a2trio.Store:
    if backend == "postgres":
        return a2trio.stores.postgres(url, schema=schema)
    return a2trio.stores.sqlite(url)


def effect(folder: str, step: str, event_id: str) -> None:
    """One row of the side table: the step's outside effect happened."""
    with sqlite3.connect(Path(folder) / "effects.db", timeout=30, isolation_level=None) as db:
        db.execute("create table if not exists effects (step text, event_id text, pid int)")
        db.execute("insert into effects values (?, ?, ?)", (step, event_id, os.getpid()))


async def main(backend: str, url: str, schema: str, folder: str, name: str) -> None:
    async def charge(event_id: str) -> str:
        await trio.to_thread.run_sync(effect, folder, "charge", event_id)
        return f"ch-{event_id}"

    async def ship(charge_id: str, event_id: str) -> str:
        await trio.to_thread.run_sync(effect, folder, "ship", event_id)
        return f"parcel-for-{charge_id}"

    async def checkout(ctx: a2trio.HandlerContext[Order]) -> a2trio.AppendInput:
        charge_id = await ctx.step("charge", charge, ctx.event.id)
        if ctx.attempt == 1:
            (Path(folder) / "between").write_text(str(os.getpid()))
            await trio.sleep_forever()
        parcel = await ctx.step("ship", ship, charge_id, ctx.event.id)
        return orders.event("done", Done(charge_id, parcel, os.getpid()))

    async def before(event_id: str) -> None:
        await trio.to_thread.run_sync(effect, folder, "before", event_id)

    async def nap(ctx: a2trio.HandlerContext[Order]) -> a2trio.AppendInput:
        await ctx.step("before", before, ctx.event.id)
        if ctx.attempt == 1:
            (Path(folder) / "napping").write_text(str(os.getpid()))
        await ctx.sleep(NAP_S)
        return orders.event("woke", Woke(os.getpid()))

    async def wait(ctx: a2trio.HandlerContext[Order]) -> a2trio.AppendInput:
        if ctx.attempt == 1:
            (Path(folder) / "waiting").write_text(str(os.getpid()))
        found = await ctx.wait_for("arrived")
        assert found is not None
        return orders.event("answered", Answered(found.index, os.getpid()))

    server = a2trio.Server(
        orders,
        store=open_store(backend, url, schema),
        handlers={"order": checkout, "nap": nap, "wait": wait},
        timings=TIMINGS,
    )
    async with server:
        (Path(folder) / f"{name}.ready").write_text("ok")
        await trio.sleep_forever()


if __name__ == "__main__":
    backend, url, schema, folder, name = sys.argv[1:6]
    trio.run(main, backend, url, schema, folder, name)
