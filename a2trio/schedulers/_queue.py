"""The task queue seam under the schedulers, and its in-memory implementation.

A queue holds encoded tasks keyed by task id, each with a due time and a lease.
The scheduler engine (``_engine.py``) claims due rows under a lease token,
delivers them, then deletes them (success) or reschedules them (failure,
cancellation). Every row operation is one transaction on the durable
backends; a token-guarded write from a holder whose lease lapsed does nothing.

All times are epoch milliseconds from the scheduler's :class:`~a2trio.Clock`.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import msgspec
import trio

from ..stores.group import GroupStatistics

if TYPE_CHECKING:
    from ..stores.feed import Wakeups

__all__ = ["MemoryQueue", "NotifyingQueue", "TaskQueue", "TaskRow"]


class TaskRow(msgspec.Struct, frozen=True):
    """A claimed task: its id, encoded body and how many times it was claimed."""

    id: str
    body: bytes
    attempts: int


class TaskQueue(Protocol):
    """What a scheduler backend implements. Every method is a checkpoint.

    Cancellation: each write is atomic. A cancelled call either committed or
    changed nothing; retrying it with the same arguments is safe.
    """

    #: How tasks added by other processes are noticed: ``"none"`` (no other
    #: process can add any), ``"poll"`` (every ``Timings.poll_idle_s``) or
    #: ``"notify"`` (a :class:`NotifyingQueue`; re-read every
    #: ``Timings.notify_safety_s`` in case a notification is lost).
    cross_process: Literal["none", "poll", "notify"]

    async def open(self) -> None:
        """Connect and create the schema if missing."""

    async def aclose(self) -> None:
        """Disconnect; idempotent."""

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        """Add a task unless ``task_id`` exists; True if this call added it."""

    async def claim(
        self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int
    ) -> list[TaskRow]:
        """Lease up to ``limit`` due, unleased tasks of ``contract``, earliest first."""

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        """Extend a lease this token holds; False if it is no longer held."""

    async def delete(self, task_id: str, token: str) -> None:
        """Remove a delivered task (only while this token holds it)."""

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        """Drop the lease and make the task due at ``due_at_ms`` (only while held)."""

    async def next_due(self, contract: str) -> int | None:
        """When the next task of ``contract`` becomes claimable, or None if none is queued."""

    async def count(self, contract: str | None = None) -> int:
        """How many tasks are queued (leased or not), for one contract or all."""

    def group_statistics(self) -> GroupStatistics:
        """How the writes were committed (no I/O)."""


@runtime_checkable
class NotifyingQueue(Protocol):
    """A queue that hears about other processes' inserts."""

    async def listen(
        self, wakeups: Wakeups, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled: ``wakeups.notify(contract)`` for every task
        another process adds. Reports started at once; after a reconnect it
        calls ``wakeups.notify_all()``, since notifications may have been lost.
        """


class _Row:
    __slots__ = (
        "attempts",
        "body",
        "contract",
        "due_at_ms",
        "error",
        "leased_until_ms",
        "order",
        "token",
    )

    def __init__(self, contract: str, due_at_ms: int, body: bytes, order: int) -> None:
        self.contract = contract
        self.due_at_ms = due_at_ms
        self.body = body
        self.order = order
        self.attempts = 0
        self.leased_until_ms: int | None = None
        self.token: str | None = None
        self.error: str | None = None

    def ready_at(self) -> int:
        if self.leased_until_ms is None:
            return self.due_at_ms
        return max(self.due_at_ms, self.leased_until_ms)


class MemoryQueue:
    """Tasks in a dict: the :class:`~a2trio.schedulers.LocalScheduler` backend.

    Lives as long as the scheduler object, so tasks survive a server's restart
    inside one process but not the process.
    """

    cross_process: Literal["none", "poll", "notify"] = "none"

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._order = itertools.count()

    async def open(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    async def insert(self, task_id: str, contract: str, due_at_ms: int, body: bytes) -> bool:
        await trio.lowlevel.checkpoint()
        if task_id in self._rows:
            return False
        self._rows[task_id] = _Row(contract, due_at_ms, body, next(self._order))
        return True

    async def claim(
        self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int
    ) -> list[TaskRow]:
        await trio.lowlevel.checkpoint()
        due = sorted(
            (
                (row.due_at_ms, row.order, task_id)
                for task_id, row in self._rows.items()
                if row.contract == contract and row.ready_at() <= now_ms
            ),
        )[:limit]
        claimed = []
        for _, _, task_id in due:
            row = self._rows[task_id]
            row.attempts += 1
            row.leased_until_ms = now_ms + lease_ms
            row.token = token
            claimed.append(TaskRow(task_id, row.body, row.attempts))
        return claimed

    def _held(self, task_id: str, token: str) -> _Row | None:
        row = self._rows.get(task_id)
        return row if row is not None and row.token == token else None

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        await trio.lowlevel.checkpoint()
        row = self._held(task_id, token)
        if row is None:
            return False
        row.leased_until_ms = until_ms
        return True

    async def delete(self, task_id: str, token: str) -> None:
        await trio.lowlevel.checkpoint()
        if self._held(task_id, token) is not None:
            del self._rows[task_id]

    async def reschedule(self, task_id: str, token: str, due_at_ms: int, error: str | None) -> None:
        await trio.lowlevel.checkpoint()
        row = self._held(task_id, token)
        if row is not None:
            row.due_at_ms = due_at_ms
            row.leased_until_ms = None
            row.token = None
            if error is not None:
                row.error = error

    async def next_due(self, contract: str) -> int | None:
        await trio.lowlevel.checkpoint()
        return min(
            (row.ready_at() for row in self._rows.values() if row.contract == contract),
            default=None,
        )

    async def count(self, contract: str | None = None) -> int:
        await trio.lowlevel.checkpoint()
        return sum(1 for row in self._rows.values() if contract in (None, row.contract))

    def group_statistics(self) -> GroupStatistics:
        # Every write is a dict operation: nothing is committed in groups.
        return GroupStatistics(0, 0, 0)
