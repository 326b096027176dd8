"""A process that dies inside an app transaction: the outbox crash test's victim.

Usage: ``python -m tests.outbox_worker postgres DSN SCHEMA SESSION`` or
``python -m tests.outbox_worker sqlite PATH SESSION``.

It opens a server on the store, begins an app transaction, inserts its order
row into ``app_orders`` (the test created the table), appends the session's
``ordered`` event in the transaction, prints ``ready`` and waits to be killed
(SIGKILL), before any commit.
"""

from __future__ import annotations

import sys

import trio

import a2trio
from a2trio.stores.base import Store
from a2trio.stores.postgres import postgres
from a2trio.stores.sqlite import sqlite
from tests.apps import Ordered, orders


async def main(argv: list[str]) -> None:
    store: Store
    if argv[0] == "postgres":
        _, dsn, schema, session_id = argv
        store, insert = postgres(dsn, schema=schema), "insert into app_orders values ($1, $2)"
    else:
        _, path, session_id = argv
        store, insert = sqlite(path), "insert into app_orders values (?, ?)"
    async with a2trio.Server(orders, store=store) as server:
        async with server.transaction() as tx:
            await tx.execute(insert, (session_id, 3))
            await server.session(session_id).append(
                orders.event("ordered", Ordered("book", 3)), transaction=tx
            )
            print("ready", flush=True)
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
