"""The Postgres store's operator actions (``OperatorActions``): dead letters,
redrive, skip, retry now and the actions' record.

Each action reads its target, decides with ``rules`` (the seed's verdicts,
once), then writes with a compare-and-set on the row as read, recording the
action and announcing it on the events channel (``NOTIFY``, so other
processes' drains claim at once) in the same transaction.
:class:`PostgresOperator` is the store's ``store.operator``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from ...clock import Clock
from ...errors import A2Error, ErrorCode
from .. import rules as verdicts
from ..base import OperatorAction, StoredEvent
from . import sql as sql
from .codec import stored_event
from .conn import errors
from .database import Database

__all__ = ["PostgresOperator"]

#: Compare-and-set rounds of an operator action before giving up (each loses
#: only to a concurrent write of the target's row).
_CAS_ROUNDS = 16


class _Target(NamedTuple):
    """What an operator action's fence reads (``rules.ActionTarget``),
    in ``ACTION_TARGET``'s order."""

    processed_at_ms: int | None
    failed_at_ms: int | None
    attempt_count: int
    claim_holder: str | None
    failure_count: int
    last_failed_attempt: int | None
    claim_expires_at_ms: int | None
    not_before_ms: int | None


class PostgresOperator:
    """The store's operator actions on its ``db``, stamped by its ``clock``."""

    def __init__(self, db: Database, *, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: the partial index over
        dead rows. Cancellation: a read."""
        low, low_index = after if after is not None else (None, 0)
        with errors("dead letters"):
            rows = await self._db.query(sql.DEAD_LETTERS, (prefix, low, low_index, limit))
        return [stored_event(row) for row in rows]

    async def _act(
        self,
        action: Literal["redrive", "skip", "wake"],
        session_id: str,
        index: int,
        by: str,
        reason: str,
    ) -> OperatorAction:
        statement = {"redrive": sql.REDRIVE, "skip": sql.SKIP, "wake": sql.WAKE}[action]
        with errors(action):
            for _ in range(_CAS_ROUNDS):
                found = await self._db.query(sql.ACTION_TARGET, (session_id, index))
                now = self._clock.now_ms()
                row = None if not found else _Target(*found[0])
                if action == "wake":
                    verdicts.check_wake(session_id, index, row, now)
                else:
                    verdicts.check_action(action, session_id, index, row, now)
                assert row is not None
                as_read = (
                    row.processed_at_ms,
                    row.failed_at_ms,
                    row.attempt_count,
                    row.claim_holder,
                    row.claim_expires_at_ms,
                )
                params = (
                    session_id,
                    index,
                    *as_read,
                    by,
                    reason,
                    now,
                    *self._db.notice(session_id),
                    *((row.not_before_ms,) if action == "wake" else ()),
                )
                [written] = await self._db.transaction([(statement, params)], lock=session_id)
                if written:
                    return OperatorAction(action, session_id, index, by, reason, now)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{action} failed: the event's row kept changing under it"
        )

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`: a compare-and-set on the row
        as read, recorded and announced in one transaction. Cancellation:
        committed entirely or not at all."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`: as :meth:`redrive`, under the
        session's append lock (the lane is handed on). Cancellation: all or
        nothing."""
        return await self._act("skip", session_id, index, by, reason)

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.wake`: as :meth:`redrive`, the
        not-before as read compared too. Cancellation: all or nothing."""
        return await self._act("wake", session_id, index, by, reason)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`: recorded and announced
        (``NOTIFY``) in one transaction, so other processes' drains claim at
        once. Cancellation: all or nothing."""
        with errors("retry now"):
            candidates = await self._db.query(sql.RETRY_CANDIDATES, (session_id,))
            now = self._clock.now_ms()
            targets = verdicts.retry_targets(session_id, [(i, x) for i, x in candidates], now)
            await self._db.transaction(
                [
                    (
                        sql.RETRY_NOW,
                        (session_id, targets, by, reason, now, *self._db.notice(session_id)),
                    )
                ],
                lock=None,
            )
        return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`. Cancellation: a read."""
        with errors("read actions"):
            rows = await self._db.query(sql.READ_ACTIONS, (session_id, after_index, through_index))
        return [OperatorAction(*row) for row in rows]
