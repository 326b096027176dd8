"""The Redis store's retention (issue 35): export, erase and trim a session,
and the trim point's check on the store's reads (``check_read``).

Each is one script, so atomic: ``EXPORT`` reads the session's stream, its
bookkeeping, snapshots and actions; ``ERASE`` finds the first live claim
among the open events (``claim_free`` of :data:`~.scripts.RULES`, the one
Lua spelling of ``rules.claim_free``) and the frontier, and removes nothing
unless there is none and the frontier is the one expected; otherwise it
deletes every key of the session (``scripts`` has the layout), its ids from
``P:ids`` and its names from ``P:sessions`` and ``P:open-sessions``. What
it returns becomes the refusal through ``rules.check_unclaimed`` and
``rules.check_expected``. The ``watched`` marker is left to expire: it says
a feed listens, and holds nothing of the session. ``TRIM`` reads the facts
``rules.check_trim`` decides on (a live claim, the reducer's snapshot, the
frontier, the first open event), decides by the Lua spelling of
``rules.trim_point`` and removes the stream entries at or below the point,
their bookkeeping and their ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .. import rules
from ..base import ArchivedSnapshot, Erased, OperatorAction, SessionArchive, StoredEvent, Trimmed
from . import codec
from .conn import errors
from .scripts import RULES

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection

__all__ = ["ERASE", "EXPORT", "FIRST", "TRIM", "TRIM_RULES", "RedisRetention"]

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


#: KEYS: log. Returns the first stored index, or false.
FIRST: Final = r"""
local e = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #e == 0 then return false end
return tonumber(string.sub(e[1][1], 1, -3))
"""

#: :data:`~.scripts.RULES` and ``rules.trim_point`` in Lua, which ``TRIM`` decides by.
TRIM_RULES: Final = (
    RULES
    + r"""
-- rules.trim_point
local function trim_point(snapshot, index)
  return math.max(0, math.min(snapshot, index - 1))
end
"""
)

#: KEYS: log, meta, open, head, snap, ids, failures, journal. ARGV: now, reducer. Returns
#: ``{'claimed', index, holder, attempts, expiry}`` or ``{'facts',
#: snapshot index|false, frontier, first open|false, first|false, removed}``.
TRIM: Final = (
    TRIM_RULES
    + r"""
local now = tonumber(ARGV[1])
local front = tonumber(redis.call('HGET', KEYS[4], 'n') or '0')
local first_open = false
for _, idx in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local m = cjson.decode(redis.call('HGET', KEYS[2], idx))
  if not first_open then first_open = tonumber(idx) end
  if m.h and not claim_free(m, now) then
    return {'claimed', tonumber(idx), m.h, m.a or 0, m.x}
  end
end
local head = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local first = false
if #head > 0 then first = tonumber(string.sub(head[1][1], 1, -3)) end
local snap = redis.call('HGET', KEYS[5], ARGV[2])
if not snap then return {'facts', false, front, first_open, first, 0} end
local at = tonumber(string.match(snap, '^(%d+):'))
local point = trim_point(at, front)
if (first_open and first_open <= point) or point == 0 then
  return {'facts', at, front, first_open, first, 0}
end
local entries = redis.call('XRANGE', KEYS[1], '-', point .. '-0')
if #entries == 0 then return {'facts', at, front, first_open, first, 0} end
local sids, idxs, ids = {}, {}, {}
for i, e in ipairs(entries) do
  sids[i] = e[1]
  idxs[i] = string.sub(e[1], 1, -3)
  ids[i] = cjson.decode(e[2][2])[1]
end
for i = 1, #entries, 1000 do
  local j = math.min(i + 999, #entries)
  redis.call('XDEL', KEYS[1], unpack(sids, i, j))
  redis.call('HDEL', KEYS[2], unpack(idxs, i, j))
  redis.call('HDEL', KEYS[6], unpack(ids, i, j))
  redis.call('HDEL', KEYS[7], unpack(idxs, i, j))
  redis.call('HDEL', KEYS[8], unpack(idxs, i, j))
end
local rest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
redis.call('HSET', KEYS[4], 'first', cjson.decode(rest[1][2][2])[4], 'trimmed', point)
return {'facts', at, front, first_open, first, #entries}
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

    async def trim(self, session_id: str, reducer: str) -> Trimmed:
        """See :meth:`Retention.trim`: one script. Cancellation: removed
        entirely or not at all."""
        keys = self._keys
        now = self._clock.now_ms()
        suffixes = ("log", "meta", "open", "head", "snap")
        with errors("trim"):
            answer = await self._conn.run(
                TRIM,
                [
                    *(keys.key(session_id, s) for s in suffixes),
                    keys.global_key("ids"),
                    keys.key(session_id, "failures"),
                    keys.key(session_id, "journal"),
                ],
                [now, reducer],
            )
        if codec.text(answer[0]) == "claimed":
            index, holder, attempts, expires = answer[1:]
            held = rules.HeldClaim(int(index), codec.text(holder), int(attempts), int(expires))
            rules.check_unclaimed(session_id, held)
        at, front, first_open, first, removed = answer[1:]
        point = rules.check_trim(
            session_id,
            reducer,
            None if at is None else int(at),
            int(front),
            None if first_open is None else int(first_open),
        )
        through = point if first is None else max(point, int(first) - 1)
        return Trimmed(session_id, reducer, through, int(removed), now)

    async def check_read(
        self, session_id: str, after: int, through: int | None, rows: list[StoredEvent]
    ) -> None:
        """``rules.check_read`` over a read's rows, with the session's first
        index read when it must be. Inside the caller's ``errors``."""
        first = rows[0].index if rows else None
        if rules.needs_first_index(after, through, bool(rows)):
            found = await self._conn.run(FIRST, [self._keys.key(session_id, "log")], [])
            first = None if found is None else int(found)
        rules.check_read(session_id, after, through, first)
