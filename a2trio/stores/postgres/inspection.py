"""The Postgres store's inspection (``store.inspect``): sessions, pages of
events, snapshots and failed attempts, each one statement."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import EventPage, FailedAttempt, SessionPage, SessionSummary, SnapshotInfo
from . import sql as sql
from .codec import stored_event
from .conn import errors
from .database import Database

__all__ = ["PostgresInspection"]


class PostgresInspection:
    """:class:`~a2trio.stores.base.Inspection` on the store's ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions by id (the seed's ``listSessions``). Cancellation: a read."""
        with errors("list sessions"):
            rows = await self._db.query(sql.LIST_SESSIONS, (prefix, cursor, limit + 1))
        sessions = [SessionSummary(*row) for row in rows[:limit]]
        more = len(rows) > limit
        return SessionPage(sessions, sessions[-1].session_id if more and sessions else None)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """A page bounded by the frontier, read in one snapshot. Cancellation: a read."""
        with errors("read events"):
            rows = await self._db.query(
                sql.READ_EVENTS, (session_id, after_index, through_index, limit)
            )
        events = [stored_event(row, 1) for row in rows if row[1] is not None]
        return EventPage(events, rows[0][0])

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""
        with errors("list snapshots"):
            rows = await self._db.query(sql.LIST_SNAPSHOTS, (session_id,))
        return [SnapshotInfo(*row) for row in rows]

    async def read_failures(self, session_id: str, indexes: Sequence[int]) -> list[FailedAttempt]:
        """The events' failed attempts, by index and attempt. Cancellation: a read."""
        with errors("read failures"):
            rows = await self._db.query(sql.FAILURES, (session_id, sorted(set(indexes))))
        return [FailedAttempt(*row) for row in rows]
