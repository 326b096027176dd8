"""The Postgres store's writes: appends, claims, renewals, completions and
failures, each one statement after the session's lock where it needs one
(see the store's module docstring for the exactly-once argument).

Inside ``async with store:`` appends, claims and completions go through the
store's group commit (:mod:`a2trio.stores.group`, in their callers' tasks,
each in its place by :func:`~.database.lock_order`); outside it each runs in
its own transaction. A write that inserts hands its rows to the store's
local feeds as it commits (the listener skips this store's own
notifications); one that ends without handing them over makes the feeds read.
The store's public methods delegate here; their docstrings say what each
promises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, cast

import msgspec
import trio

from ...clock import Clock
from ...ids import IdSource
from .. import rules as verdicts
from ..base import (
    AppendEvent,
    AppendResult,
    Busy,
    Claimed,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    EventCause,
    FailResult,
    ReleaseResult,
    RenewResult,
    Settled,
    StoredEvent,
)
from ..feed import Wakeups
from ..group import GroupCommit, GroupStatistics
from ..tasks import StoreTasks
from . import sql as sql
from .codec import BatchRow, cause_json, encode, stored_event
from .conn import Param, PgConnection, PgConnectionError, PgError, Row, Statement, errors
from .database import GROUPED, Database, Kind, Request, lock_order

__all__ = ["PostgresWrites"]

#: How often a completion or a claim runs again while a row it locked was
#: updated under it (each time by a transaction that committed between its
#: snapshot and its lock: see ``FINISH`` and ``CLAIM``).
_STALE_TRIES = 5
#: Group commits in flight at once: the store's three since its first group
#: commit (measured with ``bench/vs_queues.py``); the durable scheduler's
#: queue keeps ``DEFAULT_LEADERS``, two.
_GROUPS = 3


def _check_fence(
    session_id: str,
    events: Sequence[AppendEvent],
    missing_parent: int | None,
    superseded: int | None,
) -> None:
    """Raise what ``APPEND``'s attempt fence refused: the least cause index with
    no parent, else the least whose attempt lost its parent."""
    if missing_parent is not None:
        raise verdicts.no_event(session_id, missing_parent)
    if superseded is not None:
        cause = next(e.cause for e in events if e.cause and e.cause.index == superseded)
        raise verdicts.superseded_attempt(session_id, cause)


class PostgresWrites:
    """The store's writes on its ``db``, group-committed while its tasks
    (``tasks``) run, stamped by its ``clock``, with ids from ``new_id``;
    inserted rows go to its feeds' ``wakeups``."""

    def __init__(
        self,
        db: Database,
        tasks: StoreTasks,
        wakeups: Wakeups,
        *,
        clock: Clock,
        new_id: IdSource,
    ) -> None:
        self._db = db
        self._groups: GroupCommit[tuple[str, int], Request, list[Row]] = GroupCommit(
            db.run_group, rejected=(PgError,), lost=PgConnectionError, leaders=_GROUPS
        )
        self._tasks = tasks
        self._wakeups = wakeups
        self._clock = clock
        self._new_id = new_id
        #: (session, task) -> how many open app transactions that task appended
        #: to the session in (each holds its lock to its end): ``transaction``.
        self.held: dict[tuple[str, trio.lowlevel.Task], int] = {}
        #: Session -> open app transactions holding its lock: its writes that
        #: take the lock run alone, or a whole group would wait with them.
        self.holding: dict[str, int] = {}

    def _check_not_held(self, session_id: str) -> None:
        """Refuse what would wait forever: an append outside the app
        transaction that the same task holds the session's lock in."""
        if (session_id, trio.lowlevel.current_task()) in self.held:
            raise RuntimeError(
                f"this task's open app transaction appended to {session_id!r}: an append"
                " outside it would wait for its commit forever; pass transaction=tx"
            )

    @property
    def _grouped(self) -> bool:
        """Whether writes are group-committed: inside ``async with store``,
        until ``aclose()`` (or a task's failure) ends the store's tasks."""
        return self._tasks.nursery is not None

    def _locks_alone(self, session_id: str) -> bool:
        """Whether a write that takes the session's lock runs in its own
        transaction: outside the group commit, or while an app transaction
        here holds the lock (a group would wait for it with all its members)."""
        return not self._grouped or session_id in self.holding

    def group_statistics(self) -> GroupStatistics:
        """How claims and completions were group-committed."""
        return self._groups.statistics()

    async def _submit(
        self, kind: Kind, session_id: str, params: Sequence[Param], keys: Sequence[str] = ()
    ) -> list[Row]:
        """One statement through the group commit (its group locks ``keys``
        first, ``LOCK_INSERT_KEYS``): its rows."""
        request = Request(kind, session_id, params, keys)
        return await self._groups.submit(lock_order(request), request)

    def _wrote(self, session_id: str, rows: list[StoredEvent]) -> None:
        """A local write committed: hand its rows to local feeds (the listener
        skips this store's own notifications)."""
        self._wakeups.notify(session_id, rows)

    @contextmanager
    def _inserting(self, session_id: str) -> Iterator[None]:
        """Around a write that may insert: if it ends without handing its rows
        over (an error or cancellation, maybe after the commit), local feeds
        read instead, as another process's notification would make them."""
        try:
            yield
        except BaseException:
            self._wakeups.notify(session_id)
            raise

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
        on: PgConnection | None = None,
    ) -> AppendResult:
        """The store's append; ``on`` an app transaction's connection, where
        it runs after the session's lock, unclaimed, and hands its rows to no
        feed (the transaction wakes them once it commits)."""
        if on is None and self.held:
            self._check_not_held(session_id)
        with errors("append"):
            if not events:
                if on is None:
                    [(pending,)] = await self._db.query(sql.HAS_PENDING, (session_id,))
                else:
                    [[(pending,)]] = await on.run([(sql.HAS_PENDING, (session_id,))])
                return AppendResult([], pending)
            supplied = verdicts.supplied_ids(events)
            ids = [e.id or self._new_id() for e in events]
            batch = [
                BatchRow(
                    ord_,
                    event_id,
                    e.type,
                    e.payload,
                    e.settled,
                    None if e.cause is None else cause_json(e.cause),
                    e.lane,
                    e.trace_context,
                    e.version,
                    e.concurrency_key,
                    e.concurrency_limit,
                    e.delay_ms,
                    e.debounce_key,
                    e.throttle_key,
                    e.throttle_limit,
                    e.throttle_period_ms,
                    e.priority,
                )
                for ord_, (e, event_id) in enumerate(zip(events, ids, strict=True), 1)
            ]
            causes = sorted({e.cause.index for e in events if e.cause is not None})
            now = self._clock.now_ms()
            holder, expires_at = (
                (None, None) if claim is None else (claim.holder, now + claim.ttl_ms)
            )
            # Nothing to replay, refuse or fence: the lean statement.
            fresh = not supplied and not causes and expected_index is None
            kind: Kind = "append_fresh" if fresh else "append"
            params: tuple[Param, ...] = (
                (session_id, encode(batch), now, holder, expires_at)
                if fresh
                else (
                    session_id,
                    encode(batch),
                    supplied,
                    causes,
                    now,
                    holder,
                    expires_at,
                    expected_index,
                )
            )
            debounced = [i for e, i in zip(events, ids, strict=True) if e.debounce_key is not None]
            # The keys whose rows a claim at insert may take: locked by the
            # group, tried by an append alone (`TRY_KEYS`).
            keys = (
                sorted({e.concurrency_key for e in events if e.concurrency_key is not None})
                if claim is not None
                else []
            )
            tried = [(sql.TRY_KEYS, (keys,))] if keys else []
            with self._inserting(session_id):
                if on is not None:
                    lock = (sql.LOCK, (session_id, self._db.origin))
                    run: list[tuple[Statement, Sequence[Param]]] = [lock, (GROUPED[kind], params)]
                    if debounced:
                        run.append((sql.DEBOUNCE, (session_id, now, debounced)))
                    [_, rows, *_] = await on.run(run)
                elif debounced:
                    # Its skips in the append's transaction (`DEBOUNCE`).
                    [*_, rows, _] = await self._db.transaction(
                        [
                            *tried,
                            (GROUPED[kind], params),
                            (sql.DEBOUNCE, (session_id, now, debounced)),
                        ],
                        lock=session_id,
                    )
                elif self._locks_alone(session_id):
                    [*_, rows] = await self._db.transaction(
                        [*tried, (GROUPED[kind], params)], lock=session_id
                    )
                else:
                    rows = await self._submit(kind, session_id, params, keys)
        if fresh:
            had_pending, base, claimed_indexes, others_claimable = rows[0]
        else:
            n_existing, missing_parent, superseded = rows[0][:3]
            had_pending, base, claimed_indexes, others_claimable = rows[0][3:7]
            if n_existing:
                # The duplicate verdict before the fence, as in the seed.
                replayed = verdicts.replayed_batch(
                    session_id, events, [stored_event(r, 7) for r in rows]
                )
                return AppendResult(replayed, had_pending, [], others_claimable)
            _check_fence(session_id, events, missing_parent, superseded)
            if expected_index is not None and base != expected_index:
                raise verdicts.stale_index(session_id, expected_index, base)
        inserted = [
            StoredEvent(
                id=event_id,
                type=e.type,
                payload=e.payload,
                index=base + ord_,
                session_id=session_id,
                created_at_ms=now,
                cause=e.cause,
                lane=e.lane,
                processed_at_ms=now if e.settled else None,
                trace_context=e.trace_context,
                version=e.version,
                concurrency_key=e.concurrency_key,
                concurrency_limit=e.concurrency_limit,
                not_before_ms=None if e.delay_ms is None else now + e.delay_ms,
                debounce_key=e.debounce_key,
                throttle_key=e.throttle_key,
                throttle_limit=e.throttle_limit,
                throttle_period_ms=e.throttle_period_ms,
                priority=e.priority,
            )
            for ord_, (e, event_id) in enumerate(zip(events, ids, strict=True), 1)
        ]
        claimed_set = set(claimed_indexes)
        if claimed_set:
            # As the statement stored them: claimed as they were written.
            inserted = [
                msgspec.structs.replace(
                    row,
                    attempt_count=1,
                    first_claimed_at_ms=now,
                    last_claimed_at_ms=now,
                    claim_holder=holder,
                    claim_expires_at_ms=expires_at,
                )
                if row.index in claimed_set
                else row
                for row in inserted
            ]
        if on is None:
            self._wrote(session_id, inserted)
        return AppendResult(
            inserted,
            verdicts.has_pending(had_pending, events),
            [row for row in inserted if row.index in claimed_set],
            others_claimable,
        )

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        for _ in range(_STALE_TRIES):
            with errors("claim"):
                now = self._clock.now_ms()
                expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
                params = (session_id, now, holder, expires_at, list(exclude), limit)
                if not self._grouped:
                    rows = await self._db.query(sql.CLAIM, params)
                else:
                    rows = await self._submit("claim", session_id, params)
            if rows[0][-1]:
                return await self._claim_keyed(params)
            claimed = [stored_event(row, 1) for row in rows if row[1] is not None]
            if claimed:
                # Rows missed as stale stay claimable for the drain's next claim.
                return Claimed(claimed)
            if not rows[0][-2]:
                break
        retry_at = rows[0][0]
        return Settled() if retry_at is None else Busy(retry_at)

    async def _claim_keyed(self, params: tuple[Param, ...]) -> ClaimResult:
        """The claim of a session with keyed rows (``rules.flow``): its keys
        locked, then ``CLAIM_KEYED``, in one transaction of its own (outside
        the group commit, whose session locks it would otherwise order
        against key locks)."""
        session_id, now, _, _, exclude, _ = params
        for _ in range(_STALE_TRIES):
            with errors("claim"):
                _, rows = await self._db.transaction(
                    [(sql.LOCK_KEYS, (session_id, now, exclude)), (sql.CLAIM_KEYED, params)],
                    lock=None,
                )
            claimed = [stored_event(row, 3) for row in rows if row[3] is not None]
            waiting, throttled = list(rows[0][1]), list(rows[0][2])
            if claimed:
                return Claimed(claimed, waiting, throttled)
            if not rows[0][-1]:
                break
        retry_at = rows[0][0]
        return Settled() if retry_at is None else Busy(retry_at, waiting, throttled)

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        if not claims:
            await trio.lowlevel.checkpoint()
            return RenewResult([], [])
        with errors("renew"):
            now = self._clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            attempts = {c.index: c.attempt for c in claims}
            rows = await self._db.query(
                sql.RENEW,
                (
                    expires_at,
                    session_id,
                    [c.index for c in claims],
                    holder,
                    now,
                    [c.attempt for c in claims],
                ),
            )
        renewed = sorted(index for index, _, ok in rows if ok)
        superseded = sorted(
            index for index, count, ok in rows if not ok and count > attempts.get(index, 0)
        )
        return RenewResult(renewed, superseded)

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        if not events:
            return await self._finish(session_id, index, attempt)
        returned = verdicts.returned_ids(events)
        batch = [
            BatchRow(
                ord_,
                e.id,
                e.type,
                e.payload,
                e.settled,
                lane=e.lane,
                trace=e.trace_context,
                version=e.version,
                flow_key=e.concurrency_key,
                flow_limit=e.concurrency_limit,
                delay=e.delay_ms,
                debounce=e.debounce_key,
                throttle_key=e.throttle_key,
                throttle_limit=e.throttle_limit,
                throttle_period=e.throttle_period_ms,
                priority=e.priority,
            )
            for ord_, e in enumerate(events, 1)
        ]
        now = self._clock.now_ms()
        params = (
            session_id,
            index,
            returned,
            attempt,
            encode(batch),
            now,
            encode(cause_json(EventCause(index, attempt))),
            encode(returned),
        )
        debounced = [i for e, i in zip(events, returned, strict=True) if e.debounce_key is not None]
        with errors("complete"), self._inserting(session_id):
            if debounced:
                # Its skips in the completion's transaction, after it (so the
                # trigger, processed by then, is never one of them).
                [rows, _] = await self._db.transaction(
                    [(sql.COMPLETE, params), (sql.DEBOUNCE, (session_id, now, debounced))],
                    lock=session_id,
                )
            elif self._locks_alone(session_id):
                [rows] = await self._db.transaction([(sql.COMPLETE, params)], lock=session_id)
            else:
                rows = await self._submit("complete", session_id, params)
        outcome, processed_by_attempt, returned_event_ids, drained = rows[0][:4]
        stored = [stored_event(row, 4) for row in rows if row[4] is not None]
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        if outcome == "superseded":
            return CompleteResult("superseded")
        if outcome == "duplicate":
            raise verdicts.returned_id_taken()
        if outcome == "replay":
            if not verdicts.replays_completion(
                attempt, returned, processed_by_attempt, returned_event_ids
            ):
                return CompleteResult("superseded")
            replayed = verdicts.replayed_completion(session_id, index, attempt, events, stored)
            return CompleteResult("completed", replayed)
        if stored:
            self._wrote(session_id, stored)
        return CompleteResult("completed", stored, drained)

    async def _finish(self, session_id: str, index: int, attempt: int) -> CompleteResult:
        """``complete_attempt`` without returned events, through ``FINISH``,
        again while its row answers ``stale`` (updated by another transaction
        after the statement's snapshot: see ``FINISH``)."""
        for _ in range(_STALE_TRIES):
            now = self._clock.now_ms()
            with errors("complete"):
                if self._locks_alone(session_id):
                    [_, rows] = await self._db.transaction(
                        [
                            (sql.LOCK_IF_LANED, (session_id, [index])),
                            (sql.FINISH, (session_id, [index], [attempt], now)),
                        ],
                        lock=None,
                    )
                else:
                    params = (session_id, index, attempt, now)
                    rows = await self._submit("finish", session_id, params)
            [(_, outcome, processed_by_attempt, returned_event_ids, drained)] = rows
            if outcome != "stale":
                break
        else:
            with errors("complete"):
                raise RuntimeError(f"event {index} was updated under {_STALE_TRIES} completions")
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        if outcome == "superseded":
            return CompleteResult("superseded")
        if outcome == "replay":
            if not verdicts.replays_completion(
                attempt, [], processed_by_attempt, returned_event_ids
            ):
                return CompleteResult("superseded")
            return CompleteResult("completed", [])
        return CompleteResult("completed", [], drained)

    async def fail_attempt(
        self,
        session_id: str,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
        retry_after_ms: int | None,
    ) -> FailResult:
        now = self._clock.now_ms()
        with errors("fail"):
            [(outcome, failure_count, retry_at)] = await self._db.query(
                sql.FAIL, (session_id, index, attempt, error, max_failures, now, retry_after_ms)
            )
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        return FailResult(
            cast(Literal["failed", "dead_lettered", "superseded"], outcome),
            failure_count,
            retry_at,
        )

    async def release_attempt(
        self,
        session_id: str,
        index: int,
        attempt: int,
        delay_ms: int | None,
        wake_on: Sequence[str],
        seen_through: int | None,
    ) -> ReleaseResult:
        now = self._clock.now_ms()
        not_before = verdicts.NEVER_MS if delay_ms is None else now + delay_ms
        mark = list(wake_on) or None
        with errors("release"):
            [(outcome, stored)] = await self._db.query(
                sql.RELEASE, (session_id, index, attempt, not_before, mark, seen_through, now)
            )
        if outcome == "missing":
            raise verdicts.no_event(session_id, index)
        if outcome == "superseded":
            return ReleaseResult("superseded")
        return ReleaseResult("released", int(stored))
