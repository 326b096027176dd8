"""The memory store's operator actions (``OperatorActions``): dead letters,
redrive, skip, retry now and the actions' record, over the store's rows.

Each action decides with ``rules`` (``check_action``, ``retry_targets``) and
writes without an await in between, so it is atomic under Trio, as the
store's own operations are.
"""

from __future__ import annotations

import trio

from ...clock import Clock
from .. import rules
from ..base import ActionKind, OperatorAction, StoredEvent
from .rows import Row, settle

__all__ = ["MemoryOperator"]


class MemoryOperator:
    """The operator actions over the store's ``sessions`` (every row, by
    session), ``open_rows`` (the unprocessed ones) and ``trimmed`` (trim
    points: a trimmed event is no event), stamped by its ``clock``. The
    actions recorded are kept here."""

    def __init__(
        self,
        clock: Clock,
        sessions: dict[str, list[Row]],
        open_rows: dict[str, dict[int, Row]],
        trimmed: dict[str, int],
    ) -> None:
        self._clock = clock
        self._sessions = sessions
        self._open = open_rows
        self._trimmed = trimmed
        self._actions: dict[str, list[OperatorAction]] = {}

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: dead letters stay open
        (they stall their lane), so a pass over the open rows finds them."""
        await trio.lowlevel.checkpoint()
        found = sorted(
            (key, row.index)
            for key, rows in self._open.items()
            if key.startswith(prefix)
            for row in rows.values()
            if row.failed_at_ms is not None and (after is None or (key, row.index) > after)
        )
        return [self._open[key][index].stored() for key, index in found[:limit]]

    def _target(self, session_id: str, index: int) -> Row | None:
        rows = self._sessions.get(session_id, [])
        first = self._trimmed.get(session_id, 0) + 1
        return rows[index - 1] if first <= index <= len(rows) else None

    def _record(
        self, session_id: str, index: int, action: ActionKind, by: str, reason: str, now: int
    ) -> OperatorAction:
        record = OperatorAction(action, session_id, index, by, reason, now)
        self._actions.setdefault(session_id, []).append(record)
        return record

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        row = self._target(session_id, index)
        rules.check_action("redrive", session_id, index, row, now)
        assert row is not None
        row.failure_count = 0
        row.failed_at_ms = None
        return self._record(session_id, index, "redrive", by, reason, now)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        row = self._target(session_id, index)
        rules.check_action("skip", session_id, index, row, now)
        assert row is not None
        settle(self._open[session_id], row, now)
        return self._record(session_id, index, "skip", by, reason, now)

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.wake` (the session's list of marked
        rows drops the index at the next append that meets it)."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        row = self._target(session_id, index)
        rules.check_wake(session_id, index, row, now)
        assert row is not None
        row.not_before_ms = None
        row.wake_on = None
        return self._record(session_id, index, "wake", by, reason, now)

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`."""
        await trio.lowlevel.checkpoint()
        now = self._clock.now_ms()
        candidates = [
            (row.index, row.claim_expires_at_ms)
            for row in self._open.get(session_id, {}).values()
            if rules.alive(row) and row.lane_ready
        ]
        targets = rules.retry_targets(session_id, candidates, now)
        return [self._record(session_id, i, "retry_now", by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`."""
        await trio.lowlevel.checkpoint()
        found = [
            a for a in self._actions.get(session_id, []) if after_index < a.index <= through_index
        ]
        return sorted(found, key=lambda a: a.index)

    def recorded(self, session_id: str) -> list[OperatorAction]:
        """Every action recorded on the session, in order (an export)."""
        return sorted(self._actions.get(session_id, []), key=lambda a: a.index)

    def forget(self, session_id: str) -> int:
        """Drop the session's actions (an erasure); how many there were."""
        return len(self._actions.pop(session_id, []))
