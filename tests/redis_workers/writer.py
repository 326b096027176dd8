"""A writer process: appends its share of ``job`` events, one per append.

Usage: ``python -m tests.redis_workers.writer URL PREFIX WRITER_NO COUNT FOLDER``

As ``tests/pg_workers/writer.py``: ids are ``w<writer>-<n>``; an append that
fails with ``STORE_UNAVAILABLE`` (Redis restarting) is retried with the same
id, so a retry of an append that did run replays instead of duplicating.
Prints ``{"appended": ..., "unavailable": ..., "retried": ...}``; the first
``STORE_UNAVAILABLE`` also writes ``FOLDER/unavailable``, so the test knows
the outage was seen before it brings Redis back. After a third of its
events the writer waits for ``FOLDER/outage``, which the test creates once it
has killed Redis: so the outage always lands while the writers still write
(otherwise slow workers could let both writers finish before the kill).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent
from a2trio.stores.redis import redis

from ..pg_workers.app import SESSIONS, store_key

#: Writer 0's event with this ordinal stalls its first handler attempt.
STALL_AT = 10


async def main(url: str, prefix: str, writer: int, count: int, folder: str) -> None:
    store = redis(url, key_prefix=prefix, connect_timeout_s=1.0)
    unavailable = retried = 0
    async with store:
        outage = trio.Path(folder) / "outage"
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
                    (Path(folder) / "unavailable").touch()
                    await trio.sleep(0.1)
                    continue
                assert result.events[0].id == event_id
                retried += tries > 0
                break
            await trio.sleep(0.002)
    await store.aclose()
    print(json.dumps({"appended": count, "unavailable": unavailable, "retried": retried}))


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
