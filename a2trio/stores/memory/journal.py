"""The memory store's journal of durable handlers' steps (``store.journal``).

Entries sit beside the rows, keyed by (session, index); each write is fenced
by ``rules.journals`` over the event's row, with no await between the
verdict and the write (atomic under Trio).
"""

from __future__ import annotations

import trio

from ...clock import Clock
from .. import rules
from ..base import JournalEntry
from .rows import Row

__all__ = ["MemoryJournal"]


class MemoryJournal:
    """The journal over the store's ``sessions`` rows, stamped by ``clock``."""

    def __init__(self, clock: Clock, sessions: dict[str, list[Row]]) -> None:
        self._clock = clock
        self._sessions = sessions
        self._entries: dict[tuple[str, int], dict[str, JournalEntry]] = {}

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        """See :meth:`Journal.read_journal`."""
        await trio.lowlevel.checkpoint()
        return list(self._entries.get((session_id, index), {}).values())

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        """See :meth:`Journal.write_step`."""
        await trio.lowlevel.checkpoint()
        rows = self._sessions.get(session_id, [])
        row = rows[index - 1] if 1 <= index <= len(rows) else None
        rules.journals(session_id, index, attempt, row)
        entries = self._entries.setdefault((session_id, index), {})
        stored = entries.get(name)
        if stored is None:
            stored = JournalEntry(name, bytes(result), attempt, self._clock.now_ms())
            entries[name] = stored
        return stored

    def forget(self, session_id: str, *, through_index: int | None = None) -> None:
        """Drop the session's steps (its erasure, ``store.retention``), or
        those of its events at or below ``through_index`` (a trim)."""
        for key in [
            key
            for key in self._entries
            if key[0] == session_id and (through_index is None or key[1] <= through_index)
        ]:
            del self._entries[key]
