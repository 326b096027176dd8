"""The Redis store's retention (issue 35): export a session, erase it.

Each is one script, so atomic: ``EXPORT`` reads the session's stream, its
bookkeeping, snapshots and actions; ``ERASE`` finds the first live claim
among the open events (``claim_free`` of :data:`~.scripts.RULES`, the one
Lua spelling of ``rules.claim_free``) and the frontier, and removes nothing
unless there is none and the frontier is the one expected; otherwise it
deletes every key of the session (``scripts`` has the layout), its ids from
``P:ids`` and its names from ``P:sessions`` and ``P:open-sessions``. What
it returns becomes the refusal through ``rules.check_unclaimed`` and
``rules.check_expected``. The ``watched`` marker is left to expire: it says
a feed listens, and holds nothing of the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .. import rules
from ..base import ArchivedSnapshot, Erased, OperatorAction, SessionArchive
from . import codec
from .conn import errors
from .scripts import RULES

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection

__all__ = ["ERASE", "EXPORT", "RedisRetention"]

#: KEYS: log, meta, snap, actions. Returns ``{{index, entry, meta|false,
#: ...}, {reducer, snapshot, ...}, {action, ...}}``.
EXPORT: Final = r"""
local rows = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local idx = string.sub(e[1], 1, -3)
  rows[#rows + 1] = tonumber(idx)
  rows[#rows + 1] = e[2][2]
  rows[#rows + 1] = redis.call('HGET', KEYS[2], idx) or false
end
return {rows, redis.call('HGETALL', KEYS[3]), redis.call('LRANGE', KEYS[4], 0, -1)}
"""

#: KEYS: log, meta, open, head, snap, presence, actions, ids, sessions,
#: open-sessions, failures, journal (the durable handlers' steps, not
#: counted). ARGV: now, the expected frontier ('' for any), the session key.
#: Returns ``{'claimed', frontier, index, holder, attempts, expiry}``,
#: ``{'changed', frontier}`` or ``{'erased', frontier, events, snapshots,
#: actions, presence}``.
ERASE: Final = (
    RULES
    + r"""
local now = tonumber(ARGV[1])
local front = tonumber(redis.call('HGET', KEYS[4], 'n') or '0')
for _, idx in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local m = cjson.decode(redis.call('HGET', KEYS[2], idx))
  if m.h and not claim_free(m, now) then
    return {'claimed', front, tonumber(idx), m.h, m.a or 0, m.x}
  end
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= front then return {'changed', front} end
local ids = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  ids[#ids + 1] = cjson.decode(e[2][2])[1]
end
for i = 1, #ids, 1000 do
  redis.call('HDEL', KEYS[8], unpack(ids, i, math.min(i + 999, #ids)))
end
local snapshots = redis.call('HLEN', KEYS[5])
local presence = redis.call('HLEN', KEYS[6])
local actions = redis.call('LLEN', KEYS[7])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[11],
  KEYS[12])
redis.call('ZREM', KEYS[9], ARGV[3])
redis.call('ZREM', KEYS[10], ARGV[3])
return {'erased', front, #ids, snapshots, actions, presence}
"""
)


class RedisRetention:
    """:class:`~a2trio.stores.base.Retention` over the store's ``conn``,
    ``keys`` and ``clock``."""

    def __init__(self, conn: Connection, keys: Keys, clock: Clock) -> None:
        self._conn = conn
        self._keys = keys
        self._clock = clock

    async def export(self, session_id: str) -> SessionArchive:
        """See :meth:`Retention.export`: one script. Cancellation: a read."""
        key = self._keys.key
        with errors("export"):
            flat, snaps, raws = await self._conn.run(
                EXPORT,
                [key(session_id, s) for s in ("log", "meta", "snap", "actions")],
                [],
            )
        events = codec.rows(session_id, flat)
        snapshots = []
        for i in range(0, len(snaps), 2):
            index, updated, state = snaps[i + 1].split(b":", 2)
            reducer = codec.text(snaps[i])
            state_of = codec.decode(state)
            snapshots.append(ArchivedSnapshot(reducer, int(index), state_of, int(updated)))
        snapshots.sort(key=lambda s: s.reducer_name)
        actions = sorted(
            (
                OperatorAction(a.action, session_id, a.index, a.by, a.reason, a.at_ms)
                for a in map(codec.decode_action, raws)
            ),
            key=lambda a: a.index,
        )
        last = events[-1].index if events else 0
        return SessionArchive(session_id, last, events, snapshots, actions)

    async def erase(self, session_id: str, *, expected_index: int | None = None) -> Erased:
        """See :meth:`Retention.erase`: one script. Cancellation: removed
        entirely or not at all."""
        keys = self._keys
        now = self._clock.now_ms()
        suffixes = ("log", "meta", "open", "head", "snap", "presence", "actions")
        with errors("erase"):
            answer = await self._conn.run(
                ERASE,
                [
                    *(keys.key(session_id, s) for s in suffixes),
                    keys.global_key("ids"),
                    keys.global_key("sessions"),
                    keys.global_key("open-sessions"),
                    keys.key(session_id, "failures"),
                    keys.key(session_id, "journal"),
                ],
                [now, "" if expected_index is None else expected_index, session_id],
            )
        verdict, front = codec.text(answer[0]), int(answer[1])
        if verdict == "claimed":
            index, holder, attempts, expires = answer[2:]
            held = rules.HeldClaim(int(index), codec.text(holder), int(attempts), int(expires))
            rules.check_unclaimed(session_id, held)
        rules.check_expected(session_id, expected_index, front)
        events, snapshots, actions, presence = (int(n) for n in answer[2:])
        return Erased(session_id, events, snapshots, actions, presence, now)
