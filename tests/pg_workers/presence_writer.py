"""Sets one presence patch through its own store, in its own process.

    python -m tests.pg_workers.presence_writer DSN SCHEMA SESSION

Used by ``tests/test_presence.py`` to show a patch crossing processes through
Postgres NOTIFY.
"""

from __future__ import annotations

import sys

import trio

import a2trio
from tests.apps import rooms


async def main(dsn: str, schema: str, session: str) -> None:
    store = a2trio.stores.postgres(dsn, schema=schema)
    async with a2trio.Server(rooms, store=store) as server:
        await server.session(session).set_presence("ann", {"typing": True})
    await store.aclose()


if __name__ == "__main__":
    dsn, schema, session = sys.argv[1:4]
    trio.run(main, dsn, schema, session)
