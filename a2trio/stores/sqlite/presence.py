"""The SQLite store's presence plane (``SqliteStore.presence``).

Presence is the degraded tier: rows with a TTL on the store's clock, re-read
and diffed by the server on the feed's cadence (``presence.push`` is False and
``subscribe`` never calls back).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from ...clock import Clock
from ..base import PresenceRow, StoredPresencePatch
from . import sql
from .conn import Transactions

__all__ = ["SqlitePresence"]


class SqlitePresence:
    """Presence rows with a TTL; the degraded tier (the server re-reads)."""

    push = False

    def __init__(self, transactions: Transactions, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock

    async def set(
        self,
        session_id: str,
        participant: str,
        values: dict[str, Any],
        *,
        seen: int,
        at_ms: int,
        ttl_ms: int,
    ) -> StoredPresencePatch | None:
        """Field-wise LWW on ``at_ms`` (store-postgres.ts ``presence.set``), all
        fields in one transaction. Cancellation: applied entirely or not at all."""
        encoded = {field: None if v is None else sql.text(v) for field, v in values.items()}

        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> StoredPresencePatch | None:
            # Sweep here, under the write lock we hold anyway, so reads stay reads.
            conn.execute(sql.PRESENCE_SWEEP, (session_id, now))
            expires_at = now + ttl_ms
            applied: dict[str, Any] = {}
            for field, value in encoded.items():
                # A stored row with a strictly newer `at` survives; ties go to
                # the incoming write.
                newer = conn.execute(
                    sql.PRESENCE_NEWER, (session_id, participant, field, at_ms)
                ).fetchone()
                if newer is not None:
                    continue
                if value is None:
                    conn.execute(sql.PRESENCE_DELETE, (session_id, participant, field))
                else:
                    conn.execute(
                        sql.PRESENCE_UPSERT,
                        (session_id, participant, field, value, seen, at_ms, expires_at),
                    )
                applied[field] = values[field]
            if not applied:
                return None
            return StoredPresencePatch(participant, applied, seen, at_ms)

        return await self._transactions.write("presence set", work)

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, ordered by participant and field (expired rows are
        filtered out here and swept by the next ``set``). Cancellation: a read."""
        now = self._clock.now_ms()

        def work(conn: sqlite3.Connection) -> list[PresenceRow]:
            rows = conn.execute(sql.PRESENCE_READ, (session_id, now)).fetchall()
            return [PresenceRow(p, f, sql.decode(v), s, a, e) for p, f, v, s, a, e in rows]

        return await self._transactions.read("presence read", work)

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        """Degraded tier: never calls ``on_patch``; the server re-reads instead."""
        return _unsubscribed


def _unsubscribed() -> None:
    return None
