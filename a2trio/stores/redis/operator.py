"""The Redis store's operator actions (``OperatorActions``): dead letters,
redrive, skip, retry now, and the actions recorded on a session.

The verdicts are ``rules``' (``check_action``, ``retry_targets``) over the
rows as read; a redrive or a skip is written back, recorded and announced on
the pending channel by one compare-and-set script, retried if the row moved.
:class:`RedisOperator` is the store's ``store.operator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from ...errors import A2Error, ErrorCode
from .. import rules as verdicts
from ..base import OperatorAction, StoredEvent
from . import codec
from . import scripts as lua
from .conn import errors
from .scripts import CAS_ROUNDS, SWEEP_PAGE

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection

__all__ = ["RedisOperator"]


class RedisOperator:
    """Args: ``conn``, the store's command client; ``keys``, its key names;
    ``clock``, its clock (the actions' times); ``origin``, its instance id
    (its drains skip their own announcements)."""

    def __init__(self, conn: Connection, keys: Keys, clock: Clock, origin: str) -> None:
        self._conn = conn
        self._keys = keys
        self._clock = clock
        self._origin = origin

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """See :meth:`OperatorActions.dead_letters`: a pass over the sessions
        with open events (dead letters stay open), reading only those whose
        head counts a dead letter. Cancellation: a read."""
        keys = self._keys
        found: list[StoredEvent] = []
        start = prefix if after is None else after[0]
        low = b"[" + start.encode()
        high = b"(" + prefix.encode() + b"\xff"
        with errors("dead letters"):
            while len(found) < limit:
                page = [
                    codec.text(sid)
                    for sid in await self._conn.run(
                        lua.LIST, [keys.global_key("open-sessions")], [low, high, SWEEP_PAGE]
                    )
                ]
                if not page:
                    break
                session_keys = [k for sid in page for k in keys.session_keys(sid)]
                flats = await self._conn.run(lua.DEAD_LETTERS, session_keys, [])
                for sid, flat in zip(page, flats, strict=True):
                    found += [
                        row
                        for row in codec.rows(sid, flat)
                        if after is None or (sid, row.index) > after
                    ]
                if len(page) < SWEEP_PAGE:
                    break
                low = b"(" + page[-1].encode()
        return found[:limit]

    def _record_keys(self, session_id: str) -> list[str]:
        return [self._keys.key(session_id, "actions"), self._keys.global_key("pending:watched")]

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.redrive`: the verdict over the row as
        read, written back, recorded and announced by one compare-and-set
        script. Cancellation: recorded or not."""
        return await self._act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.skip`: as :meth:`redrive`; leaving the
        open set hands the lane on. Cancellation: recorded or not."""
        return await self._act("skip", session_id, index, by, reason)

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """See :meth:`OperatorActions.wake`: as :meth:`redrive`.
        Cancellation: recorded or not."""
        return await self._act("wake", session_id, index, by, reason)

    async def _act(
        self,
        action: Literal["redrive", "skip", "wake"],
        session_id: str,
        index: int,
        by: str,
        reason: str,
    ) -> OperatorAction:
        """A redrive, a skip or a wake: ``rules.check_action`` (or
        ``check_wake``) over the row as read, then ``ACTION_WRITE``."""
        keys = self._keys
        with errors(action):
            for _ in range(CAS_ROUNDS):
                front, raw = await self._conn.run(
                    lua.FAIL_READ, keys.session_keys(session_id), [index]
                )
                now = self._clock.now_ms()
                row = (
                    None
                    if not 1 <= index <= int(front)
                    else codec.SETTLED
                    if raw is None
                    else codec.decode_meta(raw)
                )
                if action == "wake":
                    verdicts.check_wake(session_id, index, row, now)
                else:
                    verdicts.check_action(action, session_id, index, row, now)
                assert row is not None
                if action == "wake":
                    changed = msgspec.structs.replace(row, not_before_ms=None, wake_on=None)
                elif action == "redrive":
                    changed = msgspec.structs.replace(row, failure_count=0, failed_at_ms=None)
                else:
                    changed = msgspec.structs.replace(
                        row,
                        processed_at_ms=now,
                        failed_at_ms=None,
                        claim_holder=None,
                        claim_expires_at_ms=None,
                    )
                record = codec.Action(action, index, by, reason, now)
                written = await self._conn.run(
                    lua.ACTION_WRITE,
                    [
                        keys.key(session_id, "meta"),
                        keys.key(session_id, "open"),
                        keys.key(session_id, "head"),
                        keys.global_key("open-sessions"),
                        *self._record_keys(session_id),
                    ],
                    [
                        index,
                        raw,
                        codec.encode(changed),
                        "1" if row.failed_at_ms is not None else "0",
                        "1" if action == "skip" else "0",
                        codec.encode(record),
                        session_id,
                        keys.global_key("pending"),
                        self._origin,
                    ],
                )
                if written:
                    return OperatorAction(action, session_id, index, by, reason, now)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{action} failed: the event's row kept changing under it"
        )

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`OperatorActions.retry_now`: recorded and announced on
        the pending channel, so other processes' drains claim at once.
        Cancellation: recorded or not."""
        keys = self._keys
        with errors("retry now"):
            flat = await self._conn.run(lua.RETRY_CANDIDATES, keys.session_keys(session_id), [])
            now = self._clock.now_ms()
            candidates = [
                (int(flat[i]), None if flat[i + 1] is None else int(flat[i + 1]))
                for i in range(0, len(flat), 2)
            ]
            targets = verdicts.retry_targets(session_id, candidates, now)
            records = [codec.Action("retry_now", i, by, reason, now) for i in targets]
            await self._conn.run(
                lua.RECORD_ACTIONS,
                self._record_keys(session_id),
                [
                    keys.global_key("pending"),
                    f"{self._origin} {session_id}",
                    *(codec.encode(r) for r in records),
                ],
            )
        return [OperatorAction("retry_now", session_id, i, by, reason, now) for i in targets]

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """See :meth:`OperatorActions.read_actions`: the session's list (its
        actions are few). Cancellation: a read."""
        with errors("read actions"):
            raws = await self._conn.run(lua.LRANGE, [self._keys.key(session_id, "actions")], [])
        actions = [codec.decode_action(raw) for raw in raws]
        return sorted(
            (
                OperatorAction(a.action, session_id, a.index, a.by, a.reason, a.at_ms)
                for a in actions
                if after_index < a.index <= through_index
            ),
            key=lambda a: a.index,
        )
