"""The Redis store's Lua scripts: each multi-key step of a store operation, atomic.

Redis runs a script to completion before any other command, so each script is
a transaction: it reads, decides and writes with nothing in between, and a
client that is cancelled or loses its connection either ran it whole or not at
all. The scripts follow the seed's ``store-postgres.ts`` statements (as
``sql`` does); ``codec`` turns what they return into records, and the
store's modules apply ``rules`` to those. The rules a script decides by itself are Lua
functions of :data:`RULES`, each spelled once.

Key layout (``P`` is the store's key prefix; ``S`` a session key; a
per-session key ends in a suffix without a colon, so ``P:S:suffix`` never
collides across sessions):

* ``P:S:log``: the session's Redis Stream. FeedEntry id ``<index>-0`` (so
  ``XRANGE`` reads by index), one field ``r``: the immutable row as JSON,
  ``[id, type, payload, created_at_ms, cause, lane, settled, trace_context,
  version]``.
* ``P:S:meta``: hash, index -> the mutable bookkeeping of an unsettled event
  as a JSON object (``a`` attempts, ``f`` failures, ``h`` holder, ``x`` claim
  expiry, ``fc``/``lc`` first/last claimed, ``lf``/``la`` last failure time
  and attempt, ``e`` error, ``d`` dead-lettered at, ``p`` processed at,
  ``pb`` processed by attempt, ``r`` returned ids as JSON text, ``l`` lane,
  ``nb`` not before; ``ck``/``cl`` concurrency key and limit; ``t``/``k`` a
  debounced event's type and key, ``db`` the index of the event whose append
  skipped it; ``tk``/``tl``/``tp`` throttle key, limit and period, ``pr``
  priority: issue 33).
  Settled events have none: they are processed at creation.
* ``P:S:open``: sorted set of the unprocessed indexes (dead letters
  included: they stall their lane), scored by index. Lane readiness is
  computed from it: the oldest open event of a lane is the ready one.
* ``P:S:head``: hash ``n`` (the frontier), ``first``/``last`` (created at of
  the first and latest event), ``dead`` (how many open events are dead),
  ``trimmed`` (the trim point, once trimmed: ``retention``).
* ``P:S:snap``: hash, reducer -> ``"<index>:<updated_at>:<state json>"``.
* ``P:S:presence``: hash, ``participant NUL field`` ->
  ``"<at>:<seen>:<expires_at>:<value json>"``; the key itself expires (real
  time) a minute after its last write outlives every row, so abandoned
  sessions vanish. Row expiry runs on the store's clock.
* ``P:S:failures``: hash, index -> the event's failed attempts (issue 36),
  the latest ``rules.MAX_FAILED_ATTEMPTS``, oldest first: a JSON array of
  JSON texts, each ``[attempt, error, failed_at, holder, claimed_at]``.
  Written by ``FAIL_WRITE`` only, read by inspection only.
* ``P:S:actions``: list of the operator actions recorded on the session's
  events, oldest first, each ``[action, index, by, reason, at]`` as JSON.
* ``P:S:journal``: hash, index -> the durable handlers' journaled steps of
  the event at that index, in the order written, as a JSON array of
  ``[name, attempt, at, result]`` (``result``: the step's JSON text).
* ``P:S:watched``: a marker with a TTL that live feeds refresh; writes to a
  session publish a wake-up on ``P:S:notify`` only while it exists.
* ``P:ids``: hash, event id -> ``"<index>:<session key>"`` (ids are unique
  store-wide). ``P:sessions``: sorted set of session keys (score 0, so
  ``ZRANGE BYLEX`` pages them by prefix). ``P:open-sessions``: the same for
  the sessions that have open events (the sweep's index, bounded by the work
  pending). ``P:pending:watched`` and the ``P:pending`` channel:
  cross-process wake-ups of drains.
* ``P:flow:K``: sorted set of the live claims of concurrency key ``K``
  across sessions (``rules.flow``), members ``<meta key>#<index>`` scored by
  the claim's expiry: a claim adds its row, a renewal moves its score, a
  completion or failure removes it, and a claim prunes the lapsed ones
  first (so a crashed holder's slot frees at its expiry).
* ``P:throttle:K``: sorted set of the attempt starts of throttle ``K``,
  members ``<meta key>#<index>#<attempt>`` scored by when each stops
  counting (the start plus the period); a claim prunes the expired ones.

Numbers pass through Lua as doubles; every number the scripts store (epoch
milliseconds, counters) is an integer below 10^14, which Lua and cjson
print exactly.
"""

from __future__ import annotations

from .. import rules

__all__ = [
    "ACTION_WRITE",
    "APPEND",
    "BATCH",
    "BATCHED",
    "CAS_ROUNDS",
    "CLAIM",
    "COMPLETE",
    "DEAD_LETTERS",
    "FAIL_READ",
    "FAIL_WRITE",
    "FIND",
    "HGET",
    "HGETALL",
    "HMGET",
    "JOURNAL_WRITE",
    "LIST",
    "LRANGE",
    "PRESENCE_READ",
    "PRESENCE_SET",
    "PUT_SNAPSHOT",
    "READ",
    "READ_EVENTS",
    "READ_STATES",
    "RECORD_ACTIONS",
    "RELEASE_MARK",
    "RENEW",
    "RETRY_CANDIDATES",
    "RULES",
    "SET_PX",
    "SUMMARIES",
    "SWEEP",
    "SWEEP_PAGE",
]

#: The seed's rules (``a2trio.stores.rules``) in Lua, one function each over
#: an event's decoded meta (the tables the scripts already hold: no extra
#: read), the backoff's numbers from ``rules``. Prepended to every script that
#: decides an event's fate; no script spells a rule itself
#: (``tests/test_redis_rules.py``). ``ready`` is the event's lane readiness,
#: which the scripts compute from the open set's order (``lane_ready``)
#: rather than store.
RULES = (
    "local RETRY_FIRST_MS, RETRY_MAX_DOUBLINGS, RETRY_CAP_MS = "
    f"{rules.RETRY_FIRST_MS}, {rules.RETRY_MAX_DOUBLINGS}, {rules.RETRY_CAP_MS}\n"
    + r"""
-- rules.alive
local function alive(m)
  return not m.p and not m.d
end

-- rules.claim_free: a claim expiring exactly now is free
local function claim_free(m, now)
  return not m.x or m.x <= now
end

-- rules.ripe: a not-before of exactly now is ripe
local function ripe(m, now)
  return not m.nb or m.nb <= now
end

-- rules.debounces: m is settled by a debounced append of type and key
local function debounces(m, type, key, now)
  return m.t == type and m.k == key and alive(m) and claim_free(m, now)
end

-- rules.claimable
local function claimable(m, ready, now)
  return alive(m) and ready and claim_free(m, now) and ripe(m, now)
end

-- rules.held
local function held(m, ready, now)
  return alive(m) and ready and not claim_free(m, now)
end

-- rules.busy_until, one event at a time: the earliest live claim's expiry so far
local function busy_until(earliest, m, ready, now)
  if held(m, ready, now) and (not earliest or m.x < earliest) then return m.x end
  return earliest
end

-- rules.retry_backoff_ms
local function retry_backoff_ms(f)
  if f <= 0 then return 0 end
  return math.min(RETRY_FIRST_MS * 2 ^ math.min(f - 1, RETRY_MAX_DOUBLINGS), RETRY_CAP_MS)
end

-- rules.due: a backoff passing exactly now is due
local function due(m, now)
  local f = m.f or 0
  return f == 0 or (m.lf or 0) + retry_backoff_ms(f) <= now
end

-- rules.sweepable
local function sweepable(m, ready, now)
  return claimable(m, ready, now) and due(m, now)
end

-- rules.next_in_lane and rules.ready_at_insert: an open event heads its lane
-- when no open event before it (dead or alive) has its lane; seen, the set of
-- those lanes, takes its lane.
local function lane_ready(seen, m)
  if not m.l then return true end
  if seen[m.l] then return false end
  seen[m.l] = true
  return true
end

-- rules.check_cause: the cause's attempt is its parent's latest, the parent not dead
local function cause_current(m, attempt)
  return (m.a or 0) == attempt and not m.d
end

-- rules.holds_claim
local function holds_claim(m, attempt)
  return alive(m) and m.a == attempt and m.h ~= nil
end

-- rules.wake_verdict, over the wake mark `m.w`
local function wake_verdict(m, types)
  if not alive(m) or m.h then return 'stale' end
  for _, t in ipairs(types) do
    for _, w in ipairs(m.w) do
      if t == w then return 'wake' end
    end
  end
  return 'keep'
end

-- rules.renew_verdict
local function renew_verdict(m, attempt, holder, now)
  local count = m.a or 0
  if count == attempt and alive(m) and m.h == holder and not claim_free(m, now) then
    return 'renewed'
  end
  if count > attempt then return 'superseded' end
  return 'lost'
end

-- rules.has_room: no key (no limit), or fewer live slots than the limit
local function has_room(limit, live)
  return not limit or live < limit
end

-- rules.claims_at_insert: claimable (ripe), and no concurrency or throttle key
local function claims_at_insert(m, ready, now)
  return ready and not m.ck and not m.tk and ripe(m, now)
end

-- The live slots of a row's key (rules.live_slot over its set): the lapsed
-- ones pruned (a claim expiring exactly now is free), then counted.
local function live_slots(flow, m, now)
  local set = flow .. m.ck
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  return redis.call('ZCARD', set)
end

-- The live starts of a row's throttle (rules.live_start over its set): the
-- expired ones pruned (a start expiring exactly now counts no more), then
-- counted.
local function live_starts(throttle, m, now)
  local set = throttle .. m.tk
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  return redis.call('ZCARD', set)
end

-- rules.drained: of the open events, only dead letters are left
local function drained(open, dead)
  return open == dead
end
"""
)

# Shared helpers, prepended (after the rules) to the scripts that take the
# session keys as KEYS[1..4] = log, meta, open, head.
_PRELUDE = (
    RULES
    + r"""
local LOG, META, OPEN, HEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local function frontier()
  return tonumber(redis.call('HGET', HEAD, 'n') or '0')
end

-- The session's marked rows (issue 34) are HEAD's `w`, a JSON array of
-- indexes: an append without it reads no row. `wake_marked` plays
-- rules.wake_verdict over them for the events just written, whose stream
-- entries are `entries` (array-like: the type second).
local function wake_marked(entries)
  local raw = redis.call('HGET', HEAD, 'w')
  if not raw then return end
  local types = {}
  for i, e in ipairs(entries) do types[i] = cjson.decode(e)[2] end
  local kept = {}
  for _, idx in ipairs(cjson.decode(raw)) do
    local mraw = redis.call('HGET', META, idx)
    local m = mraw and cjson.decode(mraw)
    if m and m.w then
      local verdict = wake_verdict(m, types)
      if verdict == 'keep' then
        kept[#kept + 1] = idx
      else
        m.w = nil
        if verdict == 'wake' then m.nb = nil end
        redis.call('HSET', META, idx, cjson.encode(m))
      end
    end
  end
  if #kept > 0 then
    redis.call('HSET', HEAD, 'w', cjson.encode(kept))
  else
    redis.call('HDEL', HEAD, 'w')
  end
end

local function entry_of(log, idx)
  local e = redis.call('XRANGE', log, idx .. '-0', idx .. '-0')
  return e[1][2][2]
end

-- HMGET in slices: unpack() of thousands of arguments overflows Lua's stack.
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local slice = {}
    for j = i, math.min(i + 999, #fields) do slice[#slice + 1] = fields[j] end
    local got = redis.call('HMGET', key, unpack(slice))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end

-- The open events in index order, {index, meta, lane_ready}, and the set of
-- their lanes.
local function open_rows()
  local out, seen = {}, {}
  local idxs = redis.call('ZRANGE', OPEN, 0, -1)
  if #idxs == 0 then return out, seen end
  local raws = hmget(META, idxs)
  for i, idx in ipairs(idxs) do
    local m = cjson.decode(raws[i])
    out[#out + 1] = {tonumber(idx), m, lane_ready(seen, m)}
  end
  return out, seen
end

-- rules.debounces over the open events: each one that a debounced event of
-- type and key at idx settles is skipped by it (processed, debounced by idx).
-- Before the new event is inserted, so it never skips itself.
local function skip_debounced(type, key, idx, now)
  for _, r in ipairs(open_rows()) do
    if debounces(r[2], type, key, now) then
      local m = r[2]
      m.p, m.db, m.h, m.x = now, idx, nil, nil
      redis.call('HSET', META, r[1], cjson.encode(m))
      redis.call('ZREM', OPEN, r[1])
    end
  end
end

-- A stored id's location "<index>:<session>", split.
local function locate(loc)
  local colon = string.find(loc, ':', 1, true)
  return tonumber(string.sub(loc, 1, colon - 1)), string.sub(loc, colon + 1)
end

-- For each stored id among ids: id, session, index, and (same session only)
-- entry and meta.
local function stored_rows(ids_key, sid, ids, out)
  for _, id in ipairs(ids) do
    local loc = redis.call('HGET', ids_key, id)
    if loc then
      local idx, where = locate(loc)
      out[#out + 1] = id
      out[#out + 1] = where
      out[#out + 1] = idx
      if where == sid then
        out[#out + 1] = entry_of(LOG, idx)
        out[#out + 1] = redis.call('HGET', META, idx) or false
      else
        out[#out + 1] = false
        out[#out + 1] = false
      end
    end
  end
  return out
end

-- Append one row at idx (the caller maintains the head).
local function insert(ids_key, sid, idx, id, entry, lane, settled, key, limit, tkey, tlimit,
                      tperiod, priority)
  redis.call('XADD', LOG, idx .. '-0', 'r', entry)
  redis.call('HSET', ids_key, id, idx .. ':' .. sid)
  if settled then return nil end
  local m = {}
  if lane ~= '' then m.l = string.sub(lane, 2) end
  if key ~= '' then m.ck, m.cl = key, tonumber(limit) end
  if tkey ~= '' then m.tk, m.tl, m.tp = tkey, tonumber(tlimit), tonumber(tperiod) end
  if priority ~= '' then m.pr = tonumber(priority) end
  redis.call('ZADD', OPEN, idx, idx)
  return m
end

local function advance_head(sid, sessions_key, front, n, now)
  if n == 0 then return end
  if front == 0 then
    redis.call('HSET', HEAD, 'first', now)
    redis.call('ZADD', sessions_key, 0, sid)
  end
  redis.call('HSET', HEAD, 'n', front + n, 'last', now)
end

-- Keep the session in the sweep's index while it has open events.
local function index_open(open_sessions, sid)
  if redis.call('ZCARD', OPEN) > 0 then
    redis.call('ZADD', open_sessions, 0, sid)
  else
    redis.call('ZREM', open_sessions, sid)
  end
end

local function wake(watched, channel, message, pending_watched, pending_channel, sid, unsettled)
  if redis.call('EXISTS', watched) == 1 then
    redis.call('PUBLISH', channel, message)
  end
  if unsettled and redis.call('EXISTS', pending_watched) == 1 then
    redis.call('PUBLISH', pending_channel, message .. ' ' .. sid)
  end
end
"""
)

#: store-postgres.ts ``append``. KEYS: log, meta, open, head, ids, sessions,
#: watched, pending-watched, open-sessions. ARGV: session, now, origin, holder ('' for
#: none), claim expiry, notify channel, pending channel, n events, m supplied
#: ids, expected index ('' for none), the m ids, then per event: id, entry,
#: lane ('' or '=' .. lane), settled ('1'/'0'), cause index ('' for none),
#: cause attempt, concurrency key ('' for none), concurrency limit, delay ms
#: ('' for none), debounce key ('' or '=' .. key), type, throttle key ('' for
#: none), throttle limit, throttle period in ms, priority ('' for none). A debounced event
#: first settles the open events it debounces (``rules.debounces``) as
#: skipped by it: lane readiness follows the open set, so their lanes move on
#: by themselves.
#:
#: Returns ``{'pending', 0|1}`` (empty batch), ``{'replay', pending, others,
#: stored rows...}`` (``stored_rows``), ``{'missing', index}`` /
#: ``{'superseded', position}`` (the fence), ``{'stale', frontier}`` (not at
#: the expected index), or ``{'ok', base, had_pending, others_claimable,
#: {claimed indexes}}``.
APPEND = (
    _PRELUDE
    + r"""
local sid, now, origin, holder = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local n, m = tonumber(ARGV[8]), tonumber(ARGV[9])
local pending = redis.call('ZCARD', OPEN) > 0 and 1 or 0
if n == 0 then return {'pending', pending} end

local function others()
  if holder == '' then return 0, nil end
  local found = 0
  local rows, lanes = open_rows()
  for _, r in ipairs(rows) do
    if claimable(r[2], r[3], now) then found = 1 end
  end
  return found, lanes
end

local supplied = {}
for i = 1, m do supplied[i] = ARGV[10 + i] end
local replay = stored_rows(KEYS[5], sid, supplied, {})
if #replay > 0 then
  local found = others()
  local out = {'replay', pending, found}
  for _, v in ipairs(replay) do out[#out + 1] = v end
  return out
end

local at = 11 + m
local front = frontier()
for k = 0, n - 1 do
  local b = at + k * 15
  if ARGV[b + 4] ~= '' then
    local cidx = tonumber(ARGV[b + 4])
    if cidx < 1 or cidx > front then return {'missing', cidx} end
    local raw = redis.call('HGET', META, cidx)
    local pm = raw and cjson.decode(raw) or {}
    if not cause_current(pm, tonumber(ARGV[b + 5])) then return {'superseded', k + 1} end
  end
end
if ARGV[10] ~= '' and tonumber(ARGV[10]) ~= front then return {'stale', front} end

local found, lanes = others()
local claimed = {}
local unsettled = false
for k = 0, n - 1 do
  local b = at + k * 15
  local idx = front + k + 1
  local lane = ARGV[b + 2]
  local settled = ARGV[b + 3] == '1'
  if ARGV[b + 9] ~= '' and not settled then
    skip_debounced(ARGV[b + 10], string.sub(ARGV[b + 9], 2), idx, now)
  end
  local mm = insert(
    KEYS[5], sid, idx, ARGV[b], ARGV[b + 1], lane, settled, ARGV[b + 6], ARGV[b + 7],
    ARGV[b + 11], ARGV[b + 12], ARGV[b + 13], ARGV[b + 14])
  if mm then
    unsettled = true
    if ARGV[b + 8] ~= '' then mm.nb = now + tonumber(ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then mm.t, mm.k = ARGV[b + 10], string.sub(ARGV[b + 9], 2) end
    if lanes then
      -- Claimed as it is written: a claim in the same transaction.
      if claims_at_insert(mm, lane_ready(lanes, mm), now) then
        mm.a, mm.fc, mm.lc, mm.h, mm.x = 1, now, now, holder, tonumber(ARGV[5])
        claimed[#claimed + 1] = idx
      end
    end
    redis.call('HSET', META, idx, cjson.encode(mm))
  end
end
if redis.call('HEXISTS', HEAD, 'w') == 1 then
  local entries = {}
  for k = 0, n - 1 do entries[k + 1] = ARGV[at + k * 15 + 1] end
  wake_marked(entries)
end
advance_head(sid, KEYS[6], front, n, ARGV[2])
if unsettled then index_open(KEYS[9], sid) end
wake(KEYS[7], ARGV[6], origin, KEYS[8], ARGV[7], sid, unsettled)
return {'ok', front, pending, found, claimed}
"""
)

#: ``find_event``. KEYS: log, meta, open, head, ids. ARGV: session, event id.
#: Returns ``stored_rows`` of the id (empty when it is not stored).
FIND = (
    _PRELUDE
    + r"""
return stored_rows(KEYS[5], ARGV[1], {ARGV[2]}, {})
"""
)

# Rows after an index: {index, entry, meta|false, ...}, at most `count`.
_RANGE = r"""
local function read_range(log, meta, after, through, count)
  local args = {'XRANGE', log, (after + 1) .. '-0', through}
  if count then args[#args + 1] = 'COUNT'; args[#args + 1] = count end
  local entries = redis.call(unpack(args))
  local out = {}
  if #entries == 0 then return out end
  local idxs = {}
  for i, e in ipairs(entries) do
    idxs[i] = string.sub(e[1], 1, -3)
  end
  local metas = {}
  for i = 1, #idxs, 1000 do
    local slice = {}
    for j = i, math.min(i + 999, #idxs) do slice[#slice + 1] = idxs[j] end
    local got = redis.call('HMGET', meta, unpack(slice))
    for j = 1, #got do metas[#metas + 1] = got[j] end
  end
  for i, e in ipairs(entries) do
    out[#out + 1] = tonumber(idxs[i])
    out[#out + 1] = e[2][2]
    out[#out + 1] = metas[i] or false
  end
  return out
end
"""

#: ``read``. KEYS: log, meta, watched. ARGV: after index, through ('+' or an
#: index), watched-marker ttl in ms ('0': leave it). Returns the rows.
READ = (
    _RANGE
    + r"""
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('SET', KEYS[3], '1', 'PX', ttl) end
return read_range(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], nil)
"""
)

#: Inspection ``read_events``. KEYS: log, meta, head. ARGV: after, through
#: ('' for the frontier), limit. Returns ``{frontier-bound, {rows}}``.
READ_EVENTS = (
    _RANGE
    + r"""
local front = tonumber(redis.call('HGET', KEYS[3], 'n') or '0')
local through = front
if ARGV[2] ~= '' then through = math.min(tonumber(ARGV[2]), front) end
local rows = {}
if through > tonumber(ARGV[1]) and tonumber(ARGV[3]) > 0 then
  rows = read_range(KEYS[1], KEYS[2], tonumber(ARGV[1]), through .. '-0', tonumber(ARGV[3]))
end
return {through, rows}
"""
)

#: ``read_states``. KEYS: (snap, log, meta) per session. ARGV: reducer.
#: Returns per session: the snapshot text or false, and the rows after it.
READ_STATES = (
    _RANGE
    + r"""
local out = {}
for s = 0, #KEYS / 3 - 1 do
  local snap = redis.call('HGET', KEYS[s * 3 + 1], ARGV[1])
  local after = 0
  if snap then after = tonumber(string.match(snap, '^(%d+):')) end
  out[#out + 1] = snap or false
  out[#out + 1] = read_range(KEYS[s * 3 + 2], KEYS[s * 3 + 3], after, '+', nil)
end
return out
"""
)

#: store-postgres.ts ``claimAvailable``, with ``rules.flow_select``: a
#: keyed row takes the next slot of its concurrency key's set (``P:flow:K``)
#: and of its throttle's (``P:throttle:K``) and is claimed when both fit.
#: KEYS: log, meta, open, head. ARGV: now, holder, expiry, limit (-1: none),
#: the flow sets' prefix, the throttle sets' prefix, excluded indexes...
#: Returns ``{'claimed', {waiting keys}, {throttled keys}, index, entry,
#: meta, ...}``, ``{'busy', retry_at, {waiting keys}, {throttled keys}}`` or
#: ``{'settled'}``.
CLAIM = (
    _PRELUDE
    + r"""
local now, holder, expires = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local limit, flow, throttle = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local excluded = {}
for i = 7, #ARGV do excluded[tonumber(ARGV[i])] = true end
local waiting, throttled, live, started, rank_c, rank_t = {}, {}, {}, {}, {}, {}
local out = {'claimed', {}, {}}
local busy = nil
-- The candidates in rules.claim_order: higher priority first, then by index.
local candidates = {}
for _, r in ipairs(open_rows()) do
  local idx, m, ready = r[1], r[2], r[3]
  busy = busy_until(busy, m, ready, now)
  if claimable(m, ready, now) and not excluded[idx] then candidates[#candidates + 1] = r end
end
table.sort(candidates, function(x, y)
  local px, py = x[2].pr or 0, y[2].pr or 0
  if px ~= py then return px > py end
  return x[1] < y[1]
end)
for _, r in ipairs(candidates) do
  local idx, m = r[1], r[2]
  do
    local fits = true
    if m.ck then
      if not live[m.ck] then live[m.ck], rank_c[m.ck] = live_slots(flow, m, now), 0 end
      rank_c[m.ck] = rank_c[m.ck] + 1
      if not has_room(m.cl, live[m.ck] + rank_c[m.ck] - 1) then
        waiting[m.ck], fits = true, false
      end
    end
    if m.tk then
      if not started[m.tk] then started[m.tk], rank_t[m.tk] = live_starts(throttle, m, now), 0 end
      rank_t[m.tk] = rank_t[m.tk] + 1
      if not has_room(m.tl, started[m.tk] + rank_t[m.tk] - 1) then
        throttled[m.tk], fits = true, false
      end
    end
    if fits and (limit < 0 or (#out - 3) / 3 < limit) then
      m.a = (m.a or 0) + 1
      if not m.fc then m.fc = now end
      m.lc, m.h, m.x = now, holder, expires
      local raw = cjson.encode(m)
      redis.call('HSET', META, idx, raw)
      if m.ck then redis.call('ZADD', flow .. m.ck, expires, META .. '#' .. idx) end
      if m.tk then
        redis.call('ZADD', throttle .. m.tk, now + m.tp, META .. '#' .. idx .. '#' .. m.a)
      end
      out[#out + 1] = idx
      out[#out + 1] = entry_of(LOG, idx)
      out[#out + 1] = raw
    end
  end
end
local function sorted_keys(set)
  local keys = {}
  for key in pairs(set) do keys[#keys + 1] = key end
  table.sort(keys)
  return keys
end
local function earliest(prefix, keys)
  for _, key in ipairs(keys) do
    local first = redis.call('ZRANGE', prefix .. key, 0, 0, 'WITHSCORES')
    local at = tonumber(first[2])
    if at and (not busy or at < busy) then busy = at end
  end
end
out[2], out[3] = sorted_keys(waiting), sorted_keys(throttled)
if #out > 3 then return out end
earliest(flow, out[2])
earliest(throttle, out[3])
if busy then return {'busy', busy, out[2], out[3]} end
return {'settled'}
"""
)

#: store-postgres.ts ``renewClaims``. KEYS: log, meta, open, head. ARGV: now,
#: holder, expiry, the flow sets' prefix, then (index, attempt) pairs.
#: Returns ``{{renewed}, {superseded}}``.
RENEW = (
    _PRELUDE
    + r"""
local now, holder, expires = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local flow = ARGV[4]
local front = frontier()
local renewed, superseded = {}, {}
for i = 5, #ARGV, 2 do
  local idx, attempt = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if idx >= 1 and idx <= front then
    local raw = redis.call('HGET', META, idx)
    local m = raw and cjson.decode(raw) or {p = 0}
    local verdict = renew_verdict(m, attempt, holder, now)
    if verdict == 'renewed' then
      m.x = expires
      redis.call('HSET', META, idx, cjson.encode(m))
      if m.ck then redis.call('ZADD', flow .. m.ck, 'XX', expires, META .. '#' .. idx) end
      renewed[#renewed + 1] = idx
    elseif verdict == 'superseded' then
      superseded[#superseded + 1] = idx
    end
  end
end
return {renewed, superseded}
"""
)

#: store-postgres.ts ``completeAttempt``. KEYS: log, meta, open, head, ids,
#: sessions, watched, pending-watched, open-sessions. ARGV: session, index, attempt, now,
#: origin, returned ids (JSON text), notify channel, pending channel, n, the
#: flow sets' prefix, then per event: id, entry, lane, settled, concurrency
#: key, concurrency limit, throttle key, throttle limit, throttle period,
#: priority, delay ms ('' for none), debounce key ('' or '=' .. key), type.
#: A debounced returned event settles the open events it debounces as
#: ``APPEND``'s does, after the trigger settled (never one of them).
#:
#: Returns ``{'missing'}``, ``{'superseded'}``, ``{'duplicate'}``,
#: ``{'replay', processed_by_attempt, returned ids, stored rows...}`` or
#: ``{'ok', base, drained}``.
COMPLETE = (
    _PRELUDE
    + r"""
local sid, idx, attempt, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = tonumber(ARGV[9])
local front = frontier()
if idx < 1 or idx > front then return {'missing'} end
local raw = redis.call('HGET', META, idx)
-- A settled event was processed by no attempt: nothing to complete.
if not raw then return {'superseded'} end
local m = cjson.decode(raw)
local ids = {}
for k = 0, n - 1 do ids[k + 1] = ARGV[11 + k * 13] end
if m.p then
  local out = {'replay', m.pb or false, m.r or false}
  return stored_rows(KEYS[5], sid, ids, out)
end
if not holds_claim(m, attempt) then return {'superseded'} end
for _, id in ipairs(ids) do
  if redis.call('HEXISTS', KEYS[5], id) == 1 then return {'duplicate'} end
end
-- The trigger settles first: a debounced returned event never skips it.
m.p, m.pb, m.r, m.h, m.x = now, attempt, ARGV[6], nil, nil
redis.call('HSET', META, idx, cjson.encode(m))
if m.ck then redis.call('ZREM', ARGV[10] .. m.ck, META .. '#' .. idx) end
redis.call('ZREM', OPEN, idx)
local unsettled = false
for k = 0, n - 1 do
  local b = 11 + k * 13
  local at = front + k + 1
  local settled = ARGV[b + 3] == '1'
  if ARGV[b + 11] ~= '' and not settled then
    skip_debounced(ARGV[b + 12], string.sub(ARGV[b + 11], 2), at, now)
  end
  local mm = insert(
    KEYS[5], sid, at, ARGV[b], ARGV[b + 1], ARGV[b + 2], settled,
    ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8], ARGV[b + 9])
  if mm then
    unsettled = true
    if ARGV[b + 10] ~= '' then mm.nb = now + tonumber(ARGV[b + 10]) end
    if ARGV[b + 11] ~= '' then mm.t, mm.k = ARGV[b + 12], string.sub(ARGV[b + 11], 2) end
    redis.call('HSET', META, at, cjson.encode(mm))
  end
end
if n > 0 and redis.call('HEXISTS', HEAD, 'w') == 1 then
  local entries = {}
  for k = 0, n - 1 do entries[k + 1] = ARGV[11 + k * 13 + 1] end
  wake_marked(entries)
end
index_open(KEYS[9], sid)
advance_head(sid, KEYS[6], front, n, ARGV[4])
if n > 0 then wake(KEYS[7], ARGV[7], ARGV[5], KEYS[8], ARGV[8], sid, unsettled) end
local dead = tonumber(redis.call('HGET', HEAD, 'dead') or '0')
return {'ok', front, drained(redis.call('ZCARD', OPEN), dead) and 1 or 0}
"""
)

#: ``failAttempt``, first half: the row the verdict reads. KEYS: log, meta,
#: open, head. ARGV: index. Returns ``{frontier, meta|false}``.
FAIL_READ = (
    _PRELUDE
    + r"""
return {frontier(), redis.call('HGET', META, ARGV[1]) or false}
"""
)

#: ``failAttempt``, second half: write the verdict if the row is as read
#: (also ``release_attempt``'s write, which never dead-letters), and with a
#: failed attempt, append it to the event's history (issue 36), keeping the
#: latest ``rules.MAX_FAILED_ATTEMPTS``. KEYS: meta, open, head, failures,
#: and for a keyed row its flow set (the claim's slot freed). ARGV: index,
#: meta as read, new meta, dead ('1' when this failure dead-letters), and a
#: failure's attempt as JSON (kept as text: Lua never reads its numbers;
#: none for a release). Returns 1, or 0 if the row moved.
FAIL_WRITE = (
    f"local MAX_FAILED_ATTEMPTS = {rules.MAX_FAILED_ATTEMPTS}\n"
    + r"""
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[3], 'dead', 1) end
if KEYS[5] then redis.call('ZREM', KEYS[5], KEYS[1] .. '#' .. ARGV[1]) end
if ARGV[5] then
  local kept = redis.call('HGET', KEYS[4], ARGV[1])
  local history = kept and cjson.decode(kept) or {}
  history[#history + 1] = ARGV[5]
  while #history > MAX_FAILED_ATTEMPTS do table.remove(history, 1) end
  redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(history))
end
return 1
"""
)

#: ``release_attempt`` with a wake mark (issue 34): FAIL_WRITE's
#: compare-and-set, then rules.wakes over the types of the events after the
#: seen-through index (their stream entries), and the mark stored with the
#: row and listed in HEAD's `w`, or none and the not-before `now`. KEYS: log,
#: meta, open, head, and for a keyed row its flow set. ARGV: index, meta as
#: read, new meta (claim cleared, not-before set), seen through ('' for
#: none), wake types (JSON array), now. Returns ``{1, not_before}``, or
#: ``{0}`` if the row moved.
RELEASE_MARK = (
    _PRELUDE
    + r"""
if redis.call('HGET', META, ARGV[1]) ~= ARGV[2] then return {0} end
local idx = tonumber(ARGV[1])
local m = cjson.decode(ARGV[3])
local types = cjson.decode(ARGV[5])
local woke = false
if ARGV[4] ~= '' then
  for _, e in ipairs(redis.call('XRANGE', LOG, (tonumber(ARGV[4]) + 1) .. '-0', '+')) do
    local t = cjson.decode(e[2][2])[2]
    for _, w in ipairs(types) do
      if t == w then woke = true end
    end
  end
end
if woke then
  m.nb = tonumber(ARGV[6])
else
  m.w = types
  local raw = redis.call('HGET', HEAD, 'w')
  local marked = raw and cjson.decode(raw) or {}
  local listed = false
  for _, i in ipairs(marked) do
    if i == idx then listed = true end
  end
  if not listed then marked[#marked + 1] = idx end
  redis.call('HSET', HEAD, 'w', cjson.encode(marked))
end
redis.call('HSET', META, idx, cjson.encode(m))
if KEYS[5] then redis.call('ZREM', KEYS[5], META .. '#' .. idx) end
return {1, m.nb}
"""
)

#: store-postgres.ts ``putSnapshots``: never backwards. KEYS: snap. ARGV:
#: reducer, index, now, state JSON. Returns 1 if written.
PUT_SNAPSHOT = r"""
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and tonumber(string.match(current, '^(%d+):')) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3] .. ':' .. ARGV[4])
return 1
"""

#: The durable handlers' journal (issue 34): a step written once, fenced by
#: ``holds_claim`` (only the attempt that holds the event's claim writes).
#: KEYS: log, meta, open, head, journal. ARGV: index, attempt, name, result
#: (JSON text), now. Returns ``{'missing'}``, ``{'superseded'}`` or ``{'ok',
#: entry}`` (the name's first entry as JSON, this one or the one stored
#: before).
JOURNAL_WRITE = (
    _PRELUDE
    + r"""
local idx, attempt = tonumber(ARGV[1]), tonumber(ARGV[2])
if idx < 1 or idx > frontier() then return {'missing'} end
local raw = redis.call('HGET', META, ARGV[1])
if not raw or not holds_claim(cjson.decode(raw), attempt) then return {'superseded'} end
local raw = redis.call('HGET', KEYS[5], ARGV[1])
local entries = {}
if raw then entries = cjson.decode(raw) end
for _, entry in ipairs(entries) do
  if entry[1] == ARGV[3] then return {'ok', cjson.encode(entry)} end
end
local entry = {ARGV[3], attempt, tonumber(ARGV[5]), ARGV[4]}
entries[#entries + 1] = entry
redis.call('HSET', KEYS[5], ARGV[1], cjson.encode(entries))
return {'ok', cjson.encode(entry)}
"""
)

#: Inspection counters. KEYS: (head, meta, open) per session. Returns per
#: session ``{n, first, updated, pending, failed, attempts, failures}``.
SUMMARIES = r"""
local out = {}
for s = 0, #KEYS / 3 - 1 do
  local head = redis.call('HMGET', KEYS[s * 3 + 1], 'n', 'first', 'last', 'dead', 'trimmed')
  local updated = tonumber(head[3] or '0')
  local failed, attempts, failures = 0, 0, 0
  for _, raw in ipairs(redis.call('HVALS', KEYS[s * 3 + 2])) do
    local m = cjson.decode(raw)
    attempts = attempts + (m.a or 0)
    failures = failures + (m.f or 0)
    if m.d then failed = failed + 1 end
    for _, name in ipairs({'fc', 'lc', 'lf', 'p', 'd'}) do
      local t = m[name]
      if t and t > updated then updated = t end
    end
  end
  local pending = redis.call('ZCARD', KEYS[s * 3 + 3]) - tonumber(head[4] or '0')
  local stored = tonumber(head[1] or '0') - tonumber(head[5] or '0')
  out[#out + 1] = {stored, tonumber(head[2] or '0'), updated, pending, failed,
    attempts, failures}
end
return out
"""

#: store-postgres.ts ``presence.set``: field-wise LWW on the sender's ``at``
#: (ties go to the incoming write), published as one patch. KEYS: presence.
#: ARGV: now, expires_at, seen, at, key ttl ms, origin, channel, participant,
#: participant JSON, then (field, field JSON, value JSON or '' to clear)
#: triples. Returns the applied fields.
PRESENCE_SET = r"""
local at = tonumber(ARGV[4])
local applied, parts = {}, {}
for i = 10, #ARGV, 3 do
  local key = ARGV[8] .. '\0' .. ARGV[i]
  local current = redis.call('HGET', KEYS[1], key)
  if not current or tonumber(string.match(current, '^(-?%d+):')) <= at then
    local value = ARGV[i + 2]
    if value == '' then
      redis.call('HDEL', KEYS[1], key)
      value = 'null'
    else
      redis.call('HSET', KEYS[1], key, ARGV[4] .. ':' .. ARGV[3] .. ':' .. ARGV[2] .. ':' .. value)
    end
    applied[#applied + 1] = ARGV[i]
    parts[#parts + 1] = ARGV[i + 1] .. ':' .. value
  end
end
if #applied == 0 then return applied end
local ttl = tonumber(ARGV[5])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
redis.call('PUBLISH', ARGV[7], '{"o":"' .. ARGV[6] .. '","p":' .. ARGV[9] .. ',"s":' .. ARGV[3]
  .. ',"a":' .. ARGV[4] .. ',"v":{' .. table.concat(parts, ',') .. '}}')
return applied
"""

#: ``presence.read``: live rows, expired ones deleted. KEYS: presence. ARGV:
#: now. Returns ``{key, value, ...}``.
PRESENCE_READ = r"""
local now = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local _, _, expires = string.match(all[i + 1], '^(-?%d+):(-?%d+):(-?%d+):')
  if tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"""

#: ``claimable_sessions``: for each session, whether a claim would take an
#: event now (``rules.sweepable``, its key with room: ``rules.has_room``).
#: KEYS: (open, meta) per session. ARGV: now, the flow sets' prefix, the
#: throttle sets' prefix. Returns 0/1 per session.
SWEEP = (
    RULES
    + r"""
local now, flow, throttle = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local out = {}
for s = 0, #KEYS / 2 - 1 do
  local idxs = redis.call('ZRANGE', KEYS[s * 2 + 1], 0, -1)
  local found = 0
  local seen = {}
  for i = 1, #idxs, 1000 do
    local slice = {}
    for j = i, math.min(i + 999, #idxs) do slice[#slice + 1] = idxs[j] end
    local raws = redis.call('HMGET', KEYS[s * 2 + 2], unpack(slice))
    for j = 1, #raws do
      local m = cjson.decode(raws[j])
      if sweepable(m, lane_ready(seen, m), now)
          and (not m.ck or has_room(m.cl, live_slots(flow, m, now)))
          and (not m.tk or has_room(m.tl, live_starts(throttle, m, now))) then
        found = 1
        break
      end
    end
    if found == 1 then break end
  end
  out[#out + 1] = found
end
return out
"""
)


# Operator actions (an a2trio addition; issue 18). The verdict is
# `rules.check_action` over the row `FAIL_READ` returns; these scripts
# write it back (compare-and-set), record it and wake other processes.

#: Dead letters of a page of sessions. KEYS: (log, meta, open, head) per
#: session. Returns per session ``{index, entry, meta, ...}`` of its dead
#: rows (none read where the head counts no dead letter).
DEAD_LETTERS = r"""
local out = {}
for s = 0, #KEYS / 4 - 1 do
  local log, meta, open, head = KEYS[s * 4 + 1], KEYS[s * 4 + 2], KEYS[s * 4 + 3], KEYS[s * 4 + 4]
  local rows = {}
  if tonumber(redis.call('HGET', head, 'dead') or '0') > 0 then
    local idxs = redis.call('ZRANGE', open, 0, -1)
    for i = 1, #idxs, 1000 do
      local slice = {}
      for j = i, math.min(i + 999, #idxs) do slice[#slice + 1] = idxs[j] end
      local raws = redis.call('HMGET', meta, unpack(slice))
      for j = 1, #raws do
        if cjson.decode(raws[j]).d then
          local e = redis.call('XRANGE', log, slice[j] .. '-0', slice[j] .. '-0')
          rows[#rows + 1] = slice[j]
          rows[#rows + 1] = e[1][2][2]
          rows[#rows + 1] = raws[j]
        end
      end
    end
  end
  out[#out + 1] = rows
end
return out
"""

#: A redrive or skip, if the row is as read. KEYS: meta, open, head,
#: open-sessions, actions, pending-watched. ARGV: index, meta as read, new
#: meta, '1' if it was dead, '1' for a skip (the event leaves the open set,
#: handing its lane on), the action JSON, session, pending channel, origin.
#: Returns 1, or 0 if the row moved.
ACTION_WRITE = r"""
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[3], 'dead', -1) end
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('ZREM', KEYS[4], ARGV[7]) end
end
redis.call('RPUSH', KEYS[5], ARGV[6])
if redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('PUBLISH', ARGV[8], ARGV[9] .. ' ' .. ARGV[7])
end
return 1
"""

#: ``retry_now``'s candidates. KEYS: log, meta, open, head. Returns
#: ``{index, claim expiry or false, ...}`` of the live, lane-ready events.
RETRY_CANDIDATES = (
    _PRELUDE
    + r"""
local out = {}
for _, row in ipairs(open_rows()) do
  if alive(row[2]) and row[3] then
    out[#out + 1] = row[1]
    out[#out + 1] = row[2].x or false
  end
end
return out
"""
)

#: Record actions and wake other processes' drains. KEYS: actions,
#: pending-watched. ARGV: pending channel, message, then the actions' JSON.
RECORD_ACTIONS = r"""
for i = 3, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PUBLISH', ARGV[1], ARGV[2]) end
return 1
"""

# One command each, as scripts: every call takes the store's one runner (``conn``).
LIST = "return redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'BYLEX', 'LIMIT', 0, ARGV[3])"
LRANGE = "return redis.call('LRANGE', KEYS[1], 0, -1)"
HGETALL = "return redis.call('HGETALL', KEYS[1])"
HMGET = "return redis.call('HMGET', KEYS[1], unpack(ARGV))"
HGET = "return redis.call('HGET', KEYS[1], ARGV[1])"
SET_PX = "return redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])"

#: The scripts a batch runs (``batch``: the drain's and the feeds' calls),
#: each by its number here.
BATCHED: dict[str, int] = {
    source: number
    for number, source in enumerate(
        (APPEND, COMPLETE, CLAIM, RENEW, READ, READ_STATES, PUT_SNAPSHOT), 1
    )
}

#: Several calls of the ``BATCHED`` scripts in one: each script is a function
#: of its own ``KEYS`` and ``ARGV``, run in turn under ``pcall`` so a call's
#: error is its own answer (what it wrote before the error stays, as it would
#: alone). KEYS: each call's keys in turn. ARGV: per call, its script's
#: number, its key count and argument count, then its arguments. Returns per
#: call ``1, reply`` or ``0, error message``.
BATCH = (
    "".join(
        f"local function script{number}(KEYS, ARGV)\n{source}\nend\n"
        for source, number in BATCHED.items()
    )
    + "local scripts = {"
    + ", ".join(f"script{number}" for number in BATCHED.values())
    + "}\n"
    + r"""
local out, k, a = {}, 0, 1
while a <= #ARGV do
  local script, nk, na = scripts[tonumber(ARGV[a])], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do args[j] = ARGV[a + 2 + j] end
  k, a = k + nk, a + 3 + na
  local ok, reply = pcall(script, keys, args)
  if ok then
    -- A nil would end the reply's array here.
    if reply == nil then reply = false end
    out[#out + 1] = 1
    out[#out + 1] = reply
  else
    -- A failed redis.call raises a table with its error.
    if type(reply) == 'table' then reply = reply.err end
    out[#out + 1] = 0
    out[#out + 1] = tostring(reply)
  end
end
return out
"""
)

#: Compare-and-set rounds of a failure before giving up (each loses only to
#: a concurrent write of the same event's row).
CAS_ROUNDS = 16
#: Sessions the sweep checks per script.
SWEEP_PAGE = 100
