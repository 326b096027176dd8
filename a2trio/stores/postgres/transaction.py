"""The app's own transaction on Postgres (``store.transactions``): the outbox.

One pooled connection is held for the block, outside the group commit: the
app's statements and its appends run on it in one ``begin ... commit``. An
append there is the store's own (``writes.PostgresWrites.append`` with the
connection): the session's ``pg_advisory_xact_lock``, then ``APPEND``, with
every verdict of a lone append; the lock is held until the transaction ends,
so the session's other appends, here or in other processes, wait for it and
then index after it (here, the writes that take a held session's lock leave
the group commit meanwhile: ``writes.PostgresWrites.holding``, so that no
group waits with them; the same task's would wait for itself and are
refused: ``held``). Uncommitted rows are invisible to every claim and read.
The ``NOTIFY`` of the insert trigger is transactional: other processes hear
the appends at the commit, never before; local feeds are woken after it
(told to read, not handed rows: a savepoint rolled back may have taken some).

Cancellation: a statement cancelled in flight closes the connection (the
pool's rule), and the server rolls back; a block cancelled between
statements closes it too. A block that raises rolls back and the connection
goes back to the pool. A commit cancelled in flight committed or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from ...errors import SqlError
from ..base import AppendEvent, AppendResult, SqlValue
from ..feed import Wakeups
from ..outbox import check_statement
from . import sql as sql
from .conn import Param, PgConnection, PgError, Statement, errors
from .database import Database
from .writes import PostgresWrites

__all__ = ["PostgresTransaction", "PostgresTransactions"]


def _param(value: object) -> Param:
    """An app's parameter as the driver's text form (``None``: SQL null)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        # bytea's hex input form; the driver sends bytes as they are.
        return b"\\x" + value.hex().encode()
    raise TypeError(
        f"an app transaction's parameter must be str, int, float, bool, bytes or None,"
        f" got {type(value).__name__}: encode it (JSON text with a ::jsonb cast, isoformat())"
    )


class PostgresTransaction:
    """One open app transaction (see the module docstring); the
    :class:`~a2trio.stores.base.StoreTransaction` of Postgres."""

    def __init__(self, conn: PgConnection, writes: PostgresWrites) -> None:
        self._conn = conn
        self._writes = writes
        self._turn = trio.Lock()
        self._open = True
        #: The app's own statement ended the transaction (commit or rollback).
        self.ended = False
        #: (session, task) of each session it appended to, by the task that
        #: appended: the session's lock is held to the transaction's end.
        self.held: set[tuple[str, trio.lowlevel.Task]] = set()

    def close(self) -> None:
        """Refuse later statements: the block is over."""
        self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("this app transaction is over: open a new one")
        if self.ended:
            raise SqlError("25000", "the app's own statement ended this transaction")

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """See :meth:`~a2trio.stores.base.StoreTransaction.execute`."""
        await self.fetch(sql, params)

    async def fetch(self, sql: str, params: Sequence[SqlValue] = ()) -> list[tuple[Any, ...]]:
        """See :meth:`~a2trio.stores.base.StoreTransaction.fetch`."""
        check_statement(sql)
        values = [_param(p) for p in params]
        statement = Statement(sql)
        async with self._turn:
            self._check_open()
            try:
                [rows] = await self._conn.run([(statement, values)], prepared=False)
            except PgError as exc:
                raise SqlError(exc.sqlstate, exc.message) from exc
            except Exception:
                with errors("transaction"):
                    raise
            if self._conn.idle:
                self.ended = True
                raise SqlError(
                    "25000",
                    "the statement ended the transaction: the block commits when it ends"
                    " and rolls back when it raises (savepoints work inside it)",
                )
        return rows

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        expected_index: int | None = None,
    ) -> AppendResult:
        """See :meth:`~a2trio.stores.base.StoreTransaction.append`."""
        mine = (session_id, trio.lowlevel.current_task())
        held = self._writes.held
        if mine not in self.held and held.get(mine):
            raise RuntimeError(
                f"another open app transaction of this task appended to {session_id!r}:"
                " this append would wait for its commit forever"
            )
        async with self._turn:
            self._check_open()
            if mine not in self.held:
                if session_id not in {held_session for held_session, _ in self.held}:
                    holding = self._writes.holding
                    holding[session_id] = holding.get(session_id, 0) + 1
                self.held.add(mine)
                held[mine] = held.get(mine, 0) + 1
            return await self._writes.append(
                session_id, events, expected_index=expected_index, on=self._conn
            )


class PostgresTransactions:
    """The app transaction capability of a Postgres store (``store.transactions``)."""

    def __init__(self, db: Database, writes: PostgresWrites, wakeups: Wakeups) -> None:
        self._db = db
        self._writes = writes
        self._wakeups = wakeups

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[PostgresTransaction]:
        """See :meth:`~a2trio.stores.base.AppTransactions.begin`."""
        async with AsyncExitStack() as stack:
            with errors("begin"):
                conn = await stack.enter_async_context(self._db.connection())
                await conn.run([(sql.BEGIN, ())])
            tx = PostgresTransaction(conn, self._writes)
            try:
                yield tx
                tx.close()
                if conn.failed:
                    raise SqlError(
                        "25P02",
                        "an error aborted this transaction: it rolled back, nothing was committed",
                    )
                if tx.ended:
                    raise SqlError("25000", "the app's own statement ended this transaction")
                with errors("commit"):
                    await conn.run([(sql.COMMIT, ())])
            finally:
                tx.close()
                self._ended(tx)

    def _ended(self, tx: PostgresTransaction) -> None:
        """Release the sessions it held and wake their local feeds (to read:
        committed or not, they find what is there)."""
        held, holding = self._writes.held, self._writes.holding
        for mine in tx.held:
            left = held.pop(mine) - 1
            if left:
                held[mine] = left
        for session_id in {session_id for session_id, _ in tx.held}:
            left = holding.pop(session_id) - 1
            if left:
                holding[session_id] = left
            self._wakeups.notify(session_id)
