"""Scheduler tasks in a Postgres table, on the scheduler's own connections.

Any number of processes share one table. A claim is one statement that
leases due rows ``FOR UPDATE SKIP LOCKED``: concurrent claimers skip each
other's rows instead of waiting or double-claiming, so every task goes to one
worker. An insert that adds a row sends ``NOTIFY a2_scheduler, '<contract>'``
in the same transaction, so other processes' workers wake when it commits.

Driving psycopg from Trio (see ``notes/postgres-on-trio.md``): correctness
over speed here. Row operations use one synchronous connection, one call at
a time under a Trio lock, each call a whole transaction in a worker thread
through ``trio.to_thread.run_sync``. The thread is not abandoned on
cancellation, so the transaction always commits or rolls back before the
caller sees ``Cancelled``; a connection is never left mid-transaction. A
connection error closes the connection; the next call reconnects.

Notifications use a second, autocommit connection: ``LISTEN``, then wait with
``trio.lowlevel.wait_readable`` on its socket and drain ``notifies(timeout=0)``
(public psycopg API, cancellable at once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import psycopg
import trio

from ._queue import TaskRow

if TYPE_CHECKING:
    from ..stores._feed import Wakeups

__all__ = ["PostgresQueue"]

T = TypeVar("T")

CHANNEL = "a2_scheduler"
#: Pause before reconnecting a lost notification listener.
LISTEN_RETRY_S = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS a2_scheduler_tasks (
  id text PRIMARY KEY,
  contract text NOT NULL,
  due_at bigint NOT NULL,
  body jsonb NOT NULL,
  attempts integer NOT NULL DEFAULT 0,
  leased_until bigint,
  lease_token text,
  last_error text
);
CREATE INDEX IF NOT EXISTS a2_scheduler_tasks_due ON a2_scheduler_tasks (contract, due_at);
"""
#: Serializes schema creation: concurrent CREATE TABLE IF NOT EXISTS can
#: still collide on the catalog's unique index.
_SCHEMA_LOCK = 0x61325F73636864

_Conn = psycopg.Connection[tuple[Any, ...]]


class PostgresQueue:
    """The Postgres :class:`~a2trio.schedulers._queue.TaskQueue`."""

    cross_process: Literal["none", "poll", "notify"] = "notify"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: _Conn | None = None
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        return "PostgresQueue(...)"

    def _transaction(self, fn: Callable[[_Conn], T]) -> T:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            with conn.transaction():
                return fn(conn)
        except psycopg.OperationalError:
            conn.close()
            self._conn = None
            raise

    async def _run(self, fn: Callable[[_Conn], T]) -> T:
        async with self._lock:
            return await trio.to_thread.run_sync(self._transaction, fn)

    async def open(self) -> None:
        def create(conn: _Conn) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)

        await self._run(create)

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await trio.to_thread.run_sync(conn.close)

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        def insert(conn: _Conn) -> bool:
            cursor = conn.execute(
                "INSERT INTO a2_scheduler_tasks (id, contract, due_at, body) "
                "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (id) DO NOTHING",
                (task_id, contract, due_at_ms, body.decode()),
            )
            if cursor.rowcount != 1:
                return False
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, contract))
            return True

        return await self._run(insert)

    async def claim(
        self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int
    ) -> list[TaskRow]:
        def claim(conn: _Conn) -> list[TaskRow]:
            rows = conn.execute(
                "UPDATE a2_scheduler_tasks t "
                "SET attempts = t.attempts + 1, leased_until = %s, lease_token = %s "
                "FROM (SELECT id FROM a2_scheduler_tasks "
                "      WHERE contract = %s AND due_at <= %s "
                "        AND (leased_until IS NULL OR leased_until <= %s) "
                "      ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED) due "
                "WHERE t.id = due.id "
                "RETURNING t.id, t.body::text, t.attempts, t.due_at",
                (now_ms + lease_ms, token, contract, now_ms, now_ms, limit),
            ).fetchall()
            rows.sort(key=lambda row: (row[3], row[0]))
            return [
                TaskRow(task_id, body.encode(), attempts) for task_id, body, attempts, _ in rows
            ]

        return await self._run(claim)

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        def renew(conn: _Conn) -> bool:
            cursor = conn.execute(
                "UPDATE a2_scheduler_tasks SET leased_until = %s "
                "WHERE id = %s AND lease_token = %s",
                (until_ms, task_id, token),
            )
            return cursor.rowcount == 1

        return await self._run(renew)

    async def delete(self, task_id: str, token: str) -> None:
        await self._run(
            lambda conn: conn.execute(
                "DELETE FROM a2_scheduler_tasks WHERE id = %s AND lease_token = %s",
                (task_id, token),
            )
        )

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        await self._run(
            lambda conn: conn.execute(
                "UPDATE a2_scheduler_tasks SET due_at = %s, leased_until = NULL, "
                "lease_token = NULL, last_error = coalesce(%s, last_error) "
                "WHERE id = %s AND lease_token = %s",
                (due_at_ms, error, task_id, token),
            )
        )

    async def next_due(self, contract: str) -> int | None:
        def next_due(conn: _Conn) -> int | None:
            row = conn.execute(
                "SELECT min(greatest(due_at, coalesce(leased_until, 0))) "
                "FROM a2_scheduler_tasks WHERE contract = %s",
                (contract,),
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self._run(next_due)

    async def count(self, contract: str | None = None) -> int:
        def count(conn: _Conn) -> int:
            row = conn.execute(
                "SELECT count(*) FROM a2_scheduler_tasks WHERE %s::text IS NULL OR contract = %s",
                (contract, contract),
            ).fetchone()
            assert row is not None
            return int(row[0])

        return await self._run(count)

    async def listen(
        self, wakeups: Wakeups, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Wake workers on other processes' inserts (see the module docstring).

        Reports started once ``LISTEN`` is in place (or its first attempt
        failed), so a task committed after that wakes this process.

        Cancellation: waits are cancellable at once; the connection is closed
        on the way out.
        """
        started = False
        while True:
            conn: _Conn | None = None
            try:
                conn = await trio.to_thread.run_sync(self._listener)
                if started:
                    # Reconnected: anything sent meanwhile was lost.
                    wakeups.notify_all()
                else:
                    started = True
                    task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(conn.fileno())
                    for notify in conn.notifies(timeout=0):
                        wakeups.notify(notify.payload)
            except Exception:
                # No listener: the worker's safety re-read (notify_safety_s) covers the gap.
                if not started:
                    started = True
                    task_status.started()
            finally:
                if conn is not None:
                    conn.close()
            await trio.sleep(LISTEN_RETRY_S)

    def _listener(self) -> _Conn:
        conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn
