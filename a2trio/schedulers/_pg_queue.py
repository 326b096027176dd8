"""Scheduler tasks in a Postgres table, on the Postgres store's Trio-native driver.

Any number of processes share one table. A claim is one statement that
leases due rows ``FOR UPDATE SKIP LOCKED``: concurrent claimers skip each
other's rows instead of waiting or double-claiming, so every task goes to one
worker. An insert that adds a row sends ``NOTIFY a2_scheduler, '<contract>'``
in the same statement, so other processes' workers wake when it commits.

Driver: the store's :class:`~a2trio.stores.postgres.conn.PgPool` (libpq through
psycopg's public ``pq`` layer, Trio socket waits, each call one pipelined
round trip; see ``docs/stores-postgres.md``), on connections of the
scheduler's own. Writes (inserts, deletes, renewals, reschedules) go through
:class:`~a2trio.stores.group.GroupCommit`: the writes that arrive while
others are in flight share the next transaction, ``begin; w1; w2; ...;
commit``, one round trip and one WAL flush. Claims and reads run alone.

Cancellation: the pool closes a connection whose pipeline was cancelled (the
driver first cancels the statement on the server), so a cancelled call
committed entirely or not at all; a connection error closes the connection
and the next call opens another.

Notifications: one more connection, outside the pool, runs ``LISTEN`` and
waits on its socket with ``trio.lowlevel.wait_readable``; it connects to
``listen_dsn`` when the pool's ``dsn`` goes through a transaction-mode pooler
(where ``LISTEN`` does not work). Every statement is already its own
transaction or inside one pipelined ``begin ... commit``, and names no
schema, so a transaction pooler needs nothing else but prepared statements
off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import trio

from ..stores.group import GroupCommit, GroupStatistics
from ..stores.postgres.conn import Param, PgConnection, PgError, PgPool, Row, Statement
from ._queue import TaskRow

if TYPE_CHECKING:
    from ..stores.feed import Wakeups

__all__ = ["PostgresQueue"]

CHANNEL = "a2_scheduler"
#: Pause before reconnecting a lost notification listener.
LISTEN_RETRY_S = 1.0
#: Connections in the pool: the group commit's leaders, a claim and a read.
MAX_CONNECTIONS = 4
#: Each connection attempt fails after this long (``STORE_UNAVAILABLE``).
CONNECT_TIMEOUT_S = 5.0

#: Serializes schema creation: concurrent CREATE TABLE IF NOT EXISTS can
#: still collide on the catalog's unique index.
_SCHEMA_LOCK = 0x61325F73636864
_SCHEMA = f"""
SELECT pg_advisory_xact_lock({_SCHEMA_LOCK});
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
""".encode()

_BEGIN = Statement("begin")
_COMMIT = Statement("commit")
# One row (the notification) if this call added the task.
_INSERT = Statement(
    "with added as ("
    " insert into a2_scheduler_tasks (id, contract, due_at, body)"
    " values ($1::text, $2::text, $3::bigint, $4::text::jsonb)"
    " on conflict (id) do nothing returning contract)"
    f" select pg_notify('{CHANNEL}', contract) from added"
)
_CLAIM = Statement(
    "update a2_scheduler_tasks t"
    " set attempts = t.attempts + 1, leased_until = $1::bigint, lease_token = $2::text"
    " from (select id from a2_scheduler_tasks"
    "       where contract = $3::text and due_at <= $4::bigint"
    "         and (leased_until is null or leased_until <= $4::bigint)"
    "       order by due_at limit $5::integer for update skip locked) due"
    " where t.id = due.id"
    " returning t.id, t.body::text, t.attempts, t.due_at"
)
_RENEW = Statement(
    "update a2_scheduler_tasks set leased_until = $3::bigint"
    " where id = $1::text and lease_token = $2::text returning 1"
)
_DELETE = Statement("delete from a2_scheduler_tasks where id = $1::text and lease_token = $2::text")
_RESCHEDULE = Statement(
    "update a2_scheduler_tasks set due_at = $3::bigint, leased_until = null,"
    " lease_token = null, last_error = coalesce($4::text, last_error)"
    " where id = $1::text and lease_token = $2::text"
)
_NEXT_DUE = Statement(
    "select min(greatest(due_at, coalesce(leased_until, 0)))"
    " from a2_scheduler_tasks where contract = $1::text"
)
_COUNT = Statement(
    "select count(*) from a2_scheduler_tasks where $1::text is null or contract = $1::text"
)

_Work = tuple[Statement, Sequence[Param]]


class PostgresQueue:
    """The Postgres :class:`~a2trio.schedulers._queue.TaskQueue`."""

    cross_process: Literal["none", "poll", "notify"] = "notify"

    def __init__(self, dsn: str, *, listen_dsn: str | None = None, prepare: bool = True) -> None:
        self.dsn = dsn
        self.listen_dsn = dsn if listen_dsn is None else listen_dsn
        self.prepare = prepare
        self._pool: PgPool | None = None
        self._writes: GroupCommit[str, _Work, list[Row]] = GroupCommit(
            self._run_group, rejected=(PgError,)
        )

    def __repr__(self) -> str:
        return "PostgresQueue(...)"

    def group_statistics(self) -> GroupStatistics:
        """How the writes were group-committed (tests, benchmarks)."""
        return self._writes.statistics()

    def _ready(self) -> PgPool:
        if self._pool is None:
            raise trio.ClosedResourceError("the scheduler's Postgres queue is not open")
        return self._pool

    async def _run(self, work: _Work) -> list[Row]:
        async with self._ready().connection() as conn:
            [rows] = await conn.run([work])
        return rows

    async def _run_group(self, works: Sequence[_Work]) -> list[list[Row]]:
        async with self._ready().connection() as conn:
            if len(works) == 1:
                # One statement is its own (implicit) transaction.
                return await conn.run(works)
            rows = await conn.run([(_BEGIN, ()), *works, (_COMMIT, ())])
        return rows[1:-1]

    async def open(self) -> None:
        pool = PgPool(
            self.dsn,
            max_size=MAX_CONNECTIONS,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            prepare=self.prepare,
        )
        try:
            async with pool.connection() as conn:
                # The simple protocol runs the script as one transaction: the
                # advisory lock holds until the DDL commits.
                await conn.script(_SCHEMA)
        except BaseException:
            pool.close()
            raise
        self._pool = pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        await trio.lowlevel.checkpoint()

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        rows = await self._writes.submit(task_id, (_INSERT, (task_id, contract, due_at_ms, body)))
        return bool(rows)

    async def claim(
        self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int
    ) -> list[TaskRow]:
        rows = await self._run((_CLAIM, (now_ms + lease_ms, token, contract, now_ms, limit)))
        rows.sort(key=lambda row: (row[3], row[0]))
        return [TaskRow(task_id, body.encode(), attempts) for task_id, body, attempts, _ in rows]

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        return bool(await self._writes.submit(task_id, (_RENEW, (task_id, token, until_ms))))

    async def delete(self, task_id: str, token: str) -> None:
        await self._writes.submit(task_id, (_DELETE, (task_id, token)))

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        await self._writes.submit(task_id, (_RESCHEDULE, (task_id, token, due_at_ms, error)))

    async def next_due(self, contract: str) -> int | None:
        [(due,)] = await self._run((_NEXT_DUE, (contract,)))
        return None if due is None else int(due)

    async def count(self, contract: str | None = None) -> int:
        [(n,)] = await self._run((_COUNT, (contract,)))
        return int(n)

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
            conn: PgConnection | None = None
            try:
                conn = await PgConnection.connect(
                    self.listen_dsn, timeout_s=CONNECT_TIMEOUT_S, prepare=False
                )
                await conn.script(f"LISTEN {CHANNEL}".encode())
                if started:
                    # Reconnected: anything sent meanwhile was lost.
                    wakeups.notify_all()
                else:
                    started = True
                    task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(conn.socket)
                    for _, contract in conn.notifies():
                        wakeups.notify(contract)
            except Exception:
                # No listener: the worker's safety re-read (notify_safety_s) covers the gap.
                if not started:
                    started = True
                    task_status.started()
            finally:
                if conn is not None:
                    conn.close()
            await trio.sleep(LISTEN_RETRY_S)
