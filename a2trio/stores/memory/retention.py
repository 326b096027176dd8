"""The memory store's retention (``Retention``): export, erase and trim a
session, over the store's rows.

Each operation decides with ``rules`` (``check_unclaimed``,
``check_expected``, ``check_trim``) and removes without an await in
between, so it is atomic under Trio, as the store's own operations are. A
trimmed event's row becomes a husk (:func:`~.rows.husk`: its index and
nothing else), so the rows of a session stay at their indexes; ``trimmed``
holds each trimmed session's trim point, which the store's reads check.
"""

from __future__ import annotations

import trio

from ...clock import Clock
from .. import rules
from ..base import ArchivedSnapshot, Erased, FailedAttempt, SessionArchive, Trimmed
from .journal import MemoryJournal
from .operator import MemoryOperator
from .presence import MemoryPresence
from .rows import Row, decode, husk

__all__ = ["MemoryRetention", "Snapshots"]

#: ``(session, reducer) -> (index, state as JSON, updated at)``, as the store keeps them.
Snapshots = dict[tuple[str, str], tuple[int, bytes, int]]


class MemoryRetention:
    """Retention over the store's ``sessions`` (every row, by session),
    ``ids``, ``open_rows``, ``snapshots``, ``trimmed`` (trim points),
    ``failures`` (failed attempts by session and index) and ``keyed`` (open
    rows by concurrency key), its operator's actions, its presence plane and
    its journal, stamped by ``clock``."""

    def __init__(
        self,
        clock: Clock,
        sessions: dict[str, list[Row]],
        ids: dict[str, Row],
        open_rows: dict[str, dict[int, Row]],
        snapshots: Snapshots,
        trimmed: dict[str, int],
        failures: dict[str, dict[int, list[FailedAttempt]]],
        keyed: dict[str, dict[tuple[str, int], Row]],
        operator: MemoryOperator,
        presence: MemoryPresence,
        journal: MemoryJournal,
    ) -> None:
        self._clock = clock
        self._sessions = sessions
        self._ids = ids
        self._open = open_rows
        self._snapshots = snapshots
        self._trimmed = trimmed
        self._failures = failures
        self._keyed = keyed
        self._operator = operator
        self._presence = presence
        self._journal = journal

    def _stored(self, session_id: str) -> list[Row]:
        rows = self._sessions.get(session_id, [])
        return rows[self._trimmed.get(session_id, 0) :]

    async def export(self, session_id: str) -> SessionArchive:
        """See :meth:`Retention.export`."""
        await trio.lowlevel.checkpoint()
        snapshots = [
            ArchivedSnapshot(reducer, index, decode(state), updated)
            for (sid, reducer), (index, state, updated) in sorted(self._snapshots.items())
            if sid == session_id
        ]
        rows = self._stored(session_id)
        return SessionArchive(
            session_id,
            len(self._sessions.get(session_id, [])),
            [row.stored() for row in rows],
            snapshots,
            self._operator.recorded(session_id),
        )

    async def erase(self, session_id: str, *, expected_index: int | None = None) -> Erased:
        """See :meth:`Retention.erase`."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        open_rows = dict(self._open.get(session_id, {}))
        rules.check_unclaimed(session_id, rules.live_claim(open_rows.values(), now))
        rules.check_expected(session_id, expected_index, len(self._sessions.get(session_id, [])))
        rows = self._stored(session_id)
        self._sessions.pop(session_id, None)
        self._open.pop(session_id, None)
        self._trimmed.pop(session_id, None)
        for row in rows:
            del self._ids[row.id]
        snapshots = [key for key in self._snapshots if key[0] == session_id]
        for key in snapshots:
            del self._snapshots[key]
        self._failures.pop(session_id, None)
        self._journal.forget(session_id)
        for row in open_rows.values():
            if row.concurrency_key is not None:
                self._keyed.get(row.concurrency_key, {}).pop((session_id, row.index), None)
        return Erased(
            session_id,
            len(rows),
            len(snapshots),
            self._operator.forget(session_id),
            self._presence.forget(session_id),
            now,
        )

    async def trim(self, session_id: str, reducer: str) -> Trimmed:
        """See :meth:`Retention.trim`."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        rows = self._sessions.get(session_id, [])
        open_rows = self._open.get(session_id, {})
        rules.check_unclaimed(session_id, rules.live_claim(open_rows.values(), now))
        snapshot = self._snapshots.get((session_id, reducer))
        point = rules.check_trim(
            session_id,
            reducer,
            None if snapshot is None else snapshot[0],
            len(rows),
            min(open_rows, default=None),
        )
        before = self._trimmed.get(session_id, 0)
        failures = self._failures.get(session_id, {})
        for position in range(before, point):
            del self._ids[rows[position].id]
            rows[position] = husk(rows[position])
            failures.pop(position + 1, None)
        if point > before:
            self._trimmed[session_id] = point
            self._journal.forget(session_id, through_index=point)
        return Trimmed(session_id, reducer, max(point, before), max(0, point - before), now)
