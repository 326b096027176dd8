"""A worker process: a Server with the ``job`` handler, following every session.

Usage: ``python -m tests.pg_workers.worker DSN SCHEMA MARKER_DIR [LISTEN_DSN]``

With ``LISTEN_DSN``, ``DSN`` goes through a transaction-mode pooler
(``pooler="transaction"``) and the listener connects to ``LISTEN_DSN``.

Each session has a task that drains it, then follows the session's feed until
a new job lands (or a second passes, to retry claims lapsed elsewhere) and
drains again. Store
outages surface as ``A2Error``: the task backs off and tries again, so the
worker recovers on its own. The first attempt of the ``stall`` job writes a
marker holding this pid and never returns, so the test can SIGKILL this
process mid-handler.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

import a2trio
from a2trio.stores.postgres import postgres
from a2trio.timings import Timings

from .app import SESSIONS, Done, Job, jobs, store_key

TIMINGS = Timings(claim_ttl_s=2.0, heartbeat_s=0.5, renew_retry_s=0.2)


async def main(dsn: str, schema: str, marker_dir: Path, listen_dsn: str | None) -> None:
    async def job(ctx: a2trio.HandlerContext[Job]) -> a2trio.AppendInput:
        if ctx.event.payload.stall and ctx.attempt == 1:
            await trio.Path(marker_dir / "stalled").write_text(str(os.getpid()))
            await trio.sleep_forever()
        await trio.sleep(0.001)
        return jobs.event("done", Done(job=ctx.event.id))

    if listen_dsn is None:
        store = postgres(dsn, schema=schema, max_connections=4)
    else:
        store = postgres(
            dsn, schema=schema, max_connections=4, listen_dsn=listen_dsn, pooler="transaction"
        )
    server = a2trio.Server(jobs, store=store, handlers={"job": job}, timings=TIMINGS)

    async def follow(session_id: str) -> None:
        cursor = 0
        while True:
            try:
                await server.drain(session_id)
                cursor = await wait_for_a_job(session_id, cursor)
            except* a2trio.A2Error:
                # The drain engine raises store outages inside an exception group.
                await trio.sleep(0.2)

    async def wait_for_a_job(session_id: str, cursor: int) -> int:
        """Follow the session until a new ``job`` lands (``done`` events need
        no drain) or a second passes (claims lapsed elsewhere need one).
        Returns the new cursor."""
        async with store.stream(store_key(session_id), start_after=cursor) as feed:
            with trio.move_on_after(1.0):
                while True:
                    row = await feed.receive()
                    cursor = row.index
                    if row.type == "job":
                        break
        return cursor

    async with server, trio.open_nursery() as nursery:
        for session_id in SESSIONS:
            nursery.start_soon(follow, session_id)


if __name__ == "__main__":
    listen_dsn = sys.argv[4] if len(sys.argv) > 4 else None
    trio.run(main, sys.argv[1], sys.argv[2], Path(sys.argv[3]), listen_dsn)
