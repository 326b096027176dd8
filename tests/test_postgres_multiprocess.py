"""Exactly once across processes: 3 workers, 2 writers, one Postgres, and trouble.

2,000 ``job`` events over 50 sessions are appended by two writer processes
while three worker processes drain them. Mid-run, the worker holding the
``stall`` job is SIGKILLed inside its handler, then the Postgres server is
restarted: a throwaway server of the test's own (``backends/throwaway_pg.py``),
never the machine's shared one. Writers retry appends that failed with ``STORE_UNAVAILABLE`` with
the same ids; workers recover on their own. Afterwards: every job completed
exactly once with exactly one returned ``done`` event, every session's indexes
run 1..n without gaps, and no id appears twice.

The second test runs the same through **PgBouncer in transaction mode**
(``tests/backends/pgbouncer.py``, in front of the throwaway server) as a
pooled deployment would: every query through the pooler
(``pooler="transaction"``), each worker's listener on a separate, direct
``listen_dsn``; the restart is then the server's behind the pooler.
PgBouncer's ``SHOW STATS`` proves the transactions went through it, and the
server shows each surviving worker's LISTEN connection arriving directly.

Without PostgreSQL's binaries (``initdb``), or without ``pgbouncer`` for the
second test, the tests skip with the reason (and fail under
``A2_TEST_POSTGRES_REQUIRED=1``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import psycopg
import trio
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.backends.pgbouncer import admin_rows, pgbouncer  # noqa: E402
from tests.backends.postgres import run_sql  # noqa: E402
from tests.backends.throwaway_pg import throwaway_postgres  # noqa: E402
from tests.progress import while_progressing  # noqa: E402

WORKERS = 2 + 1
WRITERS = 2
EVENTS_PER_WRITER = 1000
TOTAL = WRITERS * EVENTS_PER_WRITER


async def _retrying(dsn: str, statement: str) -> list[tuple[object, ...]]:
    """Run a statement, retrying while the server restarts."""
    while True:
        try:
            return await run_sql(dsn, statement)
        except psycopg.OperationalError:
            await trio.sleep(0.1)


async def _poll_until(check: Callable[[], Awaitable[bool]], interval_s: float) -> None:
    """Wait for what another process does: no trio.Event crosses processes."""
    while not await check():  # noqa: ASYNC110
        await trio.sleep(interval_s)


async def _count(dsn: str, statement: str) -> int:
    [(value,)] = await _retrying(dsn, statement)
    assert isinstance(value, int)
    return value


async def test_exactly_once_across_processes_through_a_kill_and_a_restart(
    tmp_path: Path,
) -> None:
    async with throwaway_postgres() as server:

        async def outage() -> None:
            # Down until a writer has seen it (a restart can be quicker than
            # the writers' next append), then back.
            await server.stop()
            await (trio.Path(tmp_path) / "outage").touch()
            await _poll_until(trio.Path(tmp_path / "unavailable").exists, 0.05)
            await server.start()

        await _run(server.dsn, outage, tmp_path)


LISTEN_APP = "a2mp_listen"


async def test_exactly_once_through_pgbouncer_in_transaction_mode_with_a_listen_dsn(
    tmp_path: Path,
) -> None:
    async with throwaway_postgres() as server:
        with ExitStack() as stack:
            host, port = await trio.to_thread.run_sync(
                stack.enter_context, pgbouncer("127.0.0.1", server.port, "root")
            )
            pooled = make_conninfo(server.dsn, host=host, port=port)
            listen_dsn = make_conninfo(server.dsn, application_name=LISTEN_APP)

            async def through_the_pooler() -> None:
                stats = await trio.to_thread.run_sync(admin_rows, host, port, "root", "show stats")
                [postgres_db] = [row for row in stats if row["database"] == "postgres"]
                # The appends alone are one transaction per event; completions and
                # claims add more.
                assert postgres_db["total_xact_count"] > 2 * TOTAL
                servers = await trio.to_thread.run_sync(
                    admin_rows, host, port, "root", "show servers"
                )
                listeners = await run_sql(
                    server.dsn,
                    "select pid from pg_stat_activity"
                    f" where application_name = '{LISTEN_APP}' and query ~ '^(un)?listen '",
                )
                # Each surviving worker's one LISTEN connection (reconnected
                # after the restart ended every backend), none of them one of
                # PgBouncer's server connections.
                assert len(listeners) == WORKERS - 1
                assert not {pid for (pid,) in listeners} & {row["remote_pid"] for row in servers}

            await _run(
                server.dsn,
                server.restart,
                tmp_path,
                pooled=(pooled, listen_dsn),
                before_stop=through_the_pooler,
            )


async def _run(
    dsn: str,
    restart: Callable[[], Awaitable[None]],
    tmp_path: Path,
    *,
    pooled: tuple[str, str] | None = None,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """The run; ``pooled``: (the pooler's DSN, the listener's direct DSN) for
    the workers and writers, ``dsn`` staying the test's own direct view.
    ``before_stop`` runs once every job is processed, the workers still up."""
    schema = f"mp_{secrets.token_hex(6)}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    python = sys.executable
    table = f'"{schema}".a2_events'
    reports: list[dict[str, int]] = []
    writers_done = trio.Event()
    store_dsn = dsn if pooled is None else pooled[0]
    worker_extra = [] if pooled is None else [pooled[1]]
    writer_extra = [] if pooled is None else ["transaction"]

    async def write(n: int) -> None:
        command = [
            "tests.pg_workers.writer",
            store_dsn,
            schema,
            str(n),
            str(EVENTS_PER_WRITER),
            str(tmp_path),
        ]
        result = await trio.run_process(
            [python, "-m", *command, *writer_extra],
            capture_stdout=True,
            env=env,
        )
        reports.append(json.loads(result.stdout))
        if len(reports) == WRITERS:
            writers_done.set()

    async def progress() -> tuple[object, ...] | None:
        [(created,)] = await _retrying(dsn, f"select to_regclass('{table}') is not null")
        if not created:
            return None
        [counts] = await _retrying(dsn, f"select count(*), count(processed_at) from {table}")
        return counts

    try:
        # No bound on the whole run: on two cores shared with other test
        # runs, under coverage, a run has taken over 100 s, and a fixed bound
        # only bets on the load. It fails when nothing is appended or
        # processed for STALL_S.
        async with while_progressing(progress, what="the jobs' processing"):
            async with trio.open_nursery() as nursery:
                workers: list[trio.Process] = []
                for _ in range(WORKERS):
                    command = [
                        python,
                        "-m",
                        "tests.pg_workers.worker",
                        store_dsn,
                        schema,
                        str(tmp_path),
                        *worker_extra,
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

                # Restart Postgres while the writers are still appending.
                async def third_appended() -> bool:
                    return await _count(dsn, f"select count(*) from {table}") >= TOTAL // 3

                await _poll_until(third_appended, 0.05)
                await restart()
                # The writers hold at a third until the outage (see writer.py).
                await (trio.Path(tmp_path) / "outage").touch()

                await writers_done.wait()
                processed = (
                    f"select count(*) from {table}"
                    " where processed_at is not null and event_type = 'job'"
                )

                async def all_processed() -> bool:
                    return await _count(dsn, processed) == TOTAL

                await _poll_until(all_processed, 0.25)
                if before_stop is not None:
                    await before_stop()
                nursery.cancel_scope.cancel(reason="all jobs processed")

        assert sum(r["appended"] for r in reports) == TOTAL
        if pooled is None:
            # Appends during the outage failed as STORE_UNAVAILABLE and were
            # retried. (PgBouncer holds a client's next transaction while it
            # logs in to the server again, so behind it only the transactions
            # in flight at the restart fail, if any.)
            assert sum(r["unavailable"] for r in reports) > 0
            assert sum(r["retried"] for r in reports) > 0

        jobs = await run_sql(
            dsn, f"select count(*), count(distinct event_id) from {table} where event_type = 'job'"
        )
        assert jobs == [(TOTAL, TOTAL)]
        gaps = await run_sql(
            dsn,
            f"select session_id from {table} group by session_id"
            " having min(idx) <> 1 or max(idx) <> count(*)",
        )
        assert gaps == []
        unfinished = await run_sql(
            dsn,
            f"select event_id from {table} where event_type = 'job' and (processed_at is null"
            " or failed_at is not null or jsonb_array_length(returned_event_ids) <> 1)",
        )
        assert unfinished == []
        done = await run_sql(
            dsn,
            f"select count(*), count(distinct done.payload->>'job') from {table} done"
            f" join {table} job on job.session_id = done.session_id"
            "  and job.idx = (done.cause->>'index')::bigint"
            "  and job.returned_event_ids->>0 = done.event_id"
            "  and job.event_id = done.payload->>'job'"
            "  and job.processed_by_attempt = (done.cause->>'attempt')::int"
            " where done.event_type = 'done'",
        )
        total_done = await run_sql(dsn, f"select count(*) from {table} where event_type = 'done'")
        assert done == [(TOTAL, TOTAL)]
        assert total_done == [(TOTAL,)]
        # The killed attempt was retried by another worker.
        stalled = await run_sql(
            dsn, f"select attempt_count, processed_by_attempt from {table} where event_id = 'w0-10'"
        )
        assert stalled[0][0] >= 2  # type: ignore[operator]
        assert stalled[0][1] >= 2  # type: ignore[operator]
    finally:
        await _retrying(dsn, f'drop schema if exists "{schema}" cascade')
