"""The Redis store's journal of durable handlers' steps (``store.journal``).

One hash per session, ``P:S:journal`` (the layout is in ``scripts``): index
-> that event's steps in the order written, ``[[name, attempt, at, result],
...]``, so a read is one ``HGET`` and an erasure one ``DEL``. A write is
one script (``JOURNAL_WRITE``), fenced by the ``holds_claim`` rule over the
event's meta; the fence's messages are built here from what it answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from .. import rules
from ..base import EventCause, JournalEntry
from . import scripts as lua
from .conn import errors

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection

__all__ = ["RedisJournal"]

_Stored = tuple[str, int, int, str]
_decode_one = msgspec.json.Decoder(_Stored).decode
_decode_all = msgspec.json.Decoder(list[_Stored]).decode


def _entry(stored: _Stored) -> JournalEntry:
    name, attempt, at, result = stored
    return JournalEntry(name, result.encode(), attempt, at)


class RedisJournal:
    """Args: ``conn``, the store's command client; ``keys``, its key names;
    ``clock``, its clock (the entries' times)."""

    def __init__(self, conn: Connection, keys: Keys, clock: Clock) -> None:
        self._conn = conn
        self._keys = keys
        self._clock = clock

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        """See :meth:`Journal.read_journal`: one ``HGET``. Cancellation: a read."""
        with errors("read journal"):
            raw = await self._conn.run(lua.HGET, [self._keys.key(session_id, "journal")], [index])
        return [] if raw is None else [_entry(stored) for stored in _decode_all(raw)]

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        """See :meth:`Journal.write_step`: one script. Cancellation: run whole
        or not at all."""
        keys = [*self._keys.session_keys(session_id), self._keys.key(session_id, "journal")]
        args = [index, attempt, name, result, self._clock.now_ms()]
        with errors("write step"):
            reply = await self._conn.run(lua.JOURNAL_WRITE, keys, args)
        if reply[0] == b"missing":
            raise rules.no_event(session_id, index)
        if reply[0] == b"superseded":
            raise rules.superseded_attempt(session_id, EventCause(index, attempt))
        return _entry(_decode_one(reply[1]))
