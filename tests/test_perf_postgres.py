"""Round trips the Postgres path spends per handled event (real server).

Counted through the store's group statistics: every append, claim and
completion inside ``async with store`` is one member of some group.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import msgspec
import pytest

import a2trio
from a2trio.stores.postgres import postgres

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")


class Tick(msgspec.Struct, frozen=True):
    n: int


ticks = a2trio.contract("perf", events={"tick": Tick})


async def test_a_handled_event_costs_two_transactions() -> None:
    dsn = await database_dsn()
    schema = f"p_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema)
    handled: list[int] = []

    async def tick(ctx: a2trio.HandlerContext[Tick]) -> None:
        handled.append(ctx.event.payload.n)

    try:
        server = a2trio.Server(ticks, store=store, handlers={"tick": tick})
        async with server:
            await server.session("warm").append(ticks.event("tick", Tick(0)))
            await server.settle()
            before = store.group_statistics()
            await server.session("s").append(ticks.event("tick", Tick(1)))
            await server.settle()
            after = store.group_statistics()
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
    assert handled == [0, 1]
    # The append claims in its own transaction, and there is no final
    # "nothing left" claim: the completion said the session drained.
    assert after.members - before.members == 2
