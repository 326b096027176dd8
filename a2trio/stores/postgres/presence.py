"""The Postgres store's presence plane (the seed's ``a2_presence``): LWW per
field, pushed to local subscribers as a write applies and to other processes'
through the ``a2_presence`` trigger's NOTIFY, which the store's listener hands
to :meth:`PostgresPresence.heard`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import trio

from ...clock import Clock
from ..base import PresenceRow, StoredPresencePatch
from . import sql as sql
from .codec import encode
from .conn import errors
from .database import Database

__all__ = ["PostgresPresence"]


class _Presence(msgspec.Struct, frozen=True):
    """A presence notification, as the trigger writes it."""

    o: str | None
    ns: str
    p: str
    f: str
    v: Any
    s: int
    a: int


_decode_presence = msgspec.json.Decoder(_Presence).decode


class PostgresPresence:
    """Presence rows (the seed's ``a2_presence``): LWW per field.

    The push tier needs the listener to hear other processes' writes; with
    ``listen=False`` this is the degraded tier (``push`` is False) and the
    server re-reads and diffs.

    The store hands it its ``db``, its clock, and ``subscribe``, which counts
    a local subscriber on the store's listener and returns its release.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock,
        push: bool,
        subscribe: Callable[[], Callable[[], None]],
    ) -> None:
        self._db = db
        self._clock = clock
        self.push: bool = push
        self._subscribe = subscribe
        self._subscribers: dict[str, set[Callable[[StoredPresencePatch], None]]] = {}

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
        """Apply the fields in one transaction; deliver the patch locally.

        Cancellation: the write committed entirely or not at all; retrying
        with the same ``at_ms`` is idempotent (ties go to the incoming write).
        """
        if not values:
            await trio.lowlevel.checkpoint()
            return None
        with errors("presence set"):
            # Expiry anchors on the store's clock; `at` only orders writes.
            expires_at = self._clock.now_ms() + ttl_ms
            rows = await self._db.transaction(
                [
                    (sql.PRESENCE_ORIGIN, (self._db.origin, str(seen), str(at_ms))),
                    (
                        sql.PRESENCE_SET,
                        (session_id, participant, encode(values), seen, at_ms, expires_at),
                    ),
                ],
                lock=None,
            )
        applied = {row[0] for row in rows[1]}
        if not applied:
            return None
        patch = StoredPresencePatch(
            participant, {f: v for f, v in values.items() if f in applied}, seen, at_ms
        )
        self.deliver(session_id, patch)
        return patch

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, expired ones swept, in one statement.

        Cancellation: a checkpoint; the sweep is idempotent.
        """
        with errors("presence read"):
            rows = await self._db.query(sql.PRESENCE_READ, (session_id, self._clock.now_ms()))
        return [PresenceRow(*row) for row in rows]

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        subscribers = self._subscribers.setdefault(session_id, set())
        subscribers.add(on_patch)
        release = self._subscribe()

        def unsubscribe() -> None:
            release()
            subscribers.discard(on_patch)
            if not subscribers and self._subscribers.get(session_id) is subscribers:
                del self._subscribers[session_id]

        return unsubscribe

    def deliver(self, session_id: str, patch: StoredPresencePatch) -> None:
        for on_patch in list(self._subscribers.get(session_id, ())):
            on_patch(patch)

    def heard(self, payload: str) -> None:
        """A notification on the presence channel: another store's write."""
        try:
            note = _decode_presence(payload)
        except msgspec.DecodeError:
            return  # not a payload this version writes: nothing to deliver
        if note.o == self._db.origin:
            return
        self.deliver(note.ns, StoredPresencePatch(note.p, {note.f: note.v}, note.s, note.a))

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())
