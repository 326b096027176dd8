"""The SQLite store's retention (issue 35): export a session, erase it.

:class:`SqliteRetention` is the store's
:class:`~a2trio.stores.base.Retention` capability (``store.retention``): an
export is one read transaction, an erasure one write transaction that reads
the session's first live claim through the partial index over unprocessed
rows, decides with ``rules`` (``check_unclaimed``, ``check_expected``) and
deletes every row of the session in every table.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ...clock import Clock
from .. import rules
from ..base import ArchivedSnapshot, Erased, OperatorAction, SessionArchive
from . import sql
from .conn import Transactions

__all__ = ["SqliteRetention"]

# The partial index holds only unprocessed rows: a claim lives only there.
_LIVE_CLAIM: Final = """
select idx, claim_holder, attempt_count, claim_expires_at
from a2_events indexed by a2_events_unprocessed
where session_id = ? and processed_at is null and claim_holder is not null
  and claim_expires_at > ?
order by idx limit 1
"""
_SNAPSHOTS: Final = (
    "select reducer_name, up_to_index, state, updated_at from a2_snapshots "
    "where session_id = ? order by reducer_name"
)
_ACTIONS: Final = (
    "select action, session_id, idx, actor, reason, at from a2_operator_actions "
    "where session_id = ? order by idx, id"
)
# Every table that holds rows of a session, and its session column.
_ERASE: Final = (
    "delete from a2_events where session_id = ?",
    "delete from a2_snapshots where session_id = ?",
    "delete from a2_operator_actions where session_id = ?",
    "delete from a2_presence where ns = ?",
    # The durable handlers' steps (issue 34): not counted in ``Erased``.
    "delete from a2_journal where session_id = ?",
)
# The session's failed attempts (issue 36), which the answer does not count.
_ERASE_FAILURES: Final = "delete from a2_failed_attempts where session_id = ?"


class SqliteRetention:
    """The transactions of ``SqliteStore.retention``."""

    def __init__(self, transactions: Transactions, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock

    async def export(self, session_id: str) -> SessionArchive:
        """See :meth:`Retention.export`: one read transaction. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> SessionArchive:
            events = [sql.stored(row) for row in conn.execute(sql.READ, (session_id, 0, None))]
            snapshots = [
                ArchivedSnapshot(reducer, index, sql.decode(state), updated)
                for reducer, index, state, updated in conn.execute(_SNAPSHOTS, (session_id,))
            ]
            actions = [OperatorAction(*row) for row in conn.execute(_ACTIONS, (session_id,))]
            index = events[-1].index if events else 0
            return SessionArchive(session_id, index, events, snapshots, actions)

        return await self._transactions.read("export", work)

    async def erase(self, session_id: str, *, expected_index: int | None = None) -> Erased:
        """See :meth:`Retention.erase`: one write transaction. Cancellation:
        removed entirely or not at all."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> Erased:
            found = conn.execute(_LIVE_CLAIM, (session_id, now)).fetchone()
            rules.check_unclaimed(session_id, None if found is None else rules.HeldClaim(*found))
            rules.check_expected(session_id, expected_index, sql.next_index(conn, session_id) - 1)
            events, snapshots, actions, presence, _ = (
                conn.execute(statement, (session_id,)).rowcount for statement in _ERASE
            )
            conn.execute(_ERASE_FAILURES, (session_id,))
            return Erased(session_id, events, snapshots, actions, presence, now)

        return await self._transactions.write("erase", work)
