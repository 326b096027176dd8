"""The SQLite store's journal of durable handlers' steps (``store.journal``).

One table, ``a2_journal`` (schema version 4; results as JSON text), keyed by (session, index,
name). A write is one ``BEGIN IMMEDIATE`` transaction: the event's
bookkeeping read by key, fenced by ``rules.journals`` under the write lock
(so no claim slips in between), then an insert that keeps a name's first
entry.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ...clock import Clock
from .. import rules
from ..base import JournalEntry
from . import sql
from .conn import Transactions

__all__ = ["SqliteJournal"]

_READ: Final = (
    "select name, result, attempt, at from a2_journal where session_id = ? and idx = ? order by seq"
)
_READ_ONE: Final = (
    "select name, result, attempt, at from a2_journal where session_id = ? and idx = ? and name = ?"
)
_WRITE: Final = """
insert into a2_journal (session_id, idx, name, result, attempt, at, seq)
select ?1, ?2, ?3, ?4, ?5, ?6,
       coalesce((select max(seq) from a2_journal where session_id = ?1 and idx = ?2), 0) + 1
on conflict (session_id, idx, name) do nothing
"""


def _entry(row: tuple[str, str, int, int]) -> JournalEntry:
    return JournalEntry(row[0], row[1].encode(), row[2], row[3])


class SqliteJournal:
    """The transactions of ``SqliteStore.journal``, stamped by ``clock``."""

    def __init__(self, transactions: Transactions, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        """See :meth:`Journal.read_journal`. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> list[JournalEntry]:
            return [_entry(row) for row in conn.execute(_READ, (session_id, index)).fetchall()]

        return await self._transactions.read("read_journal", work)

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        """See :meth:`Journal.write_step`: one write transaction.
        Cancellation: committed entirely or not at all."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> JournalEntry:
            found = conn.execute(sql.READ_BOOKKEEPING, (session_id, index)).fetchone()
            row = None if found is None else sql.Bookkeeping(*found)
            rules.journals(session_id, index, attempt, row)
            conn.execute(_WRITE, (session_id, index, name, result.decode(), attempt, now))
            return _entry(conn.execute(_READ_ONE, (session_id, index, name)).fetchone())

        return await self._transactions.write("write_step", work)
