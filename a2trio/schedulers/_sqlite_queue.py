"""Scheduler tasks in a sqlite table, on the sqlite store's connection pool.

The scheduler keeps its own :class:`~a2trio.stores.sqlite.conn.ConnectionPool`
on its file (which may be the store's): one writer connection behind a Trio
lock and a few WAL readers, each call a whole transaction in a worker thread
(``BEGIN IMMEDIATE`` for writes). A cancelled call is interrupted or runs to
its end, so it committed entirely or not at all, and no transaction is left
open (see that module). The pool creates the table on first use.

Writes (inserts, deletes, renewals, reschedules) go through
:class:`~a2trio.stores.group.GroupCommit` with one leader (sqlite has one
writer): the writes that arrive while a transaction is in flight share the
next one, one thread call and one commit. Claims run alone on the writer;
``next_due`` and ``count`` read a snapshot on a reader.

Durability: ``synchronous = full``, so a ``schedule()`` that returned is on
disk (the store's own connections use ``normal``; see
``docs/stores-sqlite.md``).

sqlite sends no notifications: another process's task is noticed by the
worker's poll (``Timings.poll_idle_s``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import Literal

from ..stores.group import GroupCommit, GroupStatistics
from ..stores.sqlite.conn import ConnectionPool
from ._queue import TaskRow

__all__ = ["SqliteQueue"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS a2_scheduler_tasks (
  id TEXT PRIMARY KEY,
  contract TEXT NOT NULL,
  due_at INTEGER NOT NULL,
  body TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  leased_until INTEGER,
  lease_token TEXT,
  last_error TEXT
)""",
    "CREATE INDEX IF NOT EXISTS a2_scheduler_tasks_due ON a2_scheduler_tasks (contract, due_at)",
)

_Work = Callable[[sqlite3.Connection], object]


def _create(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)


class SqliteQueue:
    """The sqlite :class:`~a2trio.schedulers._queue.TaskQueue`."""

    cross_process: Literal["none", "poll", "notify"] = "poll"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._pool = ConnectionPool(self.path, migrate=_create, synchronous="full")
        self._writes: GroupCommit[str, _Work, object] = GroupCommit(
            self._run_group, rejected=(), leaders=1
        )

    def __repr__(self) -> str:
        return f"SqliteQueue({self.path!r})"

    def group_statistics(self) -> GroupStatistics:
        """How the writes were group-committed (tests, benchmarks)."""
        return self._writes.statistics()

    async def _run_group(self, works: Sequence[_Work]) -> list[object]:
        return await self._pool.write(lambda conn: [work(conn) for work in works])

    async def open(self) -> None:
        # The first write opens the writer and creates the table.
        await self._pool.write(lambda conn: None)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        def insert(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO a2_scheduler_tasks (id, contract, due_at, body) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                (task_id, contract, due_at_ms, body.decode()),
            )
            return cursor.rowcount == 1

        return bool(await self._writes.submit(task_id, insert))

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

        return await self._pool.write(claim)

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        def renew(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE a2_scheduler_tasks SET leased_until = ? WHERE id = ? AND lease_token = ?",
                (until_ms, task_id, token),
            )
            return cursor.rowcount == 1

        return bool(await self._writes.submit(task_id, renew))

    async def delete(self, task_id: str, token: str) -> None:
        await self._writes.submit(
            task_id,
            lambda conn: conn.execute(
                "DELETE FROM a2_scheduler_tasks WHERE id = ? AND lease_token = ?", (task_id, token)
            ),
        )

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        await self._writes.submit(
            task_id,
            lambda conn: conn.execute(
                "UPDATE a2_scheduler_tasks SET due_at = ?, leased_until = NULL, "
                "lease_token = NULL, last_error = coalesce(?, last_error) "
                "WHERE id = ? AND lease_token = ?",
                (due_at_ms, error, task_id, token),
            ),
        )

    async def next_due(self, contract: str) -> int | None:
        def next_due(conn: sqlite3.Connection) -> int | None:
            (due,) = conn.execute(
                "SELECT min(max(due_at, coalesce(leased_until, 0))) FROM a2_scheduler_tasks "
                "WHERE contract = ?",
                (contract,),
            ).fetchone()
            return None if due is None else int(due)

        return await self._pool.read(next_due)

    async def count(self, contract: str | None = None) -> int:
        def count(conn: sqlite3.Connection) -> int:
            (n,) = conn.execute(
                "SELECT count(*) FROM a2_scheduler_tasks WHERE ? IS NULL OR contract = ?",
                (contract, contract),
            ).fetchone()
            return int(n)

        return await self._pool.read(count)
