"""Every statement of the SQLite store, and the decoding of the rows they return.

The statements are the seed's ``store-postgres.ts`` ones written for SQLite
(see :mod:`.store` for the transactions they run in, and why the statements
on the write path name their indexes with ``INDEXED BY``). Each is a named
constant, so ``tests/test_sqlite_plans.py`` can plan and count the ones the
write path runs.

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

from ..base import AppendEvent, ClaimRequest, EventCause, StoredEvent

__all__ = [
    "ACTION_TARGET",
    "ATTEMPT_COUNT",
    "BOOKKEEPING",
    "CLAIM",
    "CLAIMABLE",
    "CLAIMABLE_SESSIONS",
    "CLAIM_RANGE",
    "COMPLETE",
    "COMPLETION_TARGET",
    "DEAD_LETTERS",
    "EVENT_COLUMNS",
    "FAIL",
    "INSERT",
    "LIST_SESSIONS",
    "LIST_SNAPSHOTS",
    "NEXT_INDEX",
    "NO_LIMIT",
    "PENDING",
    "PRESENCE_DELETE",
    "PRESENCE_NEWER",
    "PRESENCE_READ",
    "PRESENCE_SWEEP",
    "PRESENCE_UPSERT",
    "PUT_SNAPSHOT",
    "READ",
    "READY_LANE",
    "READ_ACTIONS",
    "READ_BOOKKEEPING",
    "READ_EVENTS",
    "READ_SNAPSHOT",
    "READ_TAIL",
    "RECORD_ACTION",
    "REDRIVE",
    "RENEW",
    "RETRY_AT",
    "RETRY_CANDIDATES",
    "ROWS_BY_IDS",
    "SKIP",
    "TOP_AND_PENDING",
    "Bookkeeping",
    "Target",
    "claim_range",
    "claimable",
    "decode",
    "decode_ids",
    "has_pending",
    "index_of",
    "insert",
    "next_index",
    "prefix_end",
    "rows_by_ids",
    "stored",
    "text",
]

# -- events ----------------------------------------------------------------

# The columns of a StoredEvent, in its field order.
EVENT_COLUMNS: Final = (
    "event_id, event_type, payload, idx, session_id, created_at, cause, lane, processed_at, "
    "processed_by_attempt, returned_event_ids, first_claimed_at, last_claimed_at, "
    "attempt_count, failure_count, last_failed_at, last_failed_attempt, last_error, "
    "failed_at, claim_holder, claim_expires_at, trace_context"
)

INSERT: Final = """
insert into a2_events
  (session_id, idx, event_type, payload, event_id, created_at, cause, lane, lane_ready,
   processed_at, trace_context)
values (
  ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
  ?8 is null or not exists (
    select 1 from a2_events indexed by a2_events_lane_pending
    where session_id = ?1 and lane = ?8 and processed_at is null
  ),
  ?9, ?10
)
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

#: Both at once, as the seed's `maxRows` query.
TOP_AND_PENDING: Final = f"select coalesce(({_TOP}), 0), {_ANY_PENDING}"

# -- claims ----------------------------------------------------------------

#: Whether a claim would take any event now: the live, ready rows only.
CLAIMABLE: Final = """
select exists(
  select 1 from a2_events indexed by a2_events_dispatch_ready
  where session_id = ?1 and lane_ready and processed_at is null and failed_at is null
    and (claim_expires_at is null or claim_expires_at <= ?2)
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
  and processed_at is null
  and failed_at is null
  and lane_ready
  and (claim_expires_at is null or claim_expires_at <= ?2)
  and idx not in (select value from json_each(?5))
  and idx <= coalesce((
    select idx from a2_events indexed by a2_events_dispatch_ready
    where session_id = ?1 and lane_ready and processed_at is null and failed_at is null
      and (claim_expires_at is null or claim_expires_at <= ?2)
      and idx not in (select value from json_each(?5))
    order by idx limit 1 offset ?6 - 1
  ), idx)
returning {EVENT_COLUMNS}
"""

#: An offset past any session's end: "no limit" for the claim's bound lookup.
NO_LIMIT: Final = 2**62

#: Claims the just-written events in ``[?2, ?3]`` that are claimable.
CLAIM_RANGE: Final = f"""
update a2_events set
  attempt_count = 1, first_claimed_at = ?4, last_claimed_at = ?4,
  claim_holder = ?5, claim_expires_at = ?6
where session_id = ?1 and idx between ?2 and ?3
  and lane_ready and processed_at is null
returning {EVENT_COLUMNS}
"""

#: When the earliest live claim lapses (nothing claimable now).
RETRY_AT: Final = """
select min(claim_expires_at) from a2_events indexed by a2_events_dispatch_ready
where session_id = ?1 and processed_at is null and failed_at is null
  and lane_ready and claim_expires_at > ?2
"""

# Sessions with work a claim would take now (`claimable_sessions`). The index
# holds only dispatch-ready rows, so the cost is the pending work; a failed
# row waits out `rules.retry_backoff_ms`, spelled here in SQL.
CLAIMABLE_SESSIONS: Final = """
    select distinct session_id from a2_events indexed by a2_events_dispatch_ready
    where lane_ready and processed_at is null and failed_at is null
      and session_id >= ? and session_id < ?
      and (claim_expires_at is null or claim_expires_at <= ?)
      and (failure_count = 0
           or last_failed_at + min(1000 << min(failure_count - 1, 6), 60000) <= ?)
    order by session_id limit ?
"""

RENEW: Final = """
update a2_events set claim_expires_at = ?
where session_id = ? and idx = ? and attempt_count = ?
  and processed_at is null and failed_at is null
  and claim_holder = ? and claim_expires_at > ?
returning idx
"""

ATTEMPT_COUNT: Final = "select attempt_count from a2_events where session_id = ? and idx = ?"

# -- outcomes --------------------------------------------------------------

# What the attempt fences read (`rules.Bookkeeping`), in `Bookkeeping` order.
BOOKKEEPING: Final = (
    "processed_at, failed_at, attempt_count, claim_holder, failure_count, last_failed_attempt"
)

READ_BOOKKEEPING: Final = f"select {BOOKKEEPING} from a2_events where session_id = ? and idx = ?"

COMPLETION_TARGET: Final = (
    f"select {BOOKKEEPING}, processed_by_attempt, returned_event_ids, lane "
    "from a2_events where session_id = ? and idx = ?"
)

COMPLETE: Final = """
update a2_events set
  processed_at = ?, processed_by_attempt = ?, returned_event_ids = ?,
  lane_ready = 0, claim_holder = null, claim_expires_at = null
where session_id = ? and idx = ?
"""

#: Readies the first unprocessed event of a lane whose head was completed.
READY_LANE: Final = """
update a2_events set lane_ready = 1
where session_id = ?1 and idx = (
  select idx from a2_events indexed by a2_events_lane_pending
  where session_id = ?1 and lane = ?2 and processed_at is null
  order by idx limit 1
)
"""

FAIL: Final = """
update a2_events set
  failure_count = ?, last_error = ?, last_failed_at = ?,
  last_failed_attempt = ?, failed_at = ?,
  claim_holder = null, claim_expires_at = null
where session_id = ? and idx = ?
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

ACTION_TARGET: Final = (
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

RECORD_ACTION: Final = """
insert into a2_operator_actions (session_id, idx, action, actor, reason, at)
values (?, ?, ?, ?, ?, ?)
"""

RETRY_CANDIDATES: Final = """
select idx, claim_expires_at from a2_events indexed by a2_events_dispatch_ready
where session_id = ? and lane_ready and processed_at is null
  and failed_at is null
order by idx
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


class Target(NamedTuple):
    """What an operator action's fence reads (``rules.ActionTarget``)."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None
    lane: str | None
    lane_ready: int


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
# by its planes; each runs inside the caller's transaction.


def next_index(conn: sqlite3.Connection, session_id: str) -> int:
    (following,) = conn.execute(NEXT_INDEX, (session_id,)).fetchone()
    return int(following)


def claimable(conn: sqlite3.Connection, session_id: str, now: int) -> bool:
    """Whether a claim would take any of the session's events now."""
    (found,) = conn.execute(CLAIMABLE, (session_id, now)).fetchone()
    return bool(found)


def claim_range(
    conn: sqlite3.Connection, session_id: str, first: int, last: int, now: int, claim: ClaimRequest
) -> list[StoredEvent]:
    """Claim the just-written events in ``[first, last]`` that are claimable."""
    rows = conn.execute(
        CLAIM_RANGE, (session_id, first, last, now, claim.holder, now + claim.ttl_ms)
    ).fetchall()
    return sorted((stored(r) for r in rows), key=index_of)


def has_pending(conn: sqlite3.Connection, session_id: str) -> bool:
    return bool(conn.execute(PENDING, (session_id,)).fetchone()[0])


def rows_by_ids(conn: sqlite3.Connection, ids: Sequence[str]) -> list[StoredEvent]:
    if not ids:
        return []  # no query for the common batch, which supplies none
    rows = conn.execute(ROWS_BY_IDS, (text(list(ids)),)).fetchall()
    return [stored(row) for row in rows]


def insert(
    conn: sqlite3.Connection,
    session_id: str,
    index: int,
    event: AppendEvent,
    event_id: str,
    cause: EventCause | None,
    now: int,
) -> StoredEvent:
    processed_at = now if event.settled else None
    conn.execute(
        INSERT,
        (
            session_id,
            index,
            event.type,
            text(event.payload),
            event_id,
            now,
            None if cause is None else text(cause),
            event.lane,
            processed_at,
            event.trace_context,
        ),
    )
    return StoredEvent(
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
    )
