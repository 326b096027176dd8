"""The app's own transaction on SQLite (``store.transactions``): the outbox.

The block holds the store's writer connection (``conn.ConnectionPool.held``)
inside one ``BEGIN IMMEDIATE``: the app's statements and its appends run on
it, one exclusive call on the writer's thread each (:mod:`.writer`), and
commit together. An append there is the
store's own transaction body (``store._append_rows``' statements, with every
verdict), inside a savepoint so that it writes all of its batch or nothing.
The file's single write lock is held for the whole block: every other write
waits for it, in this process (on the writer's lock) and in others (on the
file's lock, for at most ``BUSY_TIMEOUT_S``), while readers in WAL mode go on
reading the last commit. Local feeds are woken after the commit (told to
read: a savepoint rolled back may have taken some rows); other processes'
feeds find the rows at their next poll.

Cancellation: a statement in flight is interrupted (``conn``), and the block
rolls back, shielded (a local write).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import trio

from ...clock import Clock
from ...errors import SqlError
from ...ids import IdSource
from .. import rules as verdicts
from ..base import AppendEvent, AppendResult, SqlValue
from ..feed import Wakeups
from ..outbox import check_statement
from . import sql
from .conn import ConnectionPool, errors
from .writer import Writer

__all__ = ["SqliteTransaction", "SqliteTransactions"]

T = TypeVar("T")

#: ``_append_rows``: the append transaction's statements, from ``store``.
AppendRows = Callable[..., tuple[AppendResult, bool]]


def _param(value: object) -> SqlValue:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    raise TypeError(
        f"an app transaction's parameter must be str, int, float, bool, bytes or None,"
        f" got {type(value).__name__}: encode it (JSON text, isoformat())"
    )


def _sql_error(exc: sqlite3.Error) -> SqlError:
    code = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return SqlError(code, str(exc))


class SqliteTransaction:
    """One open app transaction (see the module docstring); the
    :class:`~a2trio.stores.base.StoreTransaction` of SQLite."""

    def __init__(
        self, conn: Writer, append_rows: AppendRows, clock: Clock, new_id: IdSource
    ) -> None:
        self._conn = conn
        self._append_rows = append_rows
        self._clock = clock
        self._new_id = new_id
        self._turn = trio.Lock()
        self._open = True
        #: The transaction ended under it (a statement's, or SQLite's rollback).
        self.ended = False
        #: The sessions it appended to.
        self.sessions: set[str] = set()

    def close(self) -> None:
        """Refuse later statements: the block is over."""
        self._open = False

    async def _run(self, work: Callable[[sqlite3.Connection], T], what: str | None = None) -> T:
        """``work`` on the held connection, one statement at a time; its
        failures translated as the store's (``what``) or left to ``work``."""
        async with self._turn:
            if not self._open:
                raise RuntimeError("this app transaction is over: open a new one")
            if self.ended:
                raise SqlError("SQLITE_ABORT", "this transaction ended under the block")
            try:
                if what is None:
                    return await self._conn.call(lambda raw, _: work(raw))
                with errors(what):
                    return await self._conn.call(lambda raw, _: work(raw))
            finally:
                if not self._conn.in_transaction:
                    self.ended = True

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """See :meth:`~a2trio.stores.base.StoreTransaction.execute`."""
        await self.fetch(sql, params)

    async def fetch(self, sql: str, params: Sequence[SqlValue] = ()) -> list[tuple[Any, ...]]:
        """See :meth:`~a2trio.stores.base.StoreTransaction.fetch`."""
        check_statement(sql)
        values = [_param(p) for p in params]

        def work(raw: sqlite3.Connection) -> list[tuple[Any, ...]]:
            try:
                return raw.execute(sql, values).fetchall()
            except sqlite3.Error as exc:
                raise _sql_error(exc) from exc

        rows = await self._run(work)
        if self.ended:
            raise SqlError("SQLITE_ABORT", "the statement ended the transaction")
        return rows

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        expected_index: int | None = None,
    ) -> AppendResult:
        """See :meth:`~a2trio.stores.base.StoreTransaction.append`."""
        supplied = verdicts.supplied_ids(events)
        ids = [e.id or self._new_id() for e in events]
        now = self._clock.now_ms()
        append_rows = self._append_rows

        def work(raw: sqlite3.Connection) -> AppendResult:
            if not events:
                return AppendResult([], sql.has_pending(raw, session_id))
            # All of the batch or nothing of it, as a lone append.
            raw.execute("savepoint a2_append")
            try:
                result, _ = append_rows(
                    raw, session_id, events, supplied, None, now, ids, expected_index
                )
            except BaseException:
                if raw.in_transaction:
                    raw.execute("rollback to a2_append")
                raise
            finally:
                if raw.in_transaction:
                    raw.execute("release a2_append")
            return result

        self.sessions.add(session_id)
        return await self._run(work, "append")


class SqliteTransactions:
    """The app transaction capability of a SQLite store (``store.transactions``)."""

    def __init__(
        self,
        pool: ConnectionPool,
        wakeups: Wakeups,
        append_rows: AppendRows,
        clock: Clock,
        new_id: IdSource,
    ) -> None:
        self._pool = pool
        self._wakeups = wakeups
        self._append_rows = append_rows
        self._clock = clock
        self._new_id = new_id

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[SqliteTransaction]:
        """See :meth:`~a2trio.stores.base.AppTransactions.begin`."""
        self._pool.check_open()
        self._pool.check_not_holding()
        async with AsyncExitStack() as stack:
            with errors("begin"):
                conn = await stack.enter_async_context(self._pool.held())
            tx = SqliteTransaction(conn, self._append_rows, self._clock, self._new_id)
            try:
                yield tx
                tx.close()
                if tx.ended:
                    raise SqlError("SQLITE_ABORT", "this transaction ended under the block")
                with errors("commit"):
                    await conn.call(_commit)
            finally:
                tx.close()
                for session_id in tx.sessions:
                    self._wakeups.notify(session_id)


def _commit(raw: sqlite3.Connection, _: object) -> None:
    raw.execute("commit")
