"""Exactly once across processes on Redis: 3 workers, 2 writers, a kill and a restart.

As ``test_postgres_multiprocess``: 2,000 ``job`` events over 50 sessions are
appended by two writer processes while three worker processes drain them.
Mid-run the worker holding the ``stall`` job is SIGKILLed inside its handler,
then Redis itself is SIGKILLed and started again on the same port: a
redis-server of the test's own (``throwaway_redis``, AOF ``appendfsync
always``), never the machine's shared one. Writers retry appends that failed
with ``STORE_UNAVAILABLE`` with the same ids; workers recover on their own.
Afterwards: every job completed exactly once with exactly one returned
``done`` event, every session's indexes run 1..n without gaps, and no id
appears twice.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from a2trio.errors import A2Error
from a2trio.stores.base import SessionSummary, StoredEvent
from a2trio.stores.redis import RedisStore, redis
from tests.backends.redis import new_prefix, throwaway_redis
from tests.pg_workers.app import SESSIONS, jobs, store_key
from tests.progress import while_progressing

ROOT = Path(__file__).resolve().parent.parent

WORKERS = 2 + 1
WRITERS = 2
EVENTS_PER_WRITER = 1000
TOTAL = WRITERS * EVENTS_PER_WRITER


async def _poll_until(check: Callable[[], Awaitable[bool]], interval_s: float) -> None:
    """Wait for what another process does: no trio.Event crosses processes."""
    while not await check():  # noqa: ASYNC110
        await trio.sleep(interval_s)


async def _sessions(store: RedisStore) -> list[SessionSummary]:
    """Every session's counters, retried while Redis restarts."""
    while True:
        try:
            page = await store.inspect.list_sessions(prefix=f"{jobs.name}\x1f", limit=100)
            return page.sessions
        except A2Error:
            await trio.sleep(0.1)


# Unstarted connections while Redis is down: see test_redis.py.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_exactly_once_across_processes_through_a_kill_and_a_restart(
    tmp_path: Path,
) -> None:
    async with throwaway_redis() as server:
        prefix = new_prefix()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        python = sys.executable
        reports: list[dict[str, int]] = []
        writers_done = trio.Event()
        checker = redis(server.url, key_prefix=prefix, connect_timeout_s=0.5)

        async def write(n: int) -> None:
            result = await trio.run_process(
                [
                    python,
                    "-m",
                    "tests.redis_workers.writer",
                    server.url,
                    prefix,
                    str(n),
                    str(EVENTS_PER_WRITER),
                    str(tmp_path),
                ],
                capture_stdout=True,
                env=env,
            )
            reports.append(json.loads(result.stdout))
            if len(reports) == WRITERS:
                writers_done.set()

        # Held while the test's Redis is down: the checker asks nothing then,
        # as before the progress guard (a sample waiting on it counts as no
        # progress, so the guard still bounds the outage).
        outage = trio.Lock()

        async def progress() -> tuple[int, int]:
            async with outage:
                sessions = await _sessions(checker)
            return sum(s.event_count for s in sessions), sum(s.pending_count for s in sessions)

        # No bound on the whole run: alone it takes ~15 s, beside other
        # suites on two cores over 60 s, and a fixed bound only bets on the
        # load. It fails when nothing is appended or processed for STALL_S.
        # A sample every 2 s: each is a scan over every session, and until
        # issue 29's defect 4 is fixed any call may meet an untranslated
        # coredis ConnectionError under load (the test's own polls too).
        async with while_progressing(progress, what="the jobs' processing", interval_s=2.0):
            async with trio.open_nursery() as nursery:
                workers: list[trio.Process] = []
                for _ in range(WORKERS):
                    command = [
                        python,
                        "-m",
                        "tests.redis_workers.worker",
                        server.url,
                        prefix,
                        str(tmp_path),
                    ]
                    workers.append(
                        await nursery.start(
                            partial(trio.run_process, command, env=env, check=False)
                        )
                    )
                for n in range(WRITERS):
                    nursery.start_soon(write, n)

                # SIGKILL the worker that is inside the stalling handler.
                marker = trio.Path(tmp_path / "stalled")
                await _poll_until(marker.exists, 0.05)
                victim = int(await marker.read_text())
                assert victim in [w.pid for w in workers]
                os.kill(victim, signal.SIGKILL)

                # Kill and restart Redis while the writers are still appending.
                async def third_appended() -> bool:
                    counted = sum(s.event_count for s in await _sessions(checker))
                    return counted >= TOTAL // 3

                await _poll_until(third_appended, 0.05)
                # Down until a writer has seen the outage (a restart can be
                # quicker than the writers' next append), then back. The
                # writers hold at a third until the kill (see writer.py).
                async with outage:
                    await server.kill()
                    await (trio.Path(tmp_path) / "outage").touch()
                    await _poll_until(trio.Path(tmp_path / "unavailable").exists, 0.05)
                    await server.start()

                await writers_done.wait()

                async def all_processed() -> bool:
                    sessions = await _sessions(checker)
                    return len(sessions) == len(SESSIONS) and all(
                        s.pending_count == 0 for s in sessions
                    )

                await _poll_until(all_processed, 0.25)
                nursery.cancel_scope.cancel(reason="all jobs processed")

        # Appends during the outage failed as STORE_UNAVAILABLE and were retried.
        assert sum(r["appended"] for r in reports) == TOTAL
        assert sum(r["unavailable"] for r in reports) > 0
        assert sum(r["retried"] for r in reports) > 0

        rows: list[StoredEvent] = []
        for session_id in SESSIONS:
            stored = await checker.read(store_key(session_id))
            assert [r.index for r in stored] == list(range(1, len(stored) + 1)), "a gap"
            rows += stored
        job_rows = [r for r in rows if r.type == "job"]
        done_rows = [r for r in rows if r.type == "done"]
        assert len(job_rows) == len({r.id for r in job_rows}) == TOTAL
        assert len({r.id for r in rows}) == len(rows), "an id appears twice"
        unfinished = [
            r.id
            for r in job_rows
            if r.processed_at_ms is None
            or r.failed_at_ms is not None
            or len(r.returned_event_ids or []) != 1
        ]
        assert unfinished == []
        assert len(done_rows) == TOTAL
        by_key = {(r.session_id, r.index): r for r in rows}
        for done in done_rows:
            assert done.cause is not None
            job = by_key[(done.session_id, done.cause.index)]
            assert job.returned_event_ids == [done.id]
            assert job.id == done.payload["job"]
            assert job.processed_by_attempt == done.cause.attempt
        assert len({d.payload["job"] for d in done_rows}) == TOTAL
        # The killed attempt was retried by another worker.
        [stalled] = [r for r in job_rows if r.id == "w0-10"]
        assert stalled.attempt_count >= 2
        assert (stalled.processed_by_attempt or 0) >= 2
        await checker.aclose()
    gc.collect()  # unstarted connections, while their warnings are ignored
