"""The SQLite store's operator actions (issue 18): dead letters, redrive, skip, retry now.

:class:`SqliteOperator` is the store's
:class:`~a2trio.stores.base.OperatorActions` capability (``store.operator``):
each action is one write transaction that fences on the event's row
(``rules.check_action``) and records who did what in ``a2_operator_actions``.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from ...clock import Clock
from .. import rules as verdicts
from ..base import OperatorAction, StoredEvent
from . import sql
from .conn import Transactions

__all__ = ["SqliteOperator"]


class SqliteOperator:
    """The transactions of ``SqliteStore.operator``."""

    def __init__(self, transactions: Transactions, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """A range of the partial index over dead rows. Cancellation: a read."""
        low, low_index = after if after is not None else (prefix, 0)

        def work(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(
                sql.DEAD_LETTERS, (low, low_index, sql.prefix_end(prefix), limit)
            ).fetchall()
            return [sql.stored(row) for row in rows]

        return await self._transactions.read("dead_letters", work)

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """A dead letter back in line (failures reset, no longer dead): one
        write transaction. Cancellation: committed entirely or not at all."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """An event processed without running it: one write transaction, the
        lane handed on as a completion does. Cancellation: all or nothing."""
        return await self._act("skip", session_id, index, by, reason)

    async def _act(
        self, action: Literal["redrive", "skip"], session_id: str, index: int, by: str, reason: str
    ) -> OperatorAction:
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> OperatorAction:
            found = conn.execute(sql.TARGET, (session_id, index)).fetchone()
            row = None if found is None else sql.target(found)
            verdicts.check_action(action, session_id, index, row, now)
            assert row is not None
            if action == "redrive":
                conn.execute(sql.REDRIVE, (session_id, index))
            else:
                conn.execute(sql.SKIP, (now, session_id, index))
                sql.hand_on(conn, session_id, row)
            conn.execute(sql.RECORD_ACTION, (session_id, index, action, by, reason, now))
            return OperatorAction(action, session_id, index, by, reason, now)

        return await self._transactions.write(action, work)

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """A suspended attempt's event claimable at once (``rules.check_wake``):
        one write transaction. Cancellation: committed entirely or not at all."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> OperatorAction:
            found = conn.execute(sql.WAKE_TARGET, (session_id, index)).fetchone()
            row = None if found is None else sql.Waking(*found)
            verdicts.check_wake(session_id, index, row, now)
            conn.execute(sql.UNWAIT, (session_id, index))
            conn.execute(sql.RECORD_ACTION, (session_id, index, "wake", by, reason, now))
            return OperatorAction("wake", session_id, index, by, reason, now)

        return await self._transactions.write("wake", work)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """One ``retry_now`` action per event a claim would take now, rows
        unchanged: one write transaction. Other processes' sweeps find the
        events once their backoff ends. Cancellation: all or nothing."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> list[OperatorAction]:
            candidates = conn.execute(sql.RETRY_CANDIDATES, (session_id,)).fetchall()
            targets = verdicts.retry_targets(session_id, candidates, now)
            conn.executemany(
                sql.RECORD_ACTION,
                [(session_id, i, "retry_now", by, reason, now) for i in targets],
            )
            return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

        return await self._transactions.write("retry_now", work)

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """The actions recorded on the session's events in the index range.
        Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> list[OperatorAction]:
            rows = conn.execute(
                sql.READ_ACTIONS, (session_id, after_index, through_index)
            ).fetchall()
            return [OperatorAction(*row) for row in rows]

        return await self._transactions.read("read_actions", work)
