"""A writer process: appends its share of ``job`` events, one per append.

Usage: ``python -m tests.pg_workers.writer DSN SCHEMA WRITER_NO COUNT FOLDER [transaction]``

With ``transaction``, ``DSN`` goes through a transaction-mode pooler
(``pooler="transaction"``; the writer never listens).

Ids are ``w<writer>-<n>``; an append that fails with ``STORE_UNAVAILABLE``
(the database restarting) is retried with the same id, so a retry of an
append that did commit replays instead of duplicating. Prints one JSON line:
``{"appended": ..., "unavailable": ..., "retried": ...}``; the first
``STORE_UNAVAILABLE`` also writes ``FOLDER/unavailable``. After a third of its
events the writer waits for ``FOLDER/outage``, which the test creates once the
database is down: so the outage always lands while the writers still write
(slow workers could otherwise let both writers finish first).
"""

from __future__ import annotations

import json
import sys

import trio

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent
from a2trio.stores.postgres import postgres

from .app import SESSIONS, store_key

#: Writer 0's event with this ordinal stalls its first handler attempt.
STALL_AT = 10


async def main(dsn: str, schema: str, writer: int, count: int, folder: str, pooled: bool) -> None:
    store = postgres(
        dsn,
        schema=schema,
        max_connections=2,
        connect_timeout_s=1.0,
        listen=not pooled,
        pooler="transaction" if pooled else None,
    )
    unavailable = retried = 0
    outage = trio.Path(folder) / "outage"
    try:
        for n in range(count):
            if n == count // 3:
                while not await outage.exists():  # noqa: ASYNC110 (another process)
                    await trio.sleep(0.05)
            event_id = f"w{writer}-{n}"
            payload = {"n": n, "stall": writer == 0 and n == STALL_AT}
            session = store_key(SESSIONS[(n * 7 + writer) % len(SESSIONS)])
            tries = 0
            while True:
                try:
                    result = await store.append(session, [AppendEvent("job", payload, id=event_id)])
                except A2Error as exc:
                    if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                        raise
                    unavailable += 1
                    tries += 1
                    await (trio.Path(folder) / "unavailable").touch()
                    await trio.sleep(0.1)
                    continue
                assert result.events[0].id == event_id
                retried += tries > 0
                break
            await trio.sleep(0.002)
    finally:
        await store.aclose()
    print(json.dumps({"appended": count, "unavailable": unavailable, "retried": retried}))


if __name__ == "__main__":
    pooled = sys.argv[6:] == ["transaction"]
    trio.run(
        main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], pooled
    )
