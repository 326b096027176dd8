"""The SQLite store's read-only views (``SqliteStore.inspect``, the seed's ``inspect``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import msgspec

from ..base import EventPage, FailedAttempt, SessionPage, SessionSummary, SnapshotInfo
from . import sql
from .conn import Transactions

__all__ = ["SqliteInspection"]


class SqliteInspection:
    """Read-only views (the seed's ``inspect``)."""

    def __init__(self, transactions: Transactions) -> None:
        self._transactions = transactions

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions starting with ``prefix``, after ``cursor``. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> SessionPage:
            rows = conn.execute(sql.LIST_SESSIONS, (prefix, cursor, limit + 1)).fetchall()
            summaries = [SessionSummary(*row) for row in rows[:limit]]
            more = len(rows) > limit
            return SessionPage(summaries, summaries[-1].session_id if more and summaries else None)

        return await self._transactions.read("list_sessions", work)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """Events after ``after_index`` through ``min(through_index, frontier)``,
        frontier and page in one snapshot. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> EventPage:
            frontier = sql.next_index(conn, session_id) - 1
            through = frontier if through_index is None else min(through_index, frontier)
            rows = conn.execute(
                sql.READ_EVENTS, (session_id, after_index, through, limit)
            ).fetchall()
            return EventPage([sql.stored(row) for row in rows], through)

        return await self._transactions.read("read_events", work)

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""

        def work(conn: sqlite3.Connection) -> list[SnapshotInfo]:
            rows = conn.execute(sql.LIST_SNAPSHOTS, (session_id,)).fetchall()
            return [SnapshotInfo(*row) for row in rows]

        return await self._transactions.read("list_snapshots", work)

    async def read_failures(self, session_id: str, indexes: Sequence[int]) -> list[FailedAttempt]:
        """The events' failed attempts, by index and attempt. Cancellation: a read."""
        wanted = msgspec.json.encode(sorted(set(indexes))).decode()

        def work(conn: sqlite3.Connection) -> list[FailedAttempt]:
            rows = conn.execute(sql.FAILURES, (session_id, wanted)).fetchall()
            return [FailedAttempt(*row) for row in rows]

        return await self._transactions.read("read_failures", work)
