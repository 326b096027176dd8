"""Every statement of the SQLite store, and the decoding of the rows they return.

The statements are the seed's ``store-postgres.ts`` ones written for SQLite
(see :mod:`.store` for the transactions they run in, and why the statements
on the write path name their indexes with ``INDEXED BY``). Each is a named
constant, so ``tests/test_sqlite_plans.py`` can plan and count the ones the
write path runs.

Where a statement selects the rows it reads through a partial index, the
predicate that selects them stays SQL (it is what bounds the statement by
the index), one fragment per rule below, its numbers from ``rules``. So do
the few decisions that reading their rows into Python would make measurably
dearer (issue 31; each statement names the rule it spells: lane readiness of
an unclaimed row, the lane hand-off, the ``drained`` hint, a claim's
``Busy``). Every other verdict is the ``rules`` function's, called in Python
on the columns the transaction read (:mod:`.store`).

Rows are encoded and decoded here and nowhere else: :func:`stored` reads
:data:`EVENT_COLUMNS` in their order, JSON columns go through the encoder and
decoders built once below, and the statements one call runs and decodes
(:func:`insert`, :func:`rows_by_ids`, :func:`next_index`, ...) sit at the end,
for the store's transactions and its planes to share.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import msgspec

from .. import rules
from ..base import AppendEvent, ClaimRequest, EventCause, StoredEvent

__all__ = [
    "BOOKKEEPING",
    "CANDIDATES",
    "CLAIM",
    "CLAIMABLE",
    "CLAIMABLE_SESSIONS",
    "CLAIM_ONE",
    "COMPLETE",
    "COMPLETION_TARGET",
    "DEAD_LETTERS",
    "DEBOUNCED",
    "DEBOUNCE_CANDIDATES",
    "DRAINED",
    "EVENT_COLUMNS",
    "FAIL",
    "FAILURES",
    "INSERT",
    "INSERT_CLAIMED",
    "KEYED",
    "LIST_SESSIONS",
    "LIST_SNAPSHOTS",
    "NEXT_AND_WAITING",
    "NEXT_INDEX",
    "NO_LIMIT",
    "OPEN_LANE",
    "PENDING",
    "PRESENCE_DELETE",
    "PRESENCE_NEWER",
    "PRESENCE_READ",
    "PRESENCE_SWEEP",
    "PRESENCE_UPSERT",
    "PRUNE_STARTS",
    "PUT_SNAPSHOT",
    "READ",
    "READY_LANE",
    "READ_ACTIONS",
    "READ_BOOKKEEPING",
    "READ_EVENTS",
    "READ_SNAPSHOT",
    "READ_TAIL",
    "RECORD_ACTION",
    "RECORD_FAILURE",
    "RECORD_START",
    "REDRIVE",
    "RELEASE",
    "RENEW",
    "RETRY_AT",
    "RETRY_CANDIDATES",
    "ROWS_BY_IDS",
    "SKIP",
    "SLOTS",
    "STARTS",
    "TARGET",
    "TOP_AND_PENDING",
    "TRIM_FAILURES",
    "TYPES_AFTER",
    "UNWAIT",
    "WAITING",
    "WAKE",
    "WAKE_TARGET",
    "Bookkeeping",
    "Completion",
    "Debounce",
    "Dispatch",
    "Target",
    "Waking",
    "claimable",
    "completion",
    "decode",
    "decode_ids",
    "drained",
    "fail",
    "hand_on",
    "has_pending",
    "index_of",
    "insert",
    "next_index",
    "open_lanes",
    "prefix_end",
    "release",
    "rows_by_ids",
    "stored",
    "target",
    "text",
    "wake",
]

# -- the rules the statements select by -------------------------------------
#
# Each fragment spells one `rules` function over a row's columns, for the
# statements that decide by it in SQL; ``now`` names the statement's parameter
# for the clock. A spelling that drifts from `rules` fails the rule table
# (``a2trio.stores.conformance.verdicts``) by name, and tests/test_sqlite_rules.py.

# rules.alive
_ALIVE: Final = "processed_at is null and failed_at is null"


# rules.claim_free
def _claim_free(now: str) -> str:
    return f"(claim_expires_at is null or claim_expires_at <= {now})"


# rules.ripe
def _ripe(now: str) -> str:
    return f"(not_before is null or not_before <= {now})"


# rules.claimable
def _claimable(now: str) -> str:
    return f"{_ALIVE} and lane_ready and {_claim_free(now)} and {_ripe(now)}"


# rules.due, with rules.retry_backoff_ms as a shift (tests/test_verdicts.py pins it)
def _due(now: str) -> str:
    backoff = (
        f"min({rules.RETRY_FIRST_MS} << min(failure_count - 1, {rules.RETRY_MAX_DOUBLINGS}), "
        f"{rules.RETRY_CAP_MS})"
    )
    return f"(failure_count = 0 or last_failed_at + {backoff} <= {now})"


# rules.held
def _held(now: str) -> str:
    return f"{_ALIVE} and lane_ready and not {_claim_free(now)}"


# rules.ready_at_insert, for the new row's session and lane
def _ready_at_insert(session: str, lane: str) -> str:
    return f"""({lane} is null or not exists (
    select 1 from a2_events indexed by a2_events_lane_pending
    where session_id = {session} and lane = {lane} and processed_at is null
  ))"""


# rules.sweepable
def _sweepable(now: str) -> str:
    return f"{_claimable(now)} and {_due(now)}"


# rules.live_slot, over the rows of one concurrency key (``a2_events_concurrency``)
def _live_slot(now: str) -> str:
    return f"{_ALIVE} and claim_expires_at > {now}"


# rules.live_start, over the starts of one throttle (``a2_flow_starts_key``)
def _live_start(now: str) -> str:
    return f"expires_at > {now}"


# rules.has_room for the row `e`, for both its keys: no key, or fewer live
# slots of its concurrency key than its limit, and fewer live starts
# (rules.live_start) of its throttle than its limit
def _has_room(now: str) -> str:
    return f"""(e.concurrency_key is null or (
    select count(*) from a2_events indexed by a2_events_concurrency
    where concurrency_key = e.concurrency_key and {_live_slot(now)}
  ) < e.concurrency_limit) and (e.throttle_key is null or (
    select count(*) from a2_flow_starts indexed by a2_flow_starts_key
    where throttle_key = e.throttle_key and {_live_start(now)}
  ) < e.throttle_limit)"""


# -- events ----------------------------------------------------------------

# The columns of a StoredEvent, in its field order.
EVENT_COLUMNS: Final = (
    "event_id, event_type, payload, idx, session_id, created_at, cause, lane, processed_at, "
    "processed_by_attempt, returned_event_ids, first_claimed_at, last_claimed_at, "
    "attempt_count, failure_count, last_failed_at, last_failed_attempt, last_error, "
    "failed_at, claim_holder, claim_expires_at, trace_context, not_before, version, "
    "concurrency_key, concurrency_limit, debounce_key, debounced_by, throttle_key, "
    "throttle_limit, throttle_period_ms, priority"
)

_INSERTED: Final = (
    "session_id, idx, event_type, payload, event_id, created_at, cause, lane, lane_ready, "
    "processed_at, trace_context, version, concurrency_key, concurrency_limit, not_before, "
    "debounce_key, throttle_key, throttle_limit, throttle_period_ms, priority"
)

#: One new unclaimed row, ready in its lane as the fragment decides: a lane
#: lookup of its own would cost a tenth more instructions of a laned append
#: (issue 31).
INSERT: Final = f"""
insert into a2_events ({_INSERTED})
values (
  ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {_ready_at_insert("?1", "?8")},
  ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19
)
"""

#: One new row claimed as it is written (:func:`insert` decides), so ready in
#: its lane and ripe; ``?6``, its creation, is the claim's time.
INSERT_CLAIMED: Final = f"""
insert into a2_events
  ({_INSERTED}, attempt_count, first_claimed_at, last_claimed_at, claim_holder, claim_expires_at)
values (
  ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
  1, ?6, ?6, ?20, ?21
)
"""

#: A debounced append's candidates (issue 33): the session's unprocessed rows
#: of type ``?2`` and debounce key ``?3``; ``rules.debounces`` decides.
DEBOUNCE_CANDIDATES: Final = """
select idx, event_type, debounce_key, processed_at, failed_at, claim_expires_at, lane, lane_ready
from a2_events indexed by a2_events_unprocessed
where session_id = ?1 and processed_at is null and event_type = ?2 and debounce_key = ?3
"""

#: A row a debounced append skipped (`rules.debounces` said so): processed by
#: no attempt, ``debounced_by`` the new event's index.
DEBOUNCED: Final = """
update a2_events set processed_at = ?1, debounced_by = ?2, lane_ready = 0,
  claim_holder = null, claim_expires_at = null
where session_id = ?3 and idx = ?4
"""

#: Events after ``?2`` through ``?3`` (None: the end). The upper bound is one
#: the key range stops at, where ``(?3 is null or idx <= ?3)`` would walk on
#: to the session's end.
READ: Final = f"""
select {EVENT_COLUMNS} from a2_events
where session_id = ?1 and idx > ?2 and idx <= coalesce(?3, {2**63 - 1})
order by idx
"""

ROWS_BY_IDS: Final = (
    f"select {EVENT_COLUMNS} from a2_events where event_id in (select value from json_each(?)) "
    "order by idx"
)

#: The session's last index, off the end of its primary key: a seek, where
#: ``max(idx)`` beside other columns walks the whole session.
_TOP: Final = "select idx from a2_events where session_id = ?1 order by idx desc limit 1"

#: Whether any row of the session is unprocessed: the first entry of the
#: partial index that holds only those.
_ANY_PENDING: Final = """exists(
  select 1 from a2_events indexed by a2_events_unprocessed
  where session_id = ?1 and processed_at is null
)"""

PENDING: Final = f"select {_ANY_PENDING}"

NEXT_INDEX: Final = f"select coalesce(({_TOP}), 0) + 1"

#: Whether any row of the session has a wake mark (a suspended durable
#: wait, issue 34): the first entry of the partial index of marked rows,
#: almost always empty.
_ANY_WAITING: Final = """exists(
  select 1 from a2_events indexed by a2_events_waiting
  where session_id = ?1 and wake_on is not null
)"""

#: All three at once, as the seed's `maxRows` query (the wake check beside).
TOP_AND_PENDING: Final = f"select coalesce(({_TOP}), 0), {_ANY_PENDING}, {_ANY_WAITING}"

#: A completion's: the next index and the wake check.
NEXT_AND_WAITING: Final = f"select coalesce(({_TOP}), 0) + 1, {_ANY_WAITING}"

#: A woken row (`?3` 1: its not-before cleared) or a stale mark dropped.
WAKE: Final = """
update a2_events set wake_on = null, not_before = case when ?3 then null else not_before end
where session_id = ?1 and idx = ?2
"""

#: The types of the events after `?2`: a release's own wake check.
TYPES_AFTER: Final = "select event_type from a2_events where session_id = ?1 and idx > ?2"

# -- lanes -----------------------------------------------------------------

#: Lane ``?2`` if the session has an unprocessed event in it: the open lanes
#: `rules.ready_at_insert` reads, narrowed to the new event's.
OPEN_LANE: Final = """
select lane from a2_events indexed by a2_events_lane_pending
where session_id = ?1 and lane = ?2 and processed_at is null
limit 1
"""

# rules.next_in_lane: readies lane ``?2``'s first unprocessed event, once the
# head that hands it on (`rules.hands_on`) is written processed. Reading the
# head into Python and readying it by key costs a sixth more instructions of
# a lane head's completion (issue 31).
READY_LANE: Final = """
update a2_events set lane_ready = 1
where session_id = ?1 and idx = (
  select idx from a2_events indexed by a2_events_lane_pending
  where session_id = ?1 and lane = ?2 and processed_at is null
  order by idx limit 1
)
"""

# -- claims ----------------------------------------------------------------

#: Whether a claim would take any event now: the live, ready rows only.
CLAIMABLE: Final = f"""
select exists(
  select 1 from a2_events indexed by a2_events_dispatch_ready
  where session_id = ?1 and {_claimable("?2")}
)
"""

#: The seed's `claimAvailable` update, over the ready rows only.
CLAIM: Final = f"""
update a2_events indexed by a2_events_dispatch_ready set
  attempt_count = attempt_count + 1,
  first_claimed_at = coalesce(first_claimed_at, ?2),
  last_claimed_at = ?2,
  claim_holder = ?3,
  claim_expires_at = ?4
where session_id = ?1
  and {_claimable("?2")}
  and idx not in (select value from json_each(?5))
  and idx <= coalesce((
    select idx from a2_events indexed by a2_events_dispatch_ready
    where session_id = ?1 and {_claimable("?2")}
      and idx not in (select value from json_each(?5))
    order by idx limit 1 offset ?6 - 1
  ), idx)
returning {EVENT_COLUMNS}
"""

#: An offset past any session's end: "no limit" for the claim's bound lookup.
NO_LIMIT: Final = 2**62

# rules.busy_until: when the earliest live claim lapses (nothing claimable
# now). Reading the held rows into Python costs a fifth more instructions of
# such a claim (issue 31).
RETRY_AT: Final = f"""
select min(claim_expires_at) from a2_events indexed by a2_events_dispatch_ready
where session_id = ?1 and {_held("?2")}
"""

#: The retry-now candidates (`rules.retry_targets`): the live rows first in
#: their lane, by index.
RETRY_CANDIDATES: Final = f"""
select idx, claim_expires_at from a2_events indexed by a2_events_dispatch_ready
where session_id = ?1 and {_ALIVE} and lane_ready
order by idx
"""

# rules.drained: a completion's hint, after its writes, that nothing alive is
# left (the first alive unprocessed row ends the read, dead letters are passed).
# Reading the open rows into Python costs a sixth more of a completion (issue 31).
DRAINED: Final = f"""
select not exists(
  select 1 from a2_events indexed by a2_events_unprocessed
  where session_id = ?1 and {_ALIVE}
)
"""

# Sessions with work a sweep would claim now (`claimable_sessions`). The index
# holds only dispatch-ready rows, so the cost is the pending work.
CLAIMABLE_SESSIONS: Final = f"""
select distinct session_id from a2_events e indexed by a2_events_dispatch_ready
where session_id >= ?1 and session_id < ?2 and {_sweepable("?3")} and {_has_room("?3")}
order by session_id limit ?4
"""

# -- concurrency keys (rules.flow) -------------------------------------------

#: Whether a claim of the session meets a keyed or prioritized row (the claim then decides
#: in Python, ``flow.claim_keyed``): one probe of the ready rows.
KEYED: Final = f"""
select exists(
  select 1 from a2_events indexed by a2_events_dispatch_ready
  where session_id = ?1 and {_claimable("?2")}
    and (concurrency_key is not null or throttle_key is not null or priority is not null)
)
"""

#: The claimable rows of the session with their keys, by index.
CANDIDATES: Final = f"""
select idx, concurrency_key, concurrency_limit, throttle_key, throttle_limit, throttle_period_ms,
  priority
from a2_events indexed by a2_events_dispatch_ready
where session_id = ?1 and {_claimable("?2")}
order by idx
"""

#: The live slots of key ``?1``: how many, and when the first lapses.
SLOTS: Final = f"""
select count(*), min(claim_expires_at) from a2_events indexed by a2_events_concurrency
where concurrency_key = ?1 and {_live_slot("?2")}
"""

#: The live starts of throttle ``?1`` (rules.live_start): how many, and when
#: the first stops counting.
STARTS: Final = f"""
select count(*), min(expires_at) from a2_flow_starts indexed by a2_flow_starts_key
where throttle_key = ?1 and {_live_start("?2")}
"""

#: The starts of throttle ``?1`` that no longer count, forgotten.
PRUNE_STARTS: Final = "delete from a2_flow_starts where throttle_key = ?1 and expires_at <= ?2"

#: An attempt start of throttle ``?1``, counting until ``?2``.
RECORD_START: Final = "insert into a2_flow_starts (throttle_key, expires_at) values (?1, ?2)"

#: The claim of one row by key (``CLAIM``'s update).
CLAIM_ONE: Final = f"""
update a2_events set
  attempt_count = attempt_count + 1,
  first_claimed_at = coalesce(first_claimed_at, ?2),
  last_claimed_at = ?2,
  claim_holder = ?3,
  claim_expires_at = ?4
where session_id = ?1 and idx = ?5
returning {EVENT_COLUMNS}
"""

#: A renewal `rules.renew_verdict` granted.
RENEW: Final = "update a2_events set claim_expires_at = ? where session_id = ? and idx = ?"

# -- outcomes --------------------------------------------------------------

# What the attempt fences read (`rules.Bookkeeping`), in `Bookkeeping` order.
BOOKKEEPING: Final = (
    "processed_at, failed_at, attempt_count, claim_holder, failure_count, last_failed_attempt"
)

#: The session's marked rows, for `rules.wake_verdict`.
WAITING: Final = f"""
select idx, wake_on, {BOOKKEEPING} from a2_events indexed by a2_events_waiting
where session_id = ?1 and wake_on is not null
"""

READ_BOOKKEEPING: Final = f"select {BOOKKEEPING} from a2_events where session_id = ? and idx = ?"

COMPLETION_TARGET: Final = (
    f"select {BOOKKEEPING}, processed_by_attempt, returned_event_ids, lane, lane_ready "
    "from a2_events where session_id = ? and idx = ?"
)

COMPLETE: Final = """
update a2_events set
  processed_at = ?, processed_by_attempt = ?, returned_event_ids = ?,
  lane_ready = 0, claim_holder = null, claim_expires_at = null
where session_id = ? and idx = ?
"""

FAIL: Final = """
update a2_events set
  failure_count = ?, last_error = ?, last_failed_at = ?,
  last_failed_attempt = ?, failed_at = ?, not_before = ?,
  claim_holder = null, claim_expires_at = null, wake_on = null
where session_id = ? and idx = ?
"""

#: A release `rules.release_verdict` granted (issue 33): the claim cleared,
#: the not-before stored, no failure counted.
RELEASE: Final = """
update a2_events set not_before = ?, wake_on = ?, claim_holder = null, claim_expires_at = null
where session_id = ? and idx = ?
"""

# The failed attempt `FAIL` records, read from the row before `FAIL` releases
# its claim (the holder, the claim time), and the trim that keeps the latest
# `rules.MAX_FAILED_ATTEMPTS` of the event. Run only when a failure records.
#   ?1 session, ?2 idx, ?3 attempt, ?4 error, ?5 now
RECORD_FAILURE: Final = """
insert into a2_failed_attempts (session_id, idx, attempt, error, failed_at, holder, claimed_at)
select session_id, idx, ?3, ?4, ?5, claim_holder, last_claimed_at
  from a2_events where session_id = ?1 and idx = ?2
"""

TRIM_FAILURES: Final = f"""
delete from a2_failed_attempts
 where session_id = ?1 and idx = ?2 and attempt <= (
   select attempt from a2_failed_attempts where session_id = ?1 and idx = ?2
    order by attempt desc limit 1 offset {rules.MAX_FAILED_ATTEMPTS})
"""

#   ?1 session, ?2 the indexes as a JSON array
FAILURES: Final = """
select idx, attempt, error, failed_at, holder, claimed_at from a2_failed_attempts
 where session_id = ?1 and idx in (select value from json_each(?2))
 order by idx, attempt
"""

# -- state -----------------------------------------------------------------

READ_SNAPSHOT: Final = (
    "select up_to_index, state from a2_snapshots where session_id = ? and reducer_name = ?"
)

READ_TAIL: Final = (
    f"select {EVENT_COLUMNS} from a2_events where session_id = ? and idx > ? order by idx"
)

PUT_SNAPSHOT: Final = """
insert into a2_snapshots (session_id, reducer_name, up_to_index, state, updated_at)
values (?, ?, ?, ?, ?)
on conflict (session_id, reducer_name) do update set
  up_to_index = excluded.up_to_index,
  state = excluded.state,
  updated_at = excluded.updated_at
where excluded.up_to_index > a2_snapshots.up_to_index
"""

# -- presence --------------------------------------------------------------

PRESENCE_SWEEP: Final = "delete from a2_presence where ns = ? and expires_at <= ?"

PRESENCE_NEWER: Final = (
    "select 1 from a2_presence where ns = ? and participant = ? and field = ? and at > ?"
)

PRESENCE_DELETE: Final = "delete from a2_presence where ns = ? and participant = ? and field = ?"

PRESENCE_UPSERT: Final = """
insert into a2_presence
  (ns, participant, field, value, seen, at, expires_at)
values (?, ?, ?, ?, ?, ?, ?)
on conflict (ns, participant, field) do update set
  value = excluded.value, seen = excluded.seen,
  at = excluded.at, expires_at = excluded.expires_at
"""

PRESENCE_READ: Final = (
    "select participant, field, value, seen, at, expires_at from a2_presence "
    "where ns = ? and expires_at > ? order by participant, field"
)

# -- inspection ------------------------------------------------------------

LIST_SESSIONS: Final = """
select session_id, count(*),
  count(*) filter (where processed_at is null and failed_at is null),
  count(*) filter (where failed_at is not null),
  sum(attempt_count), sum(failure_count), min(created_at),
  max(max(created_at, coalesce(first_claimed_at, 0),
          coalesce(last_claimed_at, 0), coalesce(last_failed_at, 0),
          coalesce(processed_at, 0), coalesce(failed_at, 0)))
from a2_events
where substr(session_id, 1, length(?1)) = ?1 and (?2 is null or session_id > ?2)
group by session_id order by session_id limit ?3
"""

READ_EVENTS: Final = (
    f"select {EVENT_COLUMNS} from a2_events where session_id = ? and idx > ? and idx <= ? "
    "order by idx limit ?"
)

LIST_SNAPSHOTS: Final = (
    "select reducer_name, up_to_index, updated_at from a2_snapshots "
    "where session_id = ? order by reducer_name"
)

# -- operator actions ------------------------------------------------------

DEAD_LETTERS: Final = f"""
select {EVENT_COLUMNS} from a2_events indexed by a2_events_dead_letters
where failed_at is not null and session_id < ?3
  and (session_id > ?1 or (session_id = ?1 and idx > ?2))
order by session_id, idx limit ?4
"""

#: What the renewal and an operator action's fence read, by key.
TARGET: Final = (
    f"select {BOOKKEEPING}, claim_expires_at, lane, lane_ready from a2_events "
    "where session_id = ? and idx = ?"
)

REDRIVE: Final = (
    "update a2_events set failure_count = 0, failed_at = null where session_id = ? and idx = ?"
)

SKIP: Final = """
update a2_events set processed_at = ?, failed_at = null, lane_ready = 0,
  claim_holder = null, claim_expires_at = null
where session_id = ? and idx = ?
"""

#: What an operator's wake reads (`rules.check_wake`), and its write.
WAKE_TARGET: Final = (
    f"select {BOOKKEEPING}, claim_expires_at, not_before from a2_events "
    "where session_id = ? and idx = ?"
)
UNWAIT: Final = (
    "update a2_events set not_before = null, wake_on = null where session_id = ? and idx = ?"
)

RECORD_ACTION: Final = """
insert into a2_operator_actions (session_id, idx, action, actor, reason, at)
values (?, ?, ?, ?, ?, ?)
"""

READ_ACTIONS: Final = (
    "select action, session_id, idx, actor, reason, at from a2_operator_actions "
    "where session_id = ? and idx > ? and idx <= ? order by idx, id"
)

# -- rows ------------------------------------------------------------------

_encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode
_decode_cause = msgspec.json.Decoder(EventCause).decode
decode_ids = msgspec.json.Decoder(list[str]).decode


class Bookkeeping(NamedTuple):
    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None


class Waking(NamedTuple):
    """:data:`WAKE_TARGET`'s row (``rules.Waking``)."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None
    not_before_ms: int | None


class Target(NamedTuple):
    """What the renewal and an operator action's fence read (``rules.Claim``,
    ``rules.ActionTarget``, ``rules.Laned``): :data:`TARGET`'s row."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None
    lane: str | None
    lane_ready: bool


class Completion(NamedTuple):
    """What the completion fence and the lane hand-off read
    (``rules.Completion``, ``rules.Laned``): :data:`COMPLETION_TARGET`'s row."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    processed_by_attempt: int | None
    returned_event_ids: list[str] | None
    lane: str | None
    lane_ready: bool


class Dispatch(NamedTuple):
    """A new row's claim columns and key (``rules.KeyedDispatch``), before
    it is written."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    lane_ready: bool
    claim_expires_at_ms: int | None
    not_before_ms: int | None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    throttle_key: str | None = None
    throttle_limit: int | None = None


class Debounce(NamedTuple):
    """A debounced append's candidate (``rules.Debounced``, ``rules.Laned``):
    :data:`DEBOUNCE_CANDIDATES`' row (``at`` its index)."""

    at: int
    type: str
    debounce_key: str | None
    processed_at_ms: int | None
    failed_at_ms: int | None
    claim_expires_at_ms: int | None
    lane: str | None
    lane_ready: bool


def target(row: tuple[Any, ...]) -> Target:
    processed, failed, attempts, holder, failures, last_failed, expires, lane, ready = row
    return Target(
        processed, failed, attempts, holder, failures, last_failed, expires, lane, bool(ready)
    )


def completion(row: tuple[Any, ...]) -> Completion:
    processed, failed, attempts, holder, failures, last_failed, by, returned, lane, ready = row
    ids = None if returned is None else decode_ids(returned)
    return Completion(
        processed, failed, attempts, holder, failures, last_failed, by, ids, lane, bool(ready)
    )


def text(value: Any) -> str:
    return _encode(value).decode()


def stored(row: tuple[Any, ...]) -> StoredEvent:
    fields = list(row)
    fields[2] = decode(fields[2])
    if fields[6] is not None:
        fields[6] = _decode_cause(fields[6])
    if fields[10] is not None:
        fields[10] = decode_ids(fields[10])
    return StoredEvent(*fields)


def index_of(event: StoredEvent) -> int:
    return event.index


def prefix_end(prefix: str) -> str:
    """The least string above every string starting with ``prefix`` (binary
    order, as SQLite compares text)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


# -- one statement each, its rows decoded ----------------------------------
#
# Shared by the store's append, claim and completion transactions and
# by its planes; each runs inside the caller's transaction, and the rules'
# verdicts over what it read are the rules functions'.


def next_index(conn: sqlite3.Connection, session_id: str) -> int:
    (following,) = conn.execute(NEXT_INDEX, (session_id,)).fetchone()
    return int(following)


def claimable(conn: sqlite3.Connection, session_id: str, now: int) -> bool:
    """Whether a claim would take any of the session's events now."""
    (found,) = conn.execute(CLAIMABLE, (session_id, now)).fetchone()
    return bool(found)


def has_pending(conn: sqlite3.Connection, session_id: str) -> bool:
    return bool(conn.execute(PENDING, (session_id,)).fetchone()[0])


def drained(conn: sqlite3.Connection, session_id: str) -> bool:
    """A completion's ``drained`` hint (:data:`DRAINED`), after its writes."""
    return bool(conn.execute(DRAINED, (session_id,)).fetchone()[0])


def rows_by_ids(conn: sqlite3.Connection, ids: Sequence[str]) -> list[StoredEvent]:
    if not ids:
        return []  # no query for the common batch, which supplies none
    rows = conn.execute(ROWS_BY_IDS, (text(list(ids)),)).fetchall()
    return [stored(row) for row in rows]


def open_lanes(conn: sqlite3.Connection, session_id: str, lane: str | None) -> list[str]:
    """``[lane]`` if the session has an unprocessed event in it, else ``[]``
    (no read without a lane): what ``rules.ready_at_insert`` reads."""
    if lane is None:
        return []
    return [found for (found,) in conn.execute(OPEN_LANE, (session_id, lane))]


def hand_on(conn: sqlite3.Connection, session_id: str, row: rules.Laned) -> None:
    """Ready the next event of a settled row's lane (a completion, a skip),
    if the row was its head (``rules.hands_on``; :data:`READY_LANE`).

    Args:
      row: the row as read before its settling write, which has run."""
    if row.lane is not None and rules.hands_on(row):
        conn.execute(READY_LANE, (session_id, row.lane))


def insert(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    event: AppendEvent,
    event_id: str,
    cause: EventCause | None,
    now: int,
    claim: ClaimRequest | None = None,
) -> StoredEvent:
    """Write one event: given ``claim``, claimed as it is written if
    ``rules.claimable`` says so (a claim in the same transaction), its lane
    readiness ``rules.ready_at_insert``'s; unclaimed, ready as
    :data:`INSERT`'s fragment decides."""
    processed_at = now if event.settled else None
    if event.debounce_key is not None:
        _debounce(conn, session_id, index, event.type, event.debounce_key, now)
    not_before = None if event.delay_ms is None else now + event.delay_ms
    row = StoredEvent(
        id=event_id,
        type=event.type,
        payload=event.payload,
        index=index,
        session_id=session_id,
        created_at_ms=now,
        cause=cause,
        lane=event.lane,
        processed_at_ms=processed_at,
        trace_context=event.trace_context,
        version=event.version,
        concurrency_key=event.concurrency_key,
        concurrency_limit=event.concurrency_limit,
        not_before_ms=not_before,
        debounce_key=event.debounce_key,
        throttle_key=event.throttle_key,
        throttle_limit=event.throttle_limit,
        throttle_period_ms=event.throttle_period_ms,
        priority=event.priority,
    )
    columns = (
        session_id,
        index,
        event.type,
        text(event.payload),
        event_id,
        now,
        None if cause is None else text(cause),
        event.lane,
    )
    flow = (event.concurrency_key, event.concurrency_limit)
    throttle = (event.throttle_key, event.throttle_limit, event.throttle_period_ms)
    rest = (
        processed_at,
        event.trace_context,
        event.version,
        *flow,
        not_before,
        event.debounce_key,
        *throttle,
        event.priority,
    )
    if claim is not None:
        ready = rules.ready_at_insert(event.lane, open_lanes(conn, session_id, event.lane))
        dispatch = Dispatch(processed_at, None, ready, None, not_before, *flow, *throttle[:2])
        if rules.claims_at_insert(dispatch, now):
            expires_at = now + claim.ttl_ms
            conn.execute(
                INSERT_CLAIMED,
                (*columns, *rest, claim.holder, expires_at),
            )
            return msgspec.structs.replace(
                row,
                first_claimed_at_ms=now,
                last_claimed_at_ms=now,
                attempt_count=1,
                claim_holder=claim.holder,
                claim_expires_at_ms=expires_at,
            )
    conn.execute(INSERT, (*columns, *rest))
    return row


def fail(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    attempt: int,
    error: str,
    now: int,
    failures: int,
    dead_at: int | None,
    retry_at: int | None,
) -> None:
    """The writes of a failure ``rules.fail_verdict`` recorded: the failed
    attempt kept (:data:`RECORD_FAILURE`, :data:`TRIM_FAILURES`, read from the
    row before :data:`FAIL` releases its claim), then the row."""
    conn.execute(RECORD_FAILURE, (session_id, index, attempt, error, now))
    conn.execute(TRIM_FAILURES, (session_id, index))
    conn.execute(FAIL, (failures, error, now, attempt, dead_at, retry_at, session_id, index))


def _debounce(
    conn: sqlite3.Connection, session_id: str, index: int, type: str, key: str, now: int
) -> None:
    """Skip the earlier rows ``rules.debounces`` says the new debounced row
    at ``index`` settles, handing their lanes on (before the new row's own
    lane readiness is decided)."""
    for found in conn.execute(DEBOUNCE_CANDIDATES, (session_id, type, key)).fetchall():
        at, found_type, found_key, processed, failed, expires, lane, ready = found
        row = Debounce(at, found_type, found_key, processed, failed, expires, lane, bool(ready))
        if rules.debounces(row, type, key, now):
            conn.execute(DEBOUNCED, (now, index, session_id, row.at))
            hand_on(conn, session_id, row)


def wake(conn: sqlite3.Connection, session_id: str, types: Sequence[str]) -> None:
    """``rules.wake_verdict`` over the session's marked rows for events of
    ``types`` just written (called only when the probe found marks)."""
    for index, wake_on, *bookkeeping in conn.execute(WAITING, (session_id,)).fetchall():
        verdict = rules.wake_verdict(Bookkeeping(*bookkeeping), decode(wake_on), types)
        if verdict != "keep":
            conn.execute(WAKE, (session_id, index, verdict == "wake"))


def release(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    not_before: int,
    now: int,
    wake_on: Sequence[str],
    seen_through: int | None,
) -> int:
    """The writes of a release ``rules.release_verdict`` granted: the
    not-before stored with the wake mark, or ``now`` and no mark when an
    event after ``seen_through`` wakes it already (``rules.wakes``).
    Returns the not-before stored."""
    mark = text(list(wake_on)) if wake_on else None
    if mark is not None and seen_through is not None:
        later = conn.execute(TYPES_AFTER, (session_id, seen_through)).fetchall()
        if rules.wakes(wake_on, (t for (t,) in later)):
            mark, not_before = None, now
    conn.execute(RELEASE, (not_before, mark, session_id, index))
    return not_before
