"""The Redis store's presence plane (push tier).

Rows live in a hash per session (field-wise LWW on the sender's ``at``
inside the script, expiry on the store's clock, the key itself expiring in
real time after its last row would). The script publishes the applied patch
on the session's ``presence`` channel; the writing store delivers it to local
subscribers as it returns and skips its own echo (``subscriber`` hears the
others'). After the subscriber reconnects, every followed session's rows are
re-read and delivered again (:meth:`RedisPresence.repaint`: values may
repeat, none is lost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ...errors import A2Error
from ..base import PresenceRow, StoredPresencePatch
from . import codec
from . import scripts as lua
from .conn import errors

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection
    from .subscriber import Subscriber

__all__ = ["RedisPresence"]

#: The presence key outlives its latest row by this much (real time): rows
#: expire on the store's clock, the key only collects abandoned sessions.
_PRESENCE_KEY_SLACK_MS = 60_000


class RedisPresence:
    """Presence rows in a hash per session: LWW per field, pushed by pub/sub.

    Args:
      conn: the store's command client.
      keys: the store's key names.
      clock: the store's clock (row expiry).
      origin: the store's instance id, which tags its patches.
      subscriber: the store's shared subscriber (the ``presence`` channels).
    """

    push = True

    def __init__(
        self, conn: Connection, keys: Keys, clock: Clock, origin: str, subscriber: Subscriber
    ) -> None:
        self._conn = conn
        self._keys = keys
        self._clock = clock
        self._origin = origin
        self._subscriber = subscriber
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
        """Apply the fields in one script; deliver the patch locally, publish it.

        Cancellation: applied entirely or not at all; retrying with the same
        ``at_ms`` is idempotent (ties go to the incoming write).
        """
        if not values:
            await trio.lowlevel.checkpoint()
            return None
        with errors("presence set"):
            now = self._clock.now_ms()
            args: list[str | bytes | int] = [
                now,
                now + ttl_ms,
                seen,
                at_ms,
                ttl_ms + _PRESENCE_KEY_SLACK_MS,
                self._origin,
                self._keys.key(session_id, "presence"),
                participant,
                codec.encode(participant),
            ]
            for field, value in values.items():
                args += [field, codec.encode(field), b"" if value is None else codec.encode(value)]
            applied = await self._conn.run(
                lua.PRESENCE_SET, [self._keys.key(session_id, "presence")], args
            )
        fields = {codec.text(f) for f in applied}
        if not fields:
            return None
        patch = StoredPresencePatch(
            participant, {f: v for f, v in values.items() if f in fields}, seen, at_ms
        )
        self.deliver(session_id, patch)
        return patch

    async def read(self, session_id: str) -> list[PresenceRow]:
        """Live rows, expired ones deleted, in one script. Cancellation: a
        checkpoint; the sweep is idempotent."""
        with errors("presence read"):
            flat = await self._conn.run(
                lua.PRESENCE_READ,
                [self._keys.key(session_id, "presence")],
                [self._clock.now_ms()],
            )
        rows = [codec.presence_row(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        rows.sort(key=lambda row: (row.participant, row.field))
        return rows

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        subscribers = self._subscribers.setdefault(session_id, set())
        subscribers.add(on_patch)
        channel = self._keys.channel(session_id, "presence")
        self._subscriber.acquire(channel, "presence", session_id)
        stopped = False

        def unsubscribe() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            subscribers.discard(on_patch)
            if not subscribers and self._subscribers.get(session_id) is subscribers:
                del self._subscribers[session_id]
            self._subscriber.release(channel)

        return unsubscribe

    def deliver(self, session_id: str, patch: StoredPresencePatch) -> None:
        for on_patch in list(self._subscribers.get(session_id, ())):
            on_patch(patch)

    def followed(self) -> list[str]:
        return list(self._subscribers)

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())

    async def repaint(self) -> None:
        """After a reconnect: deliver every followed session's rows again, so
        subscribers see what changed while the channel was down."""
        for session_id in self.followed():
            try:
                rows = await self.read(session_id)
            except A2Error:
                return  # down again: the next connection repaints
            for row in rows:
                self.deliver(
                    session_id,
                    StoredPresencePatch(
                        row.participant, {row.field: row.value}, row.seen, row.at_ms
                    ),
                )
