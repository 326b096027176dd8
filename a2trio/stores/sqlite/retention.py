"""The SQLite store's retention (issue 35): export, erase and trim a
session, and the trim point's check on its reads (:func:`checked`).

:class:`SqliteRetention` is the store's
:class:`~a2trio.stores.base.Retention` capability (``store.retention``): an
export is one read transaction, an erasure one write transaction that reads
the session's first live claim through the partial index over unprocessed
rows, decides with ``rules`` (``check_unclaimed``, ``check_expected``) and
deletes every row of the session in every table. A trim, one write
transaction too, reads the facts ``rules.check_trim`` decides on (the
snapshot, the last index, the first unprocessed event) by key and the
partial index, then deletes the range of the primary key below the point.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from ...clock import Clock
from .. import rules
from ..base import ArchivedSnapshot, Erased, OperatorAction, SessionArchive, StoredEvent, Trimmed
from . import sql
from .conn import Transactions

__all__ = ["SqliteRetention", "checked"]

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
_FIRST: Final = "select idx from a2_events where session_id = ? order by idx limit 1"
_FIRST_OPEN: Final = (
    "select idx from a2_events indexed by a2_events_unprocessed "
    "where session_id = ? and processed_at is null order by idx limit 1"
)
_TRIM: Final = "delete from a2_events where session_id = ? and idx <= ?"
# What else a trimmed event leaves: its failed attempts and journaled steps.
_TRIM_DERIVED: Final = (
    "delete from a2_failed_attempts where session_id = ? and idx <= ?",
    "delete from a2_journal where session_id = ? and idx <= ?",
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


def checked(
    conn: sqlite3.Connection,
    session_id: str,
    after: int,
    through: int | None,
    rows: list[tuple[Any, ...]],
) -> list[StoredEvent]:
    """A read's rows, decoded, once ``rules.check_read`` passed them (the
    first stored index read in the same transaction when it must be)."""
    first = rows[0][3] if rows else None
    if rules.needs_first_index(after, through, bool(rows)):
        found = conn.execute(_FIRST, (session_id,)).fetchone()
        first = None if found is None else found[0]
    rules.check_read(session_id, after, through, first)
    return [sql.stored(row) for row in rows]


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

    async def trim(self, session_id: str, reducer: str) -> Trimmed:
        """See :meth:`Retention.trim`: one write transaction. Cancellation:
        removed entirely or not at all."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> Trimmed:
            found = conn.execute(_LIVE_CLAIM, (session_id, now)).fetchone()
            rules.check_unclaimed(session_id, None if found is None else rules.HeldClaim(*found))
            snapshot = conn.execute(sql.READ_SNAPSHOT, (session_id, reducer)).fetchone()
            first_open = conn.execute(_FIRST_OPEN, (session_id,)).fetchone()
            point = rules.check_trim(
                session_id,
                reducer,
                None if snapshot is None else snapshot[0],
                sql.next_index(conn, session_id) - 1,
                None if first_open is None else first_open[0],
            )
            removed = conn.execute(_TRIM, (session_id, point)).rowcount
            for statement in _TRIM_DERIVED:
                conn.execute(statement, (session_id, point))
            first = conn.execute(_FIRST, (session_id,)).fetchone()
            through = point if first is None else max(point, first[0] - 1)
            return Trimmed(session_id, reducer, through, removed, now)

        return await self._transactions.write("trim", work)
