"""The Postgres store's retention (issue 35): export, erase and trim a
session, and the trim point's check on the store's reads (``check_read``).

An export is one statement, so one snapshot: the session's snapshots and
operator actions as JSON beside its event rows. An erasure is one
transaction under the session's append lock (no append interleaves):
``LOCK_OPEN`` first locks the session's unprocessed rows, the only ones a
claim can take, so a claim committing meanwhile is waited for and seen;
then ``ERASE`` decides and deletes in one statement. It removes only when
no claim is live (the ``claim_live`` fragment of ``rules.claim_free``) and
the session is at the expected index; it returns the facts it decided on,
which ``rules.check_unclaimed`` and ``rules.check_expected`` turn into the
refusal, and what it removed. A trim is the same transaction with ``TRIM``,
which decides by the fragment of ``rules.trim_point`` (:func:`trim_point`)
and returns its facts for ``rules.check_trim``.
"""

from __future__ import annotations

from typing import Final

from ...clock import Clock
from .. import rules
from ..base import ArchivedSnapshot, Erased, OperatorAction, SessionArchive, Trimmed
from . import sql as sql
from .codec import stored_event
from .conn import Row, Statement, errors
from .database import Database

__all__ = ["ERASE", "EXPORT", "FIRST_INDEX", "LOCK_OPEN", "TRIM", "PostgresRetention", "trim_point"]

#   $1 session
EXPORT: Final = Statement(
    f"""
select
  (select coalesce(jsonb_agg(jsonb_build_array(reducer_name, up_to_index, state, updated_at)
                             order by reducer_name), '[]'::jsonb)
     from a2_snapshots where session_id = $1::text),
  (select coalesce(jsonb_agg(jsonb_build_array(action, idx, actor, reason, at)
                             order by idx, id), '[]'::jsonb)
     from a2_operator_actions where session_id = $1::text),
  e.*
from (select 1) one
left join lateral (
  select {sql.EVENT_COLUMNS} from a2_events where session_id = $1::text
) e on true
order by e.idx
"""
)

#   $1 session
LOCK_OPEN: Final = Statement(
    "select 1 from a2_events where session_id = $1::text and processed_at is null for update"
)

#   $1 session, $2 now, $3 expected index or null
ERASE: Final = Statement(
    f"""
with held as (
  select e.idx, e.claim_holder, e.attempt_count, e.claim_expires_at from a2_events e
   where e.session_id = $1::text and e.processed_at is null and e.claim_holder is not null
     and {sql.claim_live("e", "$2::bigint")}
   order by e.idx limit 1
), top as (
  select coalesce(max(idx), 0) as n from a2_events where session_id = $1::text
), go as (
  select 1 where not exists (select 1 from held)
     and ($3::bigint is null or (select n from top) = $3::bigint)
), events as (
  delete from a2_events where session_id = $1::text and exists (select 1 from go) returning 1
), snapshots as (
  delete from a2_snapshots where session_id = $1::text and exists (select 1 from go) returning 1
), actions as (
  delete from a2_operator_actions where session_id = $1::text and exists (select 1 from go)
  returning 1
), presence as (
  delete from a2_presence where ns = $1::text and exists (select 1 from go) returning 1
), failures as (
  delete from a2_failed_attempts where session_id = $1::text and exists (select 1 from go)
), journal as (
  -- The durable handlers' steps (issue 34): not counted in `Erased`.
  delete from a2_journal where session_id = $1::text and exists (select 1 from go)
)
select (select n from top), h.idx, h.claim_holder, h.attempt_count, h.claim_expires_at,
       (select count(*) from events), (select count(*) from snapshots),
       (select count(*) from actions), (select count(*) from presence)
from (select 1) one left join held h on true
"""
)


# rules.trim_point: a snapshot's index, or the one before the last, at least 0.
def trim_point(snapshot: str, index: str) -> str:
    return f"greatest(least({snapshot}, {index} - 1), 0)"


#   $1 session
FIRST_INDEX: Final = Statement("select min(idx) from a2_events where session_id = $1::text")

#   $1 session, $2 now, $3 reducer. Removes only with no live claim, a
#   snapshot, and no unprocessed event at or below the point.
TRIM: Final = Statement(
    f"""
with held as (
  select e.idx, e.claim_holder, e.attempt_count, e.claim_expires_at from a2_events e
   where e.session_id = $1::text and e.processed_at is null and e.claim_holder is not null
     and {sql.claim_live("e", "$2::bigint")}
   order by e.idx limit 1
), facts as (
  select (select up_to_index from a2_snapshots
           where session_id = $1::text and reducer_name = $3::text) as snapshot,
         (select coalesce(max(idx), 0) from a2_events where session_id = $1::text) as top,
         (select min(idx) from a2_events
           where session_id = $1::text and processed_at is null) as first_open,
         (select min(idx) from a2_events where session_id = $1::text) as first
), point as (
  select {trim_point("snapshot", "top")} as p from facts where snapshot is not null
), go as (
  select p from point, facts
   where not exists (select 1 from held) and (first_open is null or first_open > p)
), gone as (
  delete from a2_events where session_id = $1::text and idx <= (select p from go) returning 1
), failures as (
  delete from a2_failed_attempts where session_id = $1::text and idx <= (select p from go)
), journal as (
  delete from a2_journal where session_id = $1::text and idx <= (select p from go)
)
select f.snapshot, f.top, f.first_open, f.first, h.idx, h.claim_holder, h.attempt_count,
       h.claim_expires_at, (select count(*) from gone)
from facts f left join held h on true
"""
)


class PostgresRetention:
    """:class:`~a2trio.stores.base.Retention` on the store's ``db``, stamped
    by its ``clock``."""

    def __init__(self, db: Database, *, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def export(self, session_id: str) -> SessionArchive:
        """See :meth:`Retention.export`: one statement. Cancellation: a read."""
        with errors("export"):
            rows = await self._db.query(EXPORT, (session_id,))
        snapshots = [ArchivedSnapshot(*s) for s in rows[0][0]]
        actions = [
            OperatorAction(kind, session_id, index, by, reason, at)
            for kind, index, by, reason, at in rows[0][1]
        ]
        events = [stored_event(row, 2) for row in rows if row[2] is not None]
        last = events[-1].index if events else 0
        return SessionArchive(session_id, last, events, snapshots, actions)

    async def erase(self, session_id: str, *, expected_index: int | None = None) -> Erased:
        """See :meth:`Retention.erase`: one transaction under the session's
        lock. Cancellation: removed entirely or not at all."""
        now = self._clock.now_ms()
        with errors("erase"):
            [_, [row]] = await self._db.transaction(
                [(LOCK_OPEN, (session_id,)), (ERASE, (session_id, now, expected_index))],
                lock=session_id,
            )
        index, held, holder, attempts, expires, *removed = row
        if held is not None:
            rules.check_unclaimed(session_id, rules.HeldClaim(held, holder, attempts, expires))
        rules.check_expected(session_id, expected_index, index)
        events, snapshots, actions, presence = removed
        return Erased(session_id, events, snapshots, actions, presence, now)

    async def trim(self, session_id: str, reducer: str) -> Trimmed:
        """See :meth:`Retention.trim`: one transaction under the session's
        lock. Cancellation: removed entirely or not at all."""
        now = self._clock.now_ms()
        with errors("trim"):
            [_, [row]] = await self._db.transaction(
                [(LOCK_OPEN, (session_id,)), (TRIM, (session_id, now, reducer))],
                lock=session_id,
            )
        snapshot, top, first_open, first, held, holder, attempts, expires, removed = row
        if held is not None:
            rules.check_unclaimed(session_id, rules.HeldClaim(held, holder, attempts, expires))
        point = rules.check_trim(session_id, reducer, snapshot, top, first_open)
        through = point if first is None else max(point, first - 1)
        return Trimmed(session_id, reducer, through, removed, now)

    async def check_read(
        self, session_id: str, after: int, through: int | None, rows: list[Row]
    ) -> None:
        """``rules.check_read`` over a read's rows (``EVENT_COLUMNS``), with
        the session's first index read when it must be. Inside the caller's
        ``errors``."""
        first = rows[0][3] if rows else None
        if rules.needs_first_index(after, through, bool(rows)):
            [(first,)] = await self._db.query(FIRST_INDEX, (session_id,))
        rules.check_read(session_id, after, through, first)
