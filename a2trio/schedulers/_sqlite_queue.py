"""Scheduler tasks in a sqlite table, on the scheduler's own connection.

One ``sqlite3`` connection (WAL, so readers in other processes never block on
us) serves every call, one at a time under a Trio lock. Each call is a whole
transaction (``BEGIN IMMEDIATE`` for writes) run in a worker thread through
``trio.to_thread.run_sync``, which is not abandoned on cancellation: the
transaction always finishes (commit, or rollback on error) before the caller
sees ``Cancelled``, so a transaction is never left open. ``BEGIN IMMEDIATE``
takes the write lock up front, so two processes' claims serialize instead of
failing to upgrade a read lock.

sqlite sends no notifications: another process's task is noticed by the
worker's poll (``Timings.poll_idle_s``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Literal, TypeVar

import trio

from ..stores._sqlite_conn import use_wal
from ._queue import TaskRow

__all__ = ["SqliteQueue"]

T = TypeVar("T")

#: How long a call waits for another process's write lock before failing.
BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS a2_scheduler_tasks (
  id TEXT PRIMARY KEY,
  contract TEXT NOT NULL,
  due_at INTEGER NOT NULL,
  body TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  leased_until INTEGER,
  lease_token TEXT,
  last_error TEXT
);
CREATE INDEX IF NOT EXISTS a2_scheduler_tasks_due ON a2_scheduler_tasks (contract, due_at);
"""


class SqliteQueue:
    """The sqlite :class:`~a2trio.schedulers._queue.TaskQueue`."""

    cross_process: Literal["none", "poll", "notify"] = "poll"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        return f"SqliteQueue({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            use_wal(conn, timeout_s=BUSY_TIMEOUT_S)
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _transaction(self, fn: Callable[[sqlite3.Connection], T], begin: str) -> T:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
        conn.execute(begin)
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        # Reads take a deferred transaction: a WAL snapshot, no write lock.
        begin = "BEGIN IMMEDIATE" if write else "BEGIN"
        async with self._lock:
            return await trio.to_thread.run_sync(self._transaction, fn, begin)

    async def open(self) -> None:
        await self._run(lambda conn: None)

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await trio.to_thread.run_sync(conn.close)

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        def insert(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO a2_scheduler_tasks (id, contract, due_at, body) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                (task_id, contract, due_at_ms, body.decode()),
            )
            return cursor.rowcount == 1

        return await self._run(insert)

    async def claim(
        self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int
    ) -> list[TaskRow]:
        def claim(conn: sqlite3.Connection) -> list[TaskRow]:
            rows = conn.execute(
                "SELECT id, body, attempts FROM a2_scheduler_tasks "
                "WHERE contract = ? AND due_at <= ? "
                "AND (leased_until IS NULL OR leased_until <= ?) "
                "ORDER BY due_at, rowid LIMIT ?",
                (contract, now_ms, now_ms, limit),
            ).fetchall()
            conn.executemany(
                "UPDATE a2_scheduler_tasks "
                "SET attempts = attempts + 1, leased_until = ?, lease_token = ? WHERE id = ?",
                [(now_ms + lease_ms, token, task_id) for task_id, _, _ in rows],
            )
            return [
                TaskRow(task_id, body.encode(), attempts + 1) for task_id, body, attempts in rows
            ]

        return await self._run(claim)

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        def renew(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE a2_scheduler_tasks SET leased_until = ? WHERE id = ? AND lease_token = ?",
                (until_ms, task_id, token),
            )
            return cursor.rowcount == 1

        return await self._run(renew)

    async def delete(self, task_id: str, token: str) -> None:
        await self._run(
            lambda conn: conn.execute(
                "DELETE FROM a2_scheduler_tasks WHERE id = ? AND lease_token = ?", (task_id, token)
            )
        )

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        await self._run(
            lambda conn: conn.execute(
                "UPDATE a2_scheduler_tasks SET due_at = ?, leased_until = NULL, "
                "lease_token = NULL, last_error = coalesce(?, last_error) "
                "WHERE id = ? AND lease_token = ?",
                (due_at_ms, error, task_id, token),
            )
        )

    async def next_due(self, contract: str) -> int | None:
        def next_due(conn: sqlite3.Connection) -> int | None:
            (due,) = conn.execute(
                "SELECT min(max(due_at, coalesce(leased_until, 0))) FROM a2_scheduler_tasks "
                "WHERE contract = ?",
                (contract,),
            ).fetchone()
            return None if due is None else int(due)

        return await self._run(next_due, write=False)

    async def count(self, contract: str | None = None) -> int:
        def count(conn: sqlite3.Connection) -> int:
            (n,) = conn.execute(
                "SELECT count(*) FROM a2_scheduler_tasks WHERE ? IS NULL OR contract = ?",
                (contract, contract),
            ).fetchone()
            return int(n)

        return await self._run(count, write=False)
