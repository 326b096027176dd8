"""The Redis store's inspection (``store.inspect``): sessions by prefix, pages
of events, snapshots, failed attempts. Every call is a read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from ..base import EventPage, FailedAttempt, SessionPage, SessionSummary, SnapshotInfo
from . import codec
from . import scripts as lua
from .conn import errors

if TYPE_CHECKING:
    from .codec import Keys
    from .conn import Connection

__all__ = ["RedisInspection"]


class RedisInspection:
    """Args: ``conn``, the store's command client; ``keys``, its key names."""

    def __init__(self, conn: Connection, keys: Keys) -> None:
        self._conn = conn
        self._keys = keys

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions by id (``ZRANGE BYLEX``), then their counters. Cancellation: a read."""
        keys = self._keys
        low = b"[" + prefix.encode()
        if cursor is not None and cursor >= prefix:
            low = b"(" + cursor.encode()
        # No UTF-8 string has the byte 0xff: every id with the prefix sorts below.
        high = b"(" + prefix.encode() + b"\xff"
        with errors("list sessions"):
            ids = [
                codec.text(s)
                for s in await self._conn.run(
                    lua.LIST, [keys.global_key("sessions")], [low, high, limit + 1]
                )
            ]
            page = ids[:limit]
            summary_keys = [
                keys.key(sid, suffix) for sid in page for suffix in ("head", "meta", "open")
            ]
            counters = await self._conn.run(lua.SUMMARIES, summary_keys, []) if page else []
        sessions = [
            SessionSummary(
                session_id=sid,
                event_count=int(c[0]),
                pending_count=int(c[3]),
                failed_count=int(c[4]),
                attempt_count=int(c[5]),
                failure_count=int(c[6]),
                first_event_at_ms=int(c[1]),
                updated_at_ms=int(c[2]),
            )
            for sid, c in zip(page, counters, strict=True)
        ]
        more = len(ids) > limit
        return SessionPage(sessions, sessions[-1].session_id if more and sessions else None)

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """A page bounded by the frontier, in one script. Cancellation: a read."""
        with errors("read events"):
            through, flat = await self._conn.run(
                lua.READ_EVENTS,
                [self._keys.key(session_id, s) for s in ("log", "meta", "head")],
                [
                    max(0, after_index),
                    "" if through_index is None else max(0, through_index),
                    max(0, limit),
                ],
            )
        return EventPage(codec.rows(session_id, flat), int(through))

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots by reducer name. Cancellation: a read."""
        with errors("list snapshots"):
            flat = await self._conn.run(lua.HGETALL, [self._keys.key(session_id, "snap")], [])
        infos = [codec.snapshot_info(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        infos.sort(key=lambda info: info.reducer_name)
        return infos

    async def read_failures(self, session_id: str, indexes: Sequence[int]) -> list[FailedAttempt]:
        """The events' fields of ``P:S:failures`` (``HMGET``), by index and
        attempt. Cancellation: a read."""
        wanted = sorted(set(indexes))
        if not wanted:
            await trio.lowlevel.checkpoint()
            return []
        with errors("read failures"):
            raws = await self._conn.run(lua.HMGET, [self._keys.key(session_id, "failures")], wanted)
        return [
            failure
            for index, raw in zip(wanted, raws, strict=True)
            if raw is not None
            for failure in codec.failures(index, raw)
        ]
