"""The Postgres schema and every statement, ported from the seed's ``store-postgres.ts``.

Tables are the seed's, column for column, so a database written by the
TypeScript framework reads here. Indexes are the seed's but two that no
statement here uses (``a2_events_unprocessed``, ``a2_events_dispatch_ready``):
claims and completions rewrite the row, and every index costs an entry per
row version (dropping them measured +50 % single-event throughput in
``bench/vs_queues.py``). A database the seed created keeps them and works the
same. Statements keep the seed's semantics but
not always its shape: where the seed made several round trips inside a
transaction, these fold the work into one statement (CTEs) so a store
transaction is one pipelined round trip. Each statement names the seed
function it ports.

Each rule of ``a2trio.stores.rules`` that a statement decides by is one
fragment here (``claim_free``, ``claimable``, ``due``, ``holds_claim``, ...),
spelled once and its numbers read from ``rules``; every statement that needs
the rule interpolates it (``tests/test_pg_rules.py`` holds them to that).

Parameters are sent as text and cast in SQL (``$1::text``), so the statements
carry their own types. Timestamps are always parameters from the store's
clock, never ``now()``.
"""

from __future__ import annotations

from .. import rules
from .conn import Statement

__all__ = [
    "EVENT_COLUMNS",
    "SCHEMA_LOCK_KEY",
    "alive",
    "cause_fenced",
    "claim_free",
    "claim_live",
    "claimable",
    "claims_at_insert",
    "debounces",
    "dispatch_ready",
    "drained",
    "due",
    "hands_on",
    "has_pending",
    "has_room",
    "held",
    "holds_claim",
    "live_slot",
    "live_start",
    "next_in_lane",
    "ready_at_insert",
    "renews",
    "retry_backoff_ms",
    "ripe",
    "schema_sql",
    "sweepable",
]

#: The key of the transaction-scoped advisory lock every process takes before
#: DDL: the seed's expression verbatim (``initializeSchema`` in
#: store-postgres.ts), so TypeScript and Python processes sharing a database
#: serialize their schema creation on one lock (issue 23).
SCHEMA_LOCK_KEY = "hashtext('a2:postgres:schema')"

_SCHEMA = """
create table if not exists a2_events (
  session_id   text    not null,
  idx          bigint  not null,
  event_type   text    not null,
  payload      jsonb   not null,
  event_id     text    not null,
  created_at   bigint  not null,
  cause        jsonb,
  lane         text,
  lane_ready   boolean not null default false,
  processed_at bigint,
  processed_by_attempt integer,
  returned_event_ids jsonb,
  first_claimed_at bigint,
  last_claimed_at bigint,
  attempt_count integer not null default 0,
  failure_count integer not null default 0,
  last_failed_at bigint,
  last_failed_attempt integer,
  last_error   text,
  failed_at    bigint,
  claim_holder text,
  claim_expires_at bigint,
  primary key (session_id, idx)
);

create unique index if not exists a2_events_event_id on a2_events (event_id);
create index if not exists a2_events_lane_pending
  on a2_events (session_id, lane, idx) where processed_at is null;
create index if not exists a2_events_claim_expiry
  on a2_events (session_id, claim_expires_at)
  where lane_ready and processed_at is null and failed_at is null;

create table if not exists a2_snapshots (
  session_id   text   not null,
  reducer_name text   not null,
  up_to_index  bigint not null,
  state        jsonb  not null,
  updated_at   bigint not null,
  primary key (session_id, reducer_name)
);

create table if not exists a2_presence (
  ns          text   not null,
  participant text   not null,
  field       text   not null,
  value       jsonb  not null,
  seen        bigint not null,
  at          bigint not null,
  expires_at  bigint not null,
  primary key (ns, participant, field)
);

-- a2trio additions (issue 18), beside the seed's tables, which stay as they
-- are: operator actions, and the dead letters across sessions. The partial
-- index holds only dead rows, so it costs the writes nothing else.
create table if not exists a2_operator_actions (
  id          bigserial primary key,
  session_id  text   not null,
  idx         bigint not null,
  action      text   not null,
  actor       text   not null,
  reason      text   not null,
  at          bigint not null
);
create index if not exists a2_operator_actions_event
  on a2_operator_actions (session_id, idx);
create index if not exists a2_events_dead_letters
  on a2_events (session_id, idx) where failed_at is not null;

-- Each event's trace context (issue 18): the appender's, so a handler in
-- another process continues its trace. Nullable, so the seed's inserts,
-- which do not name it, still work. Checked in the catalog first: `alter
-- table ... if not exists` takes an access-exclusive lock on the table even
-- when the column is there, and every process runs this DDL when it starts.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'trace_context' and not attisdropped) then
    alter table a2_events add column trace_context text;
  end if;
end $$;

-- Each event's not-before instant (issue 33: a per-handler backoff's
-- retry-at, a released attempt's wake time): no claim takes the row before
-- it. Nullable (none), guarded as `trace_context` is.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'not_before' and not attisdropped) then
    alter table a2_events add column not_before bigint;
  end if;
end $$;

-- Each event's payload schema version (issue 35, upcasting): null for
-- events written before (and by the seed), which read as version 1.
-- Checked in the catalog first, as trace_context is.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'version' and not attisdropped) then
    alter table a2_events add column version integer;
  end if;
end $$;

-- Concurrency keys (issue 33): each event's key and limit, resolved at
-- append, and the index that counts a key's live claims across sessions
-- (only alive rows with a key enter it). Guarded as `trace_context` is.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'concurrency_key' and not attisdropped) then
    alter table a2_events add column concurrency_key text,
                          add column concurrency_limit integer;
  end if;
end $$;
create index if not exists a2_events_concurrency
  on a2_events (concurrency_key, claim_expires_at)
  where concurrency_key is not null and processed_at is null and failed_at is null;

-- Each event's failed attempts (issue 36): the error of every failure, the
-- latest rules.MAX_FAILED_ATTEMPTS per event, written by `FAIL` only, so a
-- run without failures never touches it.
create table if not exists a2_failed_attempts (
  session_id  text   not null,
  idx         bigint not null,
  attempt     int    not null,
  error       text   not null,
  failed_at   bigint not null,
  holder      text   not null,
  claimed_at  bigint,
  primary key (session_id, idx, attempt)
);
-- A debounced event's key, and the index of the later event whose append
-- skipped it (issue 33). Nullable, guarded as `trace_context` is.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'debounce_key' and not attisdropped) then
    alter table a2_events add column debounce_key text, add column debounced_by bigint;
  end if;
end $$;
-- The journal of durable handlers (issue 34): each event's completed steps
-- by name, written once by the attempt that holds the claim; `seq` keeps the
-- order they were written in. Results are JSON text, kept verbatim.
create table if not exists a2_journal (
  session_id  text    not null,
  idx         bigint  not null,
  name        text    not null,
  result      text    not null,
  attempt     integer not null,
  at          bigint  not null,
  seq         bigserial,
  primary key (session_id, idx, name)
);

-- Throttles (issue 33): each event's throttle key, limit and period, and the
-- attempt starts of each key, as the instants they stop counting.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'throttle_key' and not attisdropped) then
    alter table a2_events add column throttle_key text,
                          add column throttle_limit integer,
                          add column throttle_period_ms bigint;
  end if;
end $$;
create table if not exists a2_flow_starts (
  throttle_key text   not null,
  expires_at   bigint not null
);
create index if not exists a2_flow_starts_key on a2_flow_starts (throttle_key, expires_at);

-- Each event's priority (issue 33, `priority=`): a claim takes higher first.
-- Nullable (none), guarded as `trace_context` is.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'priority' and not attisdropped) then
    alter table a2_events add column priority integer;
  end if;
end $$;
-- The claim's probe for keyed rows (`CLAIM`'s `keyed`): only alive rows with
-- a flow option enter it, so a session without any finds none at once
-- instead of filtering every claimable row of its own.
create index if not exists a2_events_flow_pending
  on a2_events (session_id)
  where (concurrency_key is not null or throttle_key is not null or priority is not null)
    and lane_ready and processed_at is null and failed_at is null;

-- A suspended durable wait's wake mark (issue 34): the event types whose
-- append makes the row claimable at once. The partial index holds only the
-- marked rows, so an append's `woken` probe of it finds none at once.
do $$
begin
  if not exists (select 1 from pg_attribute
                  where attrelid = 'a2_events'::regclass
                    and attname = 'wake_on' and not attisdropped) then
    alter table a2_events add column wake_on text[];
  end if;
end $$;
create index if not exists a2_events_waiting
  on a2_events (session_id) where wake_on is not null;
"""

# Notifications are transactional: delivered at commit, never for a rollback.
# The channel carries the table's schema so stores in different schemas of one
# database do not hear each other. Event inserts name the writing store's id
# (``a2.origin``, set by ``LOCK``; empty for other writers) and the session,
# ``"<origin> <session>"`` (duplicates in one transaction collapse); presence
# changes carry the applied field and the writing store's id. Either way a
# store skips its own notifications exactly: it handed those rows over locally.
_TRIGGERS = """
create or replace function a2_notify_events() returns trigger
language plpgsql as $$
begin
  perform pg_notify(
    tg_table_schema || '.a2_events',
    coalesce(current_setting('a2.origin', true), '') || ' ' || new.session_id);
  return null;
end $$;

-- Per row, not per statement: a statement trigger with a transition table
-- costs ~0.8 ms per insert here, a row trigger ~0.01 ms. Postgres folds the
-- same (channel, payload) within a transaction into one notification.
create or replace trigger a2_events_notify
  after insert on a2_events
  for each row execute function a2_notify_events();

create or replace function a2_notify_presence() returns trigger
language plpgsql as $$
declare
  row_ a2_presence;
  note text;
begin
  if tg_op = 'DELETE' then row_ := old; else row_ := new; end if;
  note := json_build_object(
    'o', current_setting('a2.origin', true),
    'ns', row_.ns, 'p', row_.participant, 'f', row_.field,
    'v', case when tg_op = 'DELETE' then null else row_.value end,
    's', coalesce(nullif(current_setting('a2.seen', true), '')::bigint, row_.seen),
    'a', coalesce(nullif(current_setting('a2.at', true), '')::bigint, row_.at)
  )::text;
  -- NOTIFY payloads stop at 8000 bytes; a larger value reaches other
  -- processes' subscribers on their next presence read instead.
  if octet_length(note) < 7900 then
    perform pg_notify(tg_table_schema || '.a2_presence', note);
  end if;
  return null;
end $$;

create or replace trigger a2_presence_notify
  after insert or update or delete on a2_presence
  for each row execute function a2_notify_presence();
"""


def schema_sql(*, schema: str | None, triggers: bool) -> bytes:
    """The DDL as one simple-query script, under the schema advisory lock.

    ``if not exists`` does not serialize concurrent catalog writes, so every
    process takes the same transaction-scoped lock first (the seed's
    ``initializeSchema``, with its key).
    """
    parts = ["begin;", f"select pg_advisory_xact_lock({SCHEMA_LOCK_KEY});"]
    if schema is not None:
        parts.append(f'create schema if not exists "{schema}";')
        parts.append(f'set local search_path to "{schema}";')
    parts.append(_SCHEMA)
    if triggers:
        parts.append(_TRIGGERS)
    parts.append("commit;")
    return "\n".join(parts).encode()


#: The columns of a stored event, in the order ``postgres._stored`` reads them.
EVENT_COLUMNS = (
    "event_id, event_type, payload, idx, session_id, created_at, cause, lane,"
    " processed_at, processed_by_attempt, returned_event_ids, first_claimed_at,"
    " last_claimed_at, attempt_count, failure_count, last_failed_at,"
    " last_failed_attempt, last_error, failed_at, claim_holder, claim_expires_at,"
    " trace_context, not_before, version, concurrency_key, concurrency_limit,"
    " debounce_key, debounced_by, throttle_key, throttle_limit, throttle_period_ms, priority"
)


def _cols(alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in EVENT_COLUMNS.split(","))


def _among(column: str, indexes: str) -> str:
    """``column = any(indexes)``, bounded by the array's least and greatest index.

    A generic plan made before the table has statistics guesses one row per
    session and may keep ``= any(...)`` as a filter over the whole session
    (the btree path that keeps index order): O(session length) per call. Plain
    range bounds always become index conditions, so the lookup stays a few
    index probes however long the session grows.
    """
    bound = f"(select {{}}(i) from unnest({indexes}) as i)"
    return (
        f"{column} = any({indexes})"
        f" and {column} >= {bound.format('min')} and {column} <= {bound.format('max')}"
    )


# The rules of `a2trio.stores.rules`, one SQL fragment each: every statement
# below that decides by a rule spells it through its fragment, so each rule's
# SQL is written once and its numbers are `rules`' own. `row` is a table
# alias; the other arguments are SQL expressions (parameters, columns). The
# clauses keep the form the partial indexes are proven usable by (the planner
# matches an index predicate clause by clause): `dispatch_ready` is
# `a2_events_claim_expiry`'s predicate, and the lane rules read
# `a2_events_lane_pending`'s `processed_at is null`.


# rules.alive
def alive(row: str) -> str:
    return f"{row}.processed_at is null and {row}.failed_at is null"


# rules.claim_free
def claim_free(row: str, now: str) -> str:
    return f"({row}.claim_expires_at is null or {row}.claim_expires_at <= {now})"


# not rules.claim_free: a live claim (a null expiry compares as not true).
def claim_live(row: str, now: str) -> str:
    return f"{row}.claim_expires_at > {now}"


# rules.claimable and rules.held, their common part: alive and first in its lane.
def dispatch_ready(row: str) -> str:
    return f"{row}.lane_ready and {alive(row)}"


# rules.ripe
def ripe(row: str, now: str) -> str:
    return f"({row}.not_before is null or {row}.not_before <= {now})"


# rules.debounces: `row` is settled by a debounced append of `type` and `key`.
def debounces(row: str, type: str, key: str, now: str) -> str:
    return (
        f"{row}.event_type = {type} and {row}.debounce_key = {key}"
        f" and {alive(row)} and {claim_free(row, now)}"
    )


# rules.claimable
def claimable(row: str, now: str) -> str:
    return f"{dispatch_ready(row)} and {claim_free(row, now)} and {ripe(row, now)}"


# rules.held
def held(row: str, now: str) -> str:
    return f"{dispatch_ready(row)} and {claim_live(row, now)}"


# rules.retry_backoff_ms, for a positive `failures`.
def retry_backoff_ms(failures: str) -> str:
    first, doublings, cap = rules.RETRY_FIRST_MS, rules.RETRY_MAX_DOUBLINGS, rules.RETRY_CAP_MS
    return f"least({first} << least({failures} - 1, {doublings}), {cap})"


# rules.due
def due(row: str, now: str) -> str:
    backoff = retry_backoff_ms(f"{row}.failure_count")
    return f"({row}.failure_count = 0 or {row}.last_failed_at + {backoff} <= {now})"


# rules.sweepable
def sweepable(row: str, now: str) -> str:
    return f"{claimable(row, now)} and {due(row, now)}"


# rules.live_slot, over the rows of one concurrency key (`a2_events_concurrency`'s
# predicate, clause by clause).
def live_slot(row: str, now: str) -> str:
    return f"{alive(row)} and {claim_live(row, now)}"


# rules.live_start, over the starts `start` of one throttle (`a2_flow_starts`).
def live_start(start: str, now: str) -> str:
    return f"{start}.expires_at > {now}"


# rules.has_room for the row `row`, for both its keys: no concurrency key, or
# fewer live slots of it than its limit, and no throttle, or fewer live
# starts (rules.live_start) than its limit.
def has_room(row: str, now: str) -> str:
    return (
        f"({row}.concurrency_key is null or (select count(*) from a2_events h"
        f" where h.concurrency_key = {row}.concurrency_key and {live_slot('h', now)})"
        f" < {row}.concurrency_limit)"
        f" and ({row}.throttle_key is null or (select count(*) from a2_flow_starts s"
        f" where s.throttle_key = {row}.throttle_key and {live_start('s', now)})"
        f" < {row}.throttle_limit)"
    )


# rules.claims_at_insert, for the row `new` of the CTE `batch` (its lane
# readiness `ready`) after `TRY_KEYS` (the keys it locked are
# `a2.insert_keys`): claimable (ripe: no delay still to wait, as `rules.ripe`
# of `now + delay`), no throttle, and no concurrency key or (`rules.flow`'s
# docstring) the key locked, and room under its limit for every alive row of
# the key (`a2_events_concurrency`'s predicate) and every unsettled row of the
# batch with it.
def claims_at_insert(new: str, ready: str) -> str:
    fits = (
        f"{new}.flow_key in (select jsonb_array_elements_text("
        f"coalesce(nullif(current_setting('a2.insert_keys', true), ''), '[]')::jsonb))"
        f" and (select count(*) from batch f where f.flow_key = {new}.flow_key and not f.settled)"
        f" + (select count(*) from a2_events h where h.concurrency_key = {new}.flow_key"
        f" and {alive('h')}) <= {new}.flow_limit"
    )
    return (
        f"{ready} and not {new}.settled and ({new}.flow_key is null or ({fits}))"
        f" and {new}.throttle_key is null and coalesce({new}.delay, 0) <= 0"
    )


# rules.holds_claim
def holds_claim(row: str, attempt: str) -> str:
    return f"{alive(row)} and {row}.attempt_count = {attempt} and {row}.claim_holder is not null"


# rules.renew_verdict, its `renewed`.
def renews(row: str, attempt: str, holder: str, now: str) -> str:
    return (
        f"{row}.attempt_count = {attempt} and {alive(row)}"
        f" and {row}.claim_holder = {holder} and {claim_live(row, now)}"
    )


# rules.check_cause, its SUPERSEDED_ATTEMPT: `parent` is not the cause's attempt's.
def cause_fenced(parent: str, attempt: str) -> str:
    return f"({parent}.attempt_count <> {attempt} or {parent}.failed_at is not null)"


# The `had_pending` of rules.has_pending: the session has an unprocessed row.
def has_pending(session: str) -> str:
    return f"exists(select 1 from a2_events where session_id = {session} and processed_at is null)"


# rules.hands_on
def hands_on(row: str) -> str:
    return f"{row}.lane is not null and {row}.lane_ready"


# The stored rows lane readiness and the hand-off look at: unprocessed rows of
# `lane` (dead letters too: they block it) but those being settled (`unsettled`
# is `l.idx`'s test, e.g. `<> $2::bigint`; None: none is).
def _open_in_lane(session: str, lane: str, unsettled: str | None) -> str:
    rows = f"l.session_id = {session} and l.lane = {lane} and l.processed_at is null"
    return rows if unsettled is None else f"{rows} and l.idx {unsettled}"


# rules.ready_at_insert, for the row `new` of the CTE `batch`: its open lanes
# are the stored rows' and the batch's earlier unsettled rows'.
def ready_at_insert(new: str, session: str, unsettled: str | None = None) -> str:
    stored = _open_in_lane(session, f"{new}.lane", unsettled)
    return (
        f"({new}.lane is null or ("
        f"not exists (select 1 from a2_events l where {stored})"
        f" and not exists (select 1 from batch e"
        f" where e.lane = {new}.lane and e.ord < {new}.ord and not e.settled)))"
    )


# rules.next_in_lane: the index of `lane`'s next head (`unsettled` as above).
def next_in_lane(session: str, lane: str, unsettled: str) -> str:
    return f"(select min(l.idx) from a2_events l where {_open_in_lane(session, lane, unsettled)})"


# rules.drained: no stored row of the session is alive but those being settled
# (`unsettled` is `o.idx`'s test).
def drained(session: str, unsettled: str) -> str:
    return (
        f"not exists (select 1 from a2_events o"
        f" where o.session_id = {session} and {alive('o')} and o.idx {unsettled})"
    )


# rules.wake_verdict over the session's marked rows, for events of `types`
# (a text[] expression) just written: a stale mark (claimed again, settled)
# is dropped, a matching one is dropped with the row's not-before. A
# data-modifying CTE, run whether or not the statement reads it; the probe of
# `a2_events_waiting` finds no row in a session without marks, so `types` is
# never computed there.
def woken(session: str, types: str) -> str:
    stale = "w.claim_holder is not null or w.processed_at is not null or w.failed_at is not null"
    return f"""woken as (
  update a2_events w set
    wake_on = null,
    not_before = case when {stale} then w.not_before end
   where w.session_id = {session} and w.wake_on is not null
     and ({stale} or w.wake_on && {types})
)"""


BEGIN = Statement("begin")
COMMIT = Statement("commit")
# The seed's per-session append lock: `hashtext` keeps it interoperable. Every
# statement that inserts events runs after it, so it also names the writing
# store (``$2``) for the notify trigger.
LOCK = Statement(
    "select pg_advisory_xact_lock(hashtext($1::text)), set_config('a2.origin', $2::text, true)"
)

HAS_PENDING = Statement(f"select {has_pending('$1::text')}")

# Before appends that may claim keyed rows at insert (`rules.flow`): the keys
# of their concurrency-keyed rows ($1) locked, in key order, with the lock
# `LOCK_KEYS` takes, and remembered for the transaction (`a2.insert_keys`, read
# by `APPEND`'s `claims_at_insert`). In its own statement, so that each
# `APPEND`'s snapshot, taken after it, counts every claim of the keys that
# committed. A group commit runs it first, before any session's lock
# (`database.lock_order`): keys, then sessions, then rows, the order
# `LOCK_KEYS` + `CLAIM_KEYED` also follow.
LOCK_INSERT_KEYS = Statement(
    """
select set_config('a2.insert_keys', coalesce(jsonb_agg(k.key order by k.key), '[]')::text, true)
  from (select k.key, pg_advisory_xact_lock(hashtextextended('a2:flow:' || k.key, 0))
          from (select distinct u.key from unnest($1::text[]) as u(key) order by 1) k) k
"""
)

# `LOCK_INSERT_KEYS` for an append in a transaction of its own, after its
# session's lock: a try, which never waits (so it is ordered against no other
# lock); a key another transaction holds is not in `a2.insert_keys`, and its
# rows are left to the drain's claim.
TRY_KEYS = Statement(
    """
select set_config('a2.insert_keys', coalesce(jsonb_agg(k.key order by k.key)
         filter (where pg_try_advisory_xact_lock(hashtextextended('a2:flow:' || k.key, 0))),
         '[]')::text, true)
  from unnest($1::text[]) as k(key)
"""
)


def _append_sql(*, checked: bool) -> str:
    """``APPEND`` (``checked``: supplied ids and causes) or ``APPEND_FRESH``.

    Both lock nothing themselves (the caller's transaction holds the session's
    append lock), compute the index base, whether the session had pending
    work and whether other events are claimable, then insert, each claimable
    row claimed as it is written when a holder is given. Only the checked form
    looks for stored ids and fences causes, and inserts only on a clean verdict.
    """
    now, holder, expiry = ("$5", "$6", "$7") if checked else ("$3", "$4", "$5")
    state = f"""
    {has_pending("$1::text")} as had_pending,
    (select coalesce(max(idx), 0) from a2_events where session_id = $1::text) as base,
    {holder}::text is not null and exists(
      select 1 from a2_events o
       where o.session_id = $1::text and {claimable("o", f"{now}::bigint")})
      as others_claimable"""
    if checked:
        head = f"""
existing as (
  -- The guard is a one-time filter: no ids supplied, no scan at all.
  select * from a2_events where cardinality($3::text[]) > 0 and event_id = any($3::text[])
),
parents as materialized (
  select idx, attempt_count, failed_at from a2_events
   where session_id = $1::text and {_among("idx", "$4::bigint[]")}
   for update
),
verdict as (
  select
    (select count(*) from existing) as n_existing,
    (select min((b.cause->>'index')::bigint) from batch b
      where b.cause is not null and not exists (
        select 1 from parents p where p.idx = (b.cause->>'index')::bigint)) as missing_parent,
    (select min((b.cause->>'index')::bigint) from batch b
       join parents p on p.idx = (b.cause->>'index')::bigint
      where {cause_fenced("p", "(b.cause->>'attempt')::int")})
      as superseded,{state}
),"""
        clean = (
            "\n   where v.n_existing = 0 and v.missing_parent is null and v.superseded is null"
            "\n     and ($8::bigint is null or v.base = $8::bigint)"
        )
        tail = f"""
select v.n_existing, v.missing_parent, v.superseded, v.had_pending, v.base,
       {{claimed}}, v.others_claimable,
       {_cols("e")}
  from verdict v left join existing e on true
 order by e.idx"""
    else:
        head = f"""
verdict as (
  select{state}
),"""
        clean = ""
        tail = """
select v.had_pending, v.base, {claimed}, v.others_claimable from verdict v"""
    cause = ("cause jsonb, ", "cause, ", "r.cause, ") if checked else ("", "", "")
    claimed = (
        "(select coalesce(array_agg(i.idx order by i.idx), '{}')"
        " from inserted i where i.claim_holder is not null)"
    )
    return f"""
with batch as (
  select * from jsonb_to_recordset($2::jsonb)
    as b(ord bigint, id text, type text, payload jsonb, {cause[0]}lane text, settled boolean,
         trace text, version int, flow_key text,
         flow_limit integer, delay bigint, debounce text,
         throttle_key text, throttle_limit integer, throttle_period bigint, priority integer)
),{head}
ready as materialized (
  -- Materialized so each row's readiness (two subqueries) is computed once,
  -- however many columns below use it.
  select b.*, v.base + b.ord as idx, x.lane_ready,
         {holder}::text is not null and {claims_at_insert("b", "x.lane_ready")} as claim
    from batch b, verdict v,
         lateral (select {ready_at_insert("b", "$1::text")} as lane_ready) x{clean}
),
inserted as (
  insert into a2_events
    (session_id, idx, event_type, payload, event_id, created_at, {cause[1]}lane,
     lane_ready, processed_at, attempt_count, first_claimed_at, last_claimed_at,
     claim_holder, claim_expires_at, trace_context, version, concurrency_key,
     concurrency_limit, not_before, debounce_key, throttle_key, throttle_limit,
     throttle_period_ms, priority)
  select $1::text, r.idx, r.type, coalesce(r.payload, 'null'::jsonb), r.id,
         {now}::bigint, {cause[2]}r.lane, r.lane_ready,
         case when r.settled then {now}::bigint end,
         case when r.claim then 1 else 0 end,
         case when r.claim then {now}::bigint end,
         case when r.claim then {now}::bigint end,
         case when r.claim then {holder}::text end,
         case when r.claim then {expiry}::bigint end,
         r.trace, r.version, r.flow_key, r.flow_limit, {now}::bigint + r.delay, r.debounce,
         r.throttle_key, r.throttle_limit, r.throttle_period, r.priority
    from ready r
  returning idx, claim_holder
),
{woken("$1::text", "array(select r.type from ready r)")}{tail.replace("{claimed}", claimed)}
"""


# store-postgres.ts `append`, after the advisory lock: the duplicate check,
# the attempt-currency fence (`for update` on the parents), the index base and
# every insert in one statement. It inserts only when the verdict is clean;
# the first row carries the verdict, every row one already-stored event.
# With a holder ($6), each inserted event that is claimable at once (not
# settled, first in its lane) is inserted claimed by it until $7, attempt 1:
# a claim at insert, so the row is written once instead of twice. `claimed`
# lists those indexes; `others_claimable` says whether the session held
# other events a claim would take now (the caller claims them as usual).
# With an expected index ($8, `Store.append(expected_index=...)`) it inserts
# only if the index base is still that index; the caller reads `base` back
# to tell the conflict.
#   $1 session, $2 batch (jsonb array), $3 supplied ids, $4 cause indexes,
#   $5 now, $6 holder (null: no claim), $7 claim expiry, $8 expected index
#   (null: unconditional)
APPEND = Statement(_append_sql(checked=True))

# `APPEND` for the common batch: no supplied ids and no causes, so there is
# nothing to replay, no duplicate to refuse and no parent to fence; the plan is
# half the size (~0.1 ms less per append in a held-connection loop). Rows:
# one, (had_pending, base, claimed indexes, others_claimable).
#   $1 session, $2 batch (jsonb array), $3 now, $4 holder (null: no claim),
#   $5 claim expiry
APPEND_FRESH = Statement(_append_sql(checked=False))

# A debounced append's skips (issue 33), after `APPEND` in its transaction
# (under the session's append lock, so no lane moves meanwhile): every row
# `rules.debounces` settles for a row the append just wrote ($3 its ids, $2
# its time: a replayed row, written before, skips nothing) is processed by no
# attempt, `debounced_by` the least such new row after it, and a lane head
# among them hands its lane on (the new rows are visible here). The update
# re-checks the rule on a row a concurrent claim changed.
#   $1 session, $2 now, $3 the debounced events' ids
DEBOUNCE = Statement(
    f"""
with fresh as materialized (
  select n.idx, n.event_type, n.debounce_key from a2_events n
   where n.event_id = any($3::text[]) and n.session_id = $1::text
     and n.created_at = $2::bigint and n.debounce_key is not null
),
before as materialized (
  select e.idx, e.lane, e.lane_ready,
         (select f.idx from fresh f
           where f.idx > e.idx and {debounces("e", "f.event_type", "f.debounce_key", "$2::bigint")}
           order by f.idx limit 1) as by
    from a2_events e
   where e.session_id = $1::text and e.processed_at is null
     and e.debounce_key in (select debounce_key from fresh)
),
skipped as (
  update a2_events e set
    processed_at = $2::bigint, debounced_by = b.by, lane_ready = false,
    claim_holder = null, claim_expires_at = null
    from before b
   where b.by is not null and e.session_id = $1::text and e.idx = b.idx
     and {debounces("e", "e.event_type", "e.debounce_key", "$2::bigint")}
  returning e.idx
),
handed_on as (
  update a2_events e set lane_ready = true
   where e.session_id = $1::text and e.idx in (
     select {next_in_lane("$1::text", "b.lane", "not in (select idx from skipped)")}
       from before b where b.idx in (select idx from skipped) and {hands_on("b")})
)
select count(*) from skipped
"""
)

# store-postgres.ts `read`.
READ = Statement(
    f"select {EVENT_COLUMNS} from a2_events"
    " where session_id = $1::text and idx > $2::bigint and idx <= $3::bigint order by idx"
)

# `Store.find_event`: the row stored under an id, in this session only.
#   $1 session, $2 event id
FIND_EVENT = Statement(
    f"select {EVENT_COLUMNS} from a2_events where event_id = $2::text and session_id = $1::text"
)

# Sessions with work a claim would take now (`claimable_sessions`, the sweep):
# the partial index `a2_events_claim_expiry` holds only dispatch-ready rows, so
# the cost is the pending work, never the history. `starts_with` rather than a
# key range: under a linguistic collation a range of keys holding U+001F is not
# the set of keys with the prefix. A failed row waits out
# `rules.retry_backoff_ms` (`due`).
#   $1 key prefix, $2 now, $3 limit
CLAIMABLE_SESSIONS = Statement(
    f"""
select distinct session_id from a2_events e
 where {sweepable("e", "$2::bigint")}
   and starts_with(session_id, $1::text)
   and {has_room("e", "$2::bigint")}
 order by session_id limit $3::bigint"""
)

# The claim of the rows a statement's `eligible` locked ($2 now, $3 holder,
# $4 expires at), as `CLAIM` and `CLAIM_KEYED` write it.
_CLAIM_ELIGIBLE = """claimed as (
  update a2_events claimed set
    attempt_count = claimed.attempt_count + 1,
    first_claimed_at = coalesce(claimed.first_claimed_at, $2::bigint),
    last_claimed_at = $2::bigint,
    claim_holder = $3::text,
    claim_expires_at = $4::bigint
  from eligible
  -- A TID join, whatever plan the statistics suggest; a row updated after
  -- this statement's snapshot is missed and counted as `stale`.
  where claimed.ctid = eligible.tid
  returning claimed.*
),"""

# store-postgres.ts `claimAvailable`: the materialized eligible set locked
# `for update`, claimed in one update; the earliest live foreign claim rides
# along for the busy answer, so the claim is one autocommit statement.
#   $1 session, $2 now, $3 holder, $4 expires at, $5 excluded indexes,
#   $6 the most to claim (null: every eligible event)
CLAIM = Statement(
    f"""
with keyed as materialized (
  -- A keyed row claimable: the claim is `CLAIM_KEYED`'s, under key locks.
  select exists(select 1 from a2_events k
   where k.session_id = $1::text and {claimable("k", "$2::bigint")}
     and (k.concurrency_key is not null or k.throttle_key is not null or k.priority is not null)
     and not (k.idx = any($5::bigint[]))) as found
),
eligible as materialized (
  select event.ctid as tid, event.idx from a2_events event
   where event.session_id = $1::text
     and {claimable("event", "$2::bigint")}
     and not (event.idx = any($5::bigint[]))
     and not (select found from keyed)
   order by event.idx
   limit $6::bigint
   for update of event
),
{_CLAIM_ELIGIBLE}
busy as (
  select min(claim_expires_at) as retry_at from a2_events e
   where session_id = $1::text and {held("e", "$2::bigint")}
)
select busy.retry_at, {_cols("claimed")},
       -- Locked but not claimed: updated by another transaction after this
       -- statement's snapshot (the TID join missed the latest version, see
       -- `FINISH`); the store claims again.
       (select count(*) from eligible) - (select count(*) from claimed) as stale,
       (select found from keyed) as keyed
  from busy left join claimed on true
 order by claimed.idx
"""
)

# The keys of a session's claimable keyed rows, locked in key order (every
# claim of a key serializes here; no other writer takes these locks, so none
# waits on a session lock while holding one), and remembered for the
# transaction (`a2.flow_keys`): `CLAIM_KEYED` counts and claims those keys
# only, so a key that turned up between the two statements waits for the
# next claim instead of being claimed unlocked.
#   $1 session, $2 now, $3 excluded indexes
LOCK_KEYS = Statement(
    f"""
select set_config('a2.flow_keys', jsonb_build_object(
         'c', coalesce(jsonb_agg(k.key order by k.key) filter (where k.kind = 'c'), '[]'),
         't', coalesce(jsonb_agg(k.key order by k.key) filter (where k.kind = 't'), '[]')
       )::text, true)
  from (select k.kind, k.key,
               pg_advisory_xact_lock(hashtextextended(
                 case k.kind when 'c' then 'a2:flow:' else 'a2:throttle:' end || k.key, 0))
          from (select distinct kinds.kind, kinds.key
                  from a2_events e,
                       lateral (values ('c', e.concurrency_key), ('t', e.throttle_key))
                         as kinds(kind, key)
                 where e.session_id = $1::text and {claimable("e", "$2::bigint")}
                   and kinds.key is not null and not (e.idx = any($3::bigint[]))
                 order by 1, 2) k) k
"""
)

# `CLAIM` for a session with keyed rows (`rules.flow_select`), after
# `LOCK_KEYS` in the same transaction: each candidate ranked within each of
# its keys, taken while both ranks fit: the concurrency key's live slots
# (across sessions, `live_slot`) and the throttle's live starts
# (`a2_flow_starts`, `rules.live_start`) leave room. Each claimed throttled
# row records a start; the expired starts of its throttles are deleted. The
# waiting keys and throttles, and when the earliest of them frees, for the
# answer.
#   $1 session, $2 now, $3 holder, $4 expires at, $5 excluded indexes,
#   $6 the most to claim (null: every eligible event)
CLAIM_KEYED = Statement(
    f"""
with locked as (
  select current_setting('a2.flow_keys')::jsonb as k
),
lc as (
  select jsonb_array_elements_text((select k->'c' from locked)) as key
),
lt as (
  select jsonb_array_elements_text((select k->'t' from locked)) as key
),
live as materialized (
  select l.key, (select count(*) from a2_events h
                  where h.concurrency_key = l.key and {live_slot("h", "$2::bigint")}) as n
    from lc l
),
started as materialized (
  select l.key, (select count(*) from a2_flow_starts s
                  where s.throttle_key = l.key and {live_start("s", "$2::bigint")}) as n
    from lt l
),
ranked as materialized (
  select e.ctid as tid, e.idx, e.concurrency_key as ck, e.concurrency_limit as cl,
         e.throttle_key as tk, e.throttle_limit as tl, coalesce(e.priority, 0) as pr,
         row_number() over (
           partition by e.concurrency_key order by coalesce(e.priority, 0) desc, e.idx) as rc,
         row_number() over (
           partition by e.throttle_key order by coalesce(e.priority, 0) desc, e.idx) as rt
    from a2_events e
   where e.session_id = $1::text and {claimable("e", "$2::bigint")}
     and not (e.idx = any($5::bigint[]))
     and (e.concurrency_key is null or e.concurrency_key in (select key from lc))
     and (e.throttle_key is null or e.throttle_key in (select key from lt))
),
fits as materialized (
  select r.*,
         r.ck is null
           or r.rc <= r.cl - coalesce((select n from live where live.key = r.ck), 0) as c_room,
         r.tk is null
           or r.rt <= r.tl - coalesce((select n from started where started.key = r.tk), 0)
           as t_room
    from ranked r
),
eligible as materialized (
  select event.ctid as tid, event.idx from a2_events event
    join fits f on f.tid = event.ctid
   where f.c_room and f.t_room
   order by f.pr desc, event.idx
   limit $6::bigint
   for update of event
),
{_CLAIM_ELIGIBLE}
recorded as (
  insert into a2_flow_starts (throttle_key, expires_at)
  select c.throttle_key, $2::bigint + c.throttle_period_ms from claimed c
   where c.throttle_key is not null
),
pruned as (
  delete from a2_flow_starts s
   where s.throttle_key in (select key from lt) and s.expires_at <= $2::bigint
),
waiting as (
  select coalesce(jsonb_agg(distinct f.ck order by f.ck) filter (where not f.c_room), '[]')
           as keys,
         coalesce(jsonb_agg(distinct f.tk order by f.tk) filter (where not f.t_room), '[]')
           as throttles
    from fits f
),
busy as (
  select least(
    (select min(claim_expires_at) from a2_events e
      where session_id = $1::text and {held("e", "$2::bigint")}),
    (select min(h.claim_expires_at) from a2_events h
      where h.concurrency_key in (select f.ck from fits f where not f.c_room)
        and {live_slot("h", "$2::bigint")}),
    (select min(s.expires_at) from a2_flow_starts s
      where s.throttle_key in (select f.tk from fits f where not f.t_room)
        and {live_start("s", "$2::bigint")})) as retry_at
)
select busy.retry_at, (select keys from waiting), (select throttles from waiting),
       {_cols("claimed")},
       (select count(*) from eligible) - (select count(*) from claimed) as stale
  from busy left join claimed on true
 order by claimed.idx
"""
)

# store-postgres.ts `renewClaims`, with index-bounded lookups (`_among`).
RENEW = Statement(
    f"""
with listed as (
  select idx, attempt from unnest($3::bigint[], $6::int[]) as listed(idx, attempt)
),
renewed as (
  update a2_events event set claim_expires_at = $1::bigint
    from listed
   where event.session_id = $2::text
     and event.idx = listed.idx
     and {_among("event.idx", "$3::bigint[]")}
     and {renews("event", "listed.attempt", "$4::text", "$5::bigint")}
  returning event.idx
)
select event.idx, event.attempt_count,
       exists(select 1 from renewed where renewed.idx = event.idx) as renewed
  from a2_events event
 where event.session_id = $2::text and {_among("event.idx", "$3::bigint[]")}
"""
)

# store-postgres.ts `completeAttempt` in one statement, after the session's
# advisory lock (taken before the parent row here, unlike the seed, so
# completions and appends lock in the same order and cannot deadlock). The
# verdict (missing, replay, superseded, duplicate, completed) is the seed's
# sequence of checks; only `completed` writes: the returned events, the parent
# marked processed, and the lane handed on. One statement cannot see its own
# writes, so the hand-off is computed from the snapshot: the oldest other
# unprocessed event of the parent's lane, else the first returned event of
# that lane (made ready as it is inserted). Rows: the verdict, then the
# existing rows holding the returned ids (for a replay) or the inserted ones.
#   $1 session, $2 parent idx, $3 returned ids, $4 attempt, $5 batch (jsonb),
#   $6 now, $7 cause (jsonb), $8 returned ids (jsonb)
COMPLETE = Statement(
    f"""
with parent as materialized (
  select idx, lane, attempt_count, claim_holder, failed_at, processed_at,
         processed_by_attempt, returned_event_ids
    from a2_events
   where session_id = $1::text and idx = $2::bigint
   for update
),
existing as materialized (
  select * from a2_events where event_id = any($3::text[])
),
verdict as (
  select case
      when not exists (select 1 from parent) then 'missing'
      when exists (select 1 from parent where processed_at is not null) then 'replay'
      when exists (select 1 from parent
                    where not ({holds_claim("parent", "$4::int")})) then 'superseded'
      when exists (select 1 from existing) then 'duplicate'
      else 'completed'
    end as outcome,
    (select processed_by_attempt from parent) as processed_by_attempt,
    (select returned_event_ids from parent) as returned_event_ids,
    (select coalesce(max(idx), 0) from a2_events where session_id = $1::text) as base,
    -- The drain's hint: nothing else unprocessed and alive (a2trio addition).
    {drained("$1::text", "<> $2::bigint")}
      and not exists (select 1 from jsonb_to_recordset($5::jsonb) as n(settled boolean)
                       where not coalesce(n.settled, false)) as drained
),
batch as (
  select * from jsonb_to_recordset($5::jsonb)
    as b(ord bigint, id text, type text, payload jsonb, lane text, settled boolean,
         trace text, version int, flow_key text, flow_limit integer, delay bigint,
         debounce text, throttle_key text, throttle_limit integer, throttle_period bigint,
         priority integer)
),
inserted as (
  insert into a2_events
    (session_id, idx, event_type, payload, event_id, created_at, cause, lane,
     lane_ready, processed_at, trace_context, version, concurrency_key, concurrency_limit,
     not_before, debounce_key, throttle_key, throttle_limit, throttle_period_ms, priority)
  select $1::text, v.base + b.ord, b.type, coalesce(b.payload, 'null'::jsonb), b.id,
         $6::bigint, $7::jsonb, b.lane,
         {ready_at_insert("b", "$1::text", "<> $2::bigint")},
         case when b.settled then $6::bigint end,
         b.trace, b.version, b.flow_key, b.flow_limit, $6::bigint + b.delay, b.debounce,
         b.throttle_key, b.throttle_limit, b.throttle_period, b.priority
    from batch b, verdict v
   where v.outcome = 'completed'
  returning *
),
{woken("$1::text", "array(select i.event_type from inserted i)")},
processed as (
  update a2_events e set
    processed_at = $6::bigint,
    processed_by_attempt = $4::int,
    returned_event_ids = $8::jsonb,
    lane_ready = false,
    claim_holder = null,
    claim_expires_at = null
  from verdict v
  where v.outcome = 'completed' and e.session_id = $1::text and e.idx = $2::bigint
),
handed_on as (
  update a2_events e set lane_ready = true
    from verdict v, parent p
   where v.outcome = 'completed' and p.lane is not null
     and e.session_id = $1::text
     and e.idx = {next_in_lane("$1::text", "p.lane", "<> $2::bigint")}
),
rows_ as (
  select 0 as tag, {EVENT_COLUMNS} from existing
  union all
  select 1 as tag, {EVENT_COLUMNS} from inserted
)
select v.outcome, v.processed_by_attempt, v.returned_event_ids, v.drained, {_cols("r")}
  from verdict v left join rows_ r on true
 order by r.tag, r.idx
"""
)


# `COMPLETE` for completions that return no events, set-based: one statement
# completes many events of one session (group commit hands it every such
# completion it holds for the session, indexes distinct). Each row keeps its
# own fence and verdict exactly as `COMPLETE` computes them; `drained` sees
# every completion of the statement as done.
#   $1 session, $2 idx[], $3 attempt[], $4 now
FINISH = Statement(
    f"""
with req as (
  select * from unnest($2::bigint[], $3::int[]) as r(idx, attempt)
),
parent as materialized (
  select e.ctid as tid, e.idx, e.lane, e.attempt_count, e.claim_holder, e.failed_at,
         e.processed_at, e.processed_by_attempt, e.returned_event_ids
    from a2_events e
   where e.session_id = $1::text and {_among("e.idx", "$2::bigint[]")}
   order by e.idx
   for update
),
verdict as materialized (
  select r.idx, r.attempt, p.tid, p.lane, p.processed_by_attempt, p.returned_event_ids,
    case
      when p.idx is null then 'missing'
      when p.processed_at is not null then 'replay'
      when not ({holds_claim("p", "r.attempt")}) then 'superseded'
      else 'completed'
    end as outcome
    from req r left join parent p on p.idx = r.idx
),
processed as (
  update a2_events e set
    processed_at = $4::bigint,
    processed_by_attempt = v.attempt,
    returned_event_ids = '[]'::jsonb,
    lane_ready = false,
    claim_holder = null,
    claim_expires_at = null
  from verdict v
  -- A TID join (see `CLAIM`), whatever plan the statistics suggest. A row
  -- another transaction updated after this statement's snapshot (a renewal)
  -- is locked by `parent` in its latest version, which this snapshot cannot
  -- see: the join then updates nothing, and the row answers `stale` for the
  -- store to run the completion again (issue 29: it answered "completed" and
  -- left the event claimed, to run again once the claim expired).
  where v.outcome = 'completed' and e.ctid = v.tid
  returning e.idx
),
-- What this statement completed: the lane hand-on and `drained` go by it.
done as (
  select idx from processed
),
next_in_lane as materialized (
  select distinct {next_in_lane("$1::text", "v.lane", "not in (select idx from done)")} as idx
    from verdict v
   where v.idx in (select idx from done) and v.lane is not null
),
handed_on as (
  update a2_events e set lane_ready = true
   where e.session_id = $1::text
     and {_among("e.idx", "array(select idx from next_in_lane)")}
)
select v.idx,
       case when v.outcome = 'completed' and v.idx not in (select idx from done)
            then 'stale' else v.outcome end,
       v.processed_by_attempt, v.returned_event_ids,
       {drained("$1::text", "not in (select idx from done)")}
  from verdict v
 order by v.idx
"""
)


# The append lock for `FINISH`, taken only if one of the events has a lane. A
# completion that returns nothing writes just its own rows (each locked `for
# update`, which fences it against claims, failures and other completions);
# it needs the append lock only to hand a lane on, since an append decides a
# new lane event's readiness from the lane's unprocessed events. So completing
# a lane-less event never waits for the session's appends, nor they for it.
# A lane never changes after insert, so reading it before the lock is safe.
#   $1 session, $2 idx[]
LOCK_IF_LANED = Statement(
    f"""
select pg_advisory_xact_lock(hashtext($1::text))
  from (select 1 from a2_events
         where session_id = $1::text and {_among("idx", "$2::bigint[]")}
           and lane is not null
         limit 1) as laned
"""
)


# store-postgres.ts `failAttempt`, and the not-before of a per-handler backoff
# (issue 33): a recorded failure that does not dead-letter stores `$6 + $7`
# (none when $7 is null), every other recorded failure clears it. With the
# failed attempt it records (issue 36) in the same statement: `recorded`
# writes it from the row as locked (the holder, the claim time) when the
# failure records, and `trimmed` drops what falls past the latest
# `rules.MAX_FAILED_ATTEMPTS` (its snapshot holds the older attempts only, so
# it keeps one fewer of them).
#   $1 session, $2 idx, $3 attempt, $4 error, $5 max failures, $6 now,
#   $7 retry after ms (null: the seed's rule)
FAIL = Statement(
    f"""
with current as materialized (
  select e.* from a2_events e
   where e.session_id = $1::text and e.idx = $2::bigint
   for update of e
), recorded as (
  insert into a2_failed_attempts
    (session_id, idx, attempt, error, failed_at, holder, claimed_at)
  select session_id, idx, $3::int, $4::text, $6::bigint, claim_holder, last_claimed_at
    from current
   where {holds_claim("current", "$3::int")}
), trimmed as (
  delete from a2_failed_attempts f
   where f.session_id = $1::text and f.idx = $2::bigint
     and exists (select 1 from current where {holds_claim("current", "$3::int")})
     and f.attempt <= (select attempt from a2_failed_attempts
                        where session_id = $1::text and idx = $2::bigint
                        order by attempt desc
                        offset {rules.MAX_FAILED_ATTEMPTS - 1} limit 1)
), updated as (
  update a2_events e set
    failure_count = e.failure_count + 1,
    last_error = $4::text,
    last_failed_at = $6::bigint,
    last_failed_attempt = $3::int,
    failed_at = case when e.failure_count + 1 >= $5::int then $6::bigint else e.failed_at end,
    not_before = case when e.failure_count + 1 < $5::int then $6::bigint + $7::bigint end,
    wake_on = null,
    claim_holder = null,
    claim_expires_at = null
  from current
  where e.session_id = $1::text
    and e.idx = $2::bigint
    and {holds_claim("current", "$3::int")}
  returning e.failure_count, e.failed_at, e.not_before
)
select case
  when not exists (select 1 from current) then 'missing'
  when exists (select 1 from updated where failed_at is not null) then 'dead_lettered'
  when exists (select 1 from updated) then 'failed'
  when exists (select 1 from current
                where processed_at is not null or attempt_count <> $3::int) then 'superseded'
  when exists (select 1 from current where failed_at is not null) then 'dead_lettered'
  when exists (select 1 from current
                where claim_holder is null and last_failed_attempt = $3::int) then 'failed'
  else 'superseded'
end as outcome,
coalesce((select failure_count from updated), (select failure_count from current))
  as failure_count,
(select not_before from updated) as retry_at
"""
)

# `Store.release_attempt` (issue 33): the claim given up by the attempt that
# holds it (`rules.release_verdict`), no failure counted, the not-before
# stored with the wake mark (issue 34); or the not-before `$7` and no mark
# when an event of a marked type landed after `$6` already (`rules.wakes`).
#   $1 session, $2 idx, $3 attempt, $4 not before, $5 wake mark (text[],
#   null: none), $6 seen through (null: no check), $7 now
RELEASE = Statement(
    f"""
with current as materialized (
  select e.* from a2_events e
   where e.session_id = $1::text and e.idx = $2::bigint
   for update of e
), landed as materialized (
  select exists(select 1 from a2_events a
                 where $6::bigint is not null and a.session_id = $1::text
                   and a.idx > $6::bigint and a.event_type = any($5::text[])) as woke
), released as (
  update a2_events e set
    not_before = case when l.woke then $7::bigint else $4::bigint end,
    wake_on = case when l.woke then null else $5::text[] end,
    claim_holder = null,
    claim_expires_at = null
  from current, landed l
  where e.session_id = $1::text
    and e.idx = $2::bigint
    and {holds_claim("current", "$3::int")}
  returning e.not_before
)
select case
  when not exists (select 1 from current) then 'missing'
  when exists (select 1 from released) then 'released'
  else 'superseded'
end, (select not_before from released)
"""
)

# The failed attempts of some events of a session (issue 36).
#   $1 session, $2 idx[]
FAILURES = Statement(
    """
select idx, attempt, error, failed_at, holder, claimed_at from a2_failed_attempts
 where session_id = $1::text and idx = any($2::bigint[])
 order by idx, attempt
"""
)

# store-postgres.ts `readStates` (and `readState`, as a batch of one): one
# statement, one MVCC snapshot, each tail bounded by the snapshot it returns.
READ_STATES = Statement(
    f"""
with snapshot as materialized (
  select session_id, up_to_index, state from a2_snapshots
   where session_id = any($1::text[]) and reducer_name = $2::text
)
select 0 as row_order, snapshot.session_id as owner, snapshot.up_to_index, snapshot.state,
       {", ".join(f"null as {c.strip()}" for c in EVENT_COLUMNS.split(","))}
  from snapshot
union all
select 1 as row_order, event.session_id, null, null, {_cols("event")}
  from a2_events event
  left join snapshot on snapshot.session_id = event.session_id
 where event.session_id = any($1::text[])
   and event.idx > coalesce(snapshot.up_to_index, 0)
 order by row_order, owner, idx
"""
)

# store-postgres.ts `putSnapshot`: the guarded upsert.
PUT_SNAPSHOT = Statement(
    """
insert into a2_snapshots (session_id, reducer_name, up_to_index, state, updated_at)
values ($1::text, $2::text, $3::bigint, $4::jsonb, $5::bigint)
on conflict (session_id, reducer_name) do update set
  up_to_index = excluded.up_to_index,
  state = excluded.state,
  updated_at = excluded.updated_at
where excluded.up_to_index > a2_snapshots.up_to_index
"""
)

# The presence trigger reads these to stamp its notification.
PRESENCE_ORIGIN = Statement(
    "select set_config('a2.origin', $1::text, true), set_config('a2.seen', $2::text, true),"
    " set_config('a2.at', $3::text, true)"
)

# store-postgres.ts `presence.set`, every field in one statement. Field-wise
# LWW: a stored row with a strictly newer `at` survives; ties go to the
# incoming write. Returns the fields that applied.
#   $1 ns, $2 participant, $3 values (jsonb object, null = clear), $4 seen,
#   $5 at, $6 expires at
PRESENCE_SET = Statement(
    """
with vals as (
  select key as field, value from jsonb_each($3::jsonb)
),
current as materialized (
  select p.field, p.at from a2_presence p
   where p.ns = $1::text and p.participant = $2::text
     and p.field in (select field from vals)
   for update
),
cleared as (
  delete from a2_presence p using vals v
   where p.ns = $1::text and p.participant = $2::text and p.field = v.field
     and v.value = 'null'::jsonb and p.at <= $5::bigint
),
written as (
  insert into a2_presence (ns, participant, field, value, seen, at, expires_at)
  select $1::text, $2::text, field, value, $4::bigint, $5::bigint, $6::bigint
    from vals where value <> 'null'::jsonb
  on conflict (ns, participant, field) do update set
    value = excluded.value,
    seen = excluded.seen,
    at = excluded.at,
    expires_at = excluded.expires_at
  where a2_presence.at <= excluded.at
  returning field
)
select field from written
union all
select v.field from vals v
 where v.value = 'null'::jsonb
   and not exists (select 1 from current c where c.field = v.field and c.at > $5::bigint)
"""
)

# store-postgres.ts `presence.read`: sweep and read in one statement.
PRESENCE_READ = Statement(
    """
with swept as (
  delete from a2_presence where ns = $1::text and expires_at <= $2::bigint
)
select participant, field, value, seen, at, expires_at from a2_presence
 where ns = $1::text and expires_at > $2::bigint
 order by participant, field
"""
)

# store-postgres.ts `inspect.listSessions`.
LIST_SESSIONS = Statement(
    f"""
select session_id,
       count(*),
       count(*) filter (where {alive("e")}),
       count(*) filter (where failed_at is not null),
       sum(attempt_count),
       sum(failure_count),
       min(created_at),
       max(greatest(created_at, coalesce(first_claimed_at, 0), coalesce(last_claimed_at, 0),
                    coalesce(last_failed_at, 0), coalesce(processed_at, 0),
                    coalesce(failed_at, 0)))
  from a2_events e
 where left(session_id, length($1::text)) = $1::text
   and ($2::text is null or session_id > $2::text)
 group by session_id
 order by session_id
 limit $3::bigint
"""
)

# store-postgres.ts `inspect.readEvents`: the frontier and the page in one
# statement (one snapshot).
READ_EVENTS = Statement(
    f"""
with frontier as (
  select coalesce(max(idx), 0) as frontier from a2_events where session_id = $1::text
),
bound as (
  select least(coalesce($3::bigint, frontier), frontier) as through from frontier
),
page as (
  select {EVENT_COLUMNS} from a2_events, bound
   where session_id = $1::text and idx > $2::bigint and idx <= bound.through
   order by idx limit $4::bigint
)
select bound.through, {_cols("page")} from bound left join page on true order by page.idx
"""
)

# store-postgres.ts `inspect.listSnapshots`.
LIST_SNAPSHOTS = Statement(
    "select reducer_name, up_to_index, updated_at from a2_snapshots"
    " where session_id = $1::text order by reducer_name"
)


# Operator actions (an a2trio addition; issue 18). The verdict is
# `rules.check_action` over the row `ACTION_TARGET` read; the write is a
# compare-and-set on those columns (the caller reads again if the row moved),
# recorded and announced to other processes' drains in the same statement.
#   $1 session, $2 idx
ACTION_TARGET = Statement(
    """
select processed_at, failed_at, attempt_count, claim_holder, failure_count,
       last_failed_attempt, claim_expires_at, not_before
  from a2_events where session_id = $1::text and idx = $2::bigint
"""
)

# The row as `ACTION_TARGET` read it: $3 processed_at, $4 failed_at, $5 attempt,
# $6 holder, $7 claim expiry.
_AS_READ = """
   and e.processed_at is not distinct from $3::bigint
   and e.failed_at is not distinct from $4::bigint
   and e.attempt_count = $5::int
   and e.claim_holder is not distinct from $6::text
   and e.claim_expires_at is not distinct from $7::bigint"""

# $8 actor, $9 reason, $10 now, $11 events channel, $12 notification payload
_RECORDED = """
recorded as (
  insert into a2_operator_actions (session_id, idx, action, actor, reason, at)
  select $1::text, idx, '{action}', $8::text, $9::text, $10::bigint from target
)
select t.idx, pg_notify($11::text, $12::text) from target t"""

REDRIVE = Statement(
    f"""
with target as (
  update a2_events e set failure_count = 0, failed_at = null
   where e.session_id = $1::text and e.idx = $2::bigint {_AS_READ}
  returning e.idx
),
{_RECORDED.format(action="redrive")}
"""
)

# An operator's wake (issue 34): the not-before and the wake mark cleared,
# if the row is as read (its not-before too, $13).
WAKE = Statement(
    f"""
with target as (
  update a2_events e set not_before = null, wake_on = null
   where e.session_id = $1::text and e.idx = $2::bigint {_AS_READ}
     and e.not_before is not distinct from $13::bigint
  returning e.idx
),
{_RECORDED.format(action="wake")}
"""
)

# The lane is handed on as a completion does (`COMPLETE`'s `handed_on`),
# under the session's append lock.
SKIP = Statement(
    f"""
with current as materialized (
  select e.ctid as tid, e.lane, e.lane_ready from a2_events e
   where e.session_id = $1::text and e.idx = $2::bigint {_AS_READ}
   for update of e
),
target as (
  update a2_events e set
    processed_at = $10::bigint, failed_at = null, lane_ready = false,
    claim_holder = null, claim_expires_at = null
    from current c
  -- Locked by `current`, so the tuple id is current (see `CLAIM`).
   where e.ctid = c.tid
  returning e.idx
),
handed_on as (
  update a2_events e set lane_ready = true
    from current c
   where {hands_on("c")} and exists (select 1 from target)
     and e.session_id = $1::text
     and e.idx = {next_in_lane("$1::text", "c.lane", "<> $2::bigint")}
),
{_RECORDED.format(action="skip")}
"""
)

# `retry_now`'s candidates: the live, lane-ready events of the session.
#   $1 session
RETRY_CANDIDATES = Statement(
    f"""
select idx, claim_expires_at from a2_events e
 where session_id = $1::text and {dispatch_ready("e")}
 order by idx
"""
)

#   $1 session, $2 idx[], $3 actor, $4 reason, $5 now, $6 channel, $7 payload
RETRY_NOW = Statement(
    """
with recorded as (
  insert into a2_operator_actions (session_id, idx, action, actor, reason, at)
  select $1::text, i, 'retry_now', $3::text, $4::text, $5::bigint
    from unnest($2::bigint[]) as i
  returning 1
)
select pg_notify($6::text, $7::text) from (select count(*) from recorded) as done
"""
)

#   $1 key prefix, $2 after session, $3 after idx, $4 limit
DEAD_LETTERS = Statement(
    f"""
select {EVENT_COLUMNS} from a2_events
 where failed_at is not null and starts_with(session_id, $1::text)
   and ($2::text is null or (session_id, idx) > ($2::text, $3::bigint))
 order by session_id, idx limit $4::bigint
"""
)

#   $1 session, $2 after idx, $3 through idx
READ_ACTIONS = Statement(
    """
select action, session_id, idx, actor, reason, at from a2_operator_actions
 where session_id = $1::text and idx > $2::bigint and idx <= $3::bigint
 order by idx, id
"""
)

# The journal of durable handlers (a2trio addition, issue 34), in `seq` order.
#   $1 session, $2 idx
JOURNAL_READ = Statement(
    """
select name, result, attempt, at from a2_journal
 where session_id = $1::text and idx = $2::bigint
 order by seq
"""
)

# rules.journals: the step is written only by the attempt that holds the
# event's claim (the row read `for share`, so no claim slips in before the
# commit); a name journaled already keeps its first entry. Rows: whether the
# event exists, whether the attempt holds it, then the entry (the inserted
# one, else the stored one).
#   $1 session, $2 idx, $3 name, $4 attempt, $5 result (JSON text), $6 now
JOURNAL_WRITE = Statement(
    f"""
with parent as materialized (
  select processed_at, failed_at, attempt_count, claim_holder
    from a2_events
   where session_id = $1::text and idx = $2::bigint
   for share
),
holding as materialized (
  select 1 from parent where {holds_claim("parent", "$4::int")}
),
inserted as (
  insert into a2_journal (session_id, idx, name, result, attempt, at)
  select $1::text, $2::bigint, $3::text, $5::text, $4::int, $6::bigint from holding
  on conflict (session_id, idx, name) do nothing
  returning name, result, attempt, at
)
select exists (select 1 from parent), exists (select 1 from holding),
       w.name, w.result, w.attempt, w.at
  from (select 1) as one
  left join (
    select name, result, attempt, at from inserted
    union all
    select name, result, attempt, at from a2_journal
     where session_id = $1::text and idx = $2::bigint and name = $3::text
  ) as w on true
 limit 1
"""
)
