"""The SQLite schema, versioned with ``PRAGMA user_version``.

Tables and columns are the seed's ``store-postgres.ts`` schema, typed the
SQLite way: ``jsonb`` columns hold JSON text (readable with the ``sqlite3``
shell and ``json_extract``), booleans are 0/1, and epoch milliseconds are
integers. Each entry of :data:`MIGRATIONS` moves a database from version ``n``
to ``n + 1``; a later release appends an entry instead of editing one, so a
developer's ``.a2/dev.db`` is migrated rather than refused.

The store's statements name the partial indexes (``a2_events_unprocessed``,
``a2_events_lane_pending``, ``a2_events_dispatch_ready``,
``a2_events_waiting``) with ``INDEXED BY``, so that no append reads a
session's history (issue 17): a migration that drops or renames one must
change those statements in the same release, or they fail
with "no such index".
"""

from __future__ import annotations

import sqlite3

from ...errors import A2Error, ErrorCode

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

_V1 = (
    """
    create table if not exists a2_events (
      session_id text not null,
      idx integer not null,
      event_type text not null,
      payload text not null,
      event_id text not null,
      created_at integer not null,
      cause text,
      lane text,
      lane_ready integer not null default 0,
      processed_at integer,
      processed_by_attempt integer,
      returned_event_ids text,
      first_claimed_at integer,
      last_claimed_at integer,
      attempt_count integer not null default 0,
      failure_count integer not null default 0,
      last_failed_at integer,
      last_failed_attempt integer,
      last_error text,
      failed_at integer,
      claim_holder text,
      claim_expires_at integer,
      primary key (session_id, idx)
    ) without rowid
    """,
    "create unique index if not exists a2_events_event_id on a2_events (event_id)",
    """
    create index if not exists a2_events_unprocessed
      on a2_events (session_id, idx) where processed_at is null
    """,
    """
    create index if not exists a2_events_lane_pending
      on a2_events (session_id, lane, idx) where processed_at is null
    """,
    """
    create index if not exists a2_events_dispatch_ready
      on a2_events (session_id, idx)
      where lane_ready and processed_at is null and failed_at is null
    """,
    """
    create table if not exists a2_snapshots (
      session_id text not null,
      reducer_name text not null,
      up_to_index integer not null,
      state text not null,
      updated_at integer not null,
      primary key (session_id, reducer_name)
    ) without rowid
    """,
    """
    create table if not exists a2_presence (
      ns text not null,
      participant text not null,
      field text not null,
      value text not null,
      seen integer not null,
      at integer not null,
      expires_at integer not null,
      primary key (ns, participant, field)
    ) without rowid
    """,
)

# Operator actions (issue 18): who redrove or skipped what, and the index
# that finds dead letters across sessions without reading the history.
_V2 = (
    """
    create table if not exists a2_operator_actions (
      id integer primary key,
      session_id text not null,
      idx integer not null,
      action text not null,
      actor text not null,
      reason text not null,
      at integer not null
    )
    """,
    """
    create index if not exists a2_operator_actions_event
      on a2_operator_actions (session_id, idx)
    """,
    """
    create index if not exists a2_events_dead_letters
      on a2_events (session_id, idx) where failed_at is not null
    """,
)

# Each event's trace context (issue 18): the appender's, so a handler in another
# process continues its trace. Null for events written before.
_V3 = ("alter table a2_events add column trace_context text",)

# Each event's not-before instant (issue 33: a per-handler backoff's retry-at,
# a released attempt's wake time): no claim takes the row before it. Null for
# none, and for events written before.
_V4 = ("alter table a2_events add column not_before integer",)

# Each event's payload schema version (issue 35, upcasting). Null for events
# written before, which read as version 1.
_V5 = ("alter table a2_events add column version integer",)

# Concurrency keys (issue 33): each event's key and limit, resolved at append,
# and the index that counts a key's live claims across sessions (only the
# alive rows with a key enter it).
_V6 = (
    "alter table a2_events add column concurrency_key text",
    "alter table a2_events add column concurrency_limit integer",
    """
    create index if not exists a2_events_concurrency
      on a2_events (concurrency_key, claim_expires_at)
      where concurrency_key is not null and processed_at is null and failed_at is null
    """,
)

# Each event's failed attempts (issue 36): the error of every failure, the
# latest rules.MAX_FAILED_ATTEMPTS per event, written only by a failure.
_V7 = (
    """
    create table if not exists a2_failed_attempts (
      session_id text not null,
      idx integer not null,
      attempt integer not null,
      error text not null,
      failed_at integer not null,
      holder text not null,
      claimed_at integer,
      primary key (session_id, idx, attempt)
    ) without rowid
    """,
)

# A debounced event's key, and the index of the later event whose append
# skipped it (issue 33). Null for others, and for events written before.
_V8 = (
    "alter table a2_events add column debounce_key text",
    "alter table a2_events add column debounced_by integer",
)

# The journal of durable handlers (issue 34): each event's completed steps by
# name, written once by the attempt that holds the claim (``seq`` keeps the
# order they were written in).
_V9 = (
    """
    create table if not exists a2_journal (
      session_id text not null,
      idx integer not null,
      name text not null,
      result text not null,
      attempt integer not null,
      at integer not null,
      seq integer not null,
      primary key (session_id, idx, name)
    ) without rowid
    """,
)

# Throttles (issue 33): each event's throttle key, limit and period, and the
# attempt starts of each key, as the instants they stop counting.
_V10 = (
    "alter table a2_events add column throttle_key text",
    "alter table a2_events add column throttle_limit integer",
    "alter table a2_events add column throttle_period_ms integer",
    """
    create table if not exists a2_flow_starts (
      throttle_key text not null,
      expires_at integer not null
    )
    """,
    """
    create index if not exists a2_flow_starts_key
      on a2_flow_starts (throttle_key, expires_at)
    """,
)

# Each event's priority (issue 33, ``priority=``): a claim takes higher
# first. Null for none, and for events written before.
_V11 = ("alter table a2_events add column priority integer",)

# A suspended durable wait's wake mark (issue 34): the event types (a JSON
# array) whose append makes the row claimable at once. Null for none, and
# for events written before; the partial index holds only marked rows, so an
# append's probe of it costs a seek into an index that is almost always empty.
_V12 = (
    "alter table a2_events add column wake_on text",
    """
    create index if not exists a2_events_waiting
      on a2_events (session_id, idx) where wake_on is not null
    """,
)

#: Statements per migration; entry ``n`` upgrades ``user_version`` ``n`` to ``n + 1``.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V10,
    _V11,
    _V12,
)

#: The version this release writes and reads.
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION` inside the caller's write
    transaction (``BEGIN IMMEDIATE``), so concurrent processes migrate once.

    Returns the version found. Raises ``STORE_UNAVAILABLE`` for a database
    written by a newer release: reading it could misread columns we do not know.
    """
    (found,) = conn.execute("pragma user_version").fetchone()
    if found > SCHEMA_VERSION:
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE,
            f"the sqlite database has schema version {found}, newer than the {SCHEMA_VERSION} "
            "this a2trio supports: upgrade a2trio or point the store at another file",
        )
    for statements in MIGRATIONS[found:]:
        for statement in statements:
            conn.execute(statement)
    if found < SCHEMA_VERSION:
        conn.execute(f"pragma user_version = {SCHEMA_VERSION}")
    return int(found)
