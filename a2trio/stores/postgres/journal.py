"""The Postgres store's journal of durable handlers' steps (``store.journal``).

One table, ``a2_journal``, keyed by (session, index, name). A write is one
statement (``sql.JOURNAL_WRITE``): the event's row read ``for share``,
fenced by ``rules.journals`` (its ``holds_claim`` fragment), and an insert
that keeps a name's first entry; the fence's message is built here from what
the statement answers.
"""

from __future__ import annotations

from ...clock import Clock
from .. import rules
from ..base import EventCause, JournalEntry
from . import sql as sql
from .conn import errors
from .database import Database

__all__ = ["PostgresJournal"]


class PostgresJournal:
    """The journal on the store's ``db``, stamped by its ``clock``."""

    def __init__(self, db: Database, *, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        """See :meth:`Journal.read_journal`: one statement. Cancellation: a read."""
        with errors("read journal"):
            rows = await self._db.query(sql.JOURNAL_READ, (session_id, index))
        return [JournalEntry(name, text.encode(), by, at) for name, text, by, at in rows]

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        """See :meth:`Journal.write_step`: one statement in its own transaction.
        Cancellation: committed entirely or not at all."""
        params = (session_id, index, name, attempt, result.decode(), self._clock.now_ms())
        with errors("write step"):
            [rows] = await self._db.transaction([(sql.JOURNAL_WRITE, params)], lock=None)
        [(found, holds, stored_name, stored, by, at)] = rows
        if not found:
            raise rules.no_event(session_id, index)
        if not holds:
            raise rules.superseded_attempt(session_id, EventCause(index, attempt))
        if stored is None:
            # A concurrent write of the same name by the same attempt committed
            # after this statement's snapshot: read what it stored.
            for entry in await self.read_journal(session_id, index):
                if entry.name == name:
                    return entry
            raise AssertionError(f"step {name!r} was neither written nor found")
        return JournalEntry(stored_name, stored.encode(), by, at)
