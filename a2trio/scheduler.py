"""The scheduler seam: tasks that append or drain later.

A scheduler puts versioned tasks on some timer and hands them back to the
server when due (:meth:`a2trio.Server.deliver`). Two task shapes, as in the
seed's ``scheduler-task.ts``:

* :class:`DrainTask` - a watchdog: drain this session at ``due_at_ms``. Armed
  by drains at the slotted claim expiry + grace, so a drain lost with its
  process is rescued without any further append.
* :class:`AppendTask` - a delayed append from ``session.schedule``; ids are
  deterministic, so delivering a task twice appends once.

Implementations are async context managers entered by ``async with server``
(``bind``), which gives them a place for their timer tasks.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

if TYPE_CHECKING:
    from .server import Server

__all__ = [
    "AppendTask",
    "DrainTask",
    "ScheduledEvent",
    "Scheduler",
    "SchedulerTask",
    "task_decoder",
    "task_id",
]


class ScheduledEvent(msgspec.Struct, frozen=True):
    """One event of a delayed append, its payload snapshotted as JSON builtins."""

    id: str
    type: str
    payload: Any


class DrainTask(msgspec.Struct, frozen=True, tag="drain", tag_field="kind", rename="camel"):
    """Drain ``session_id`` of ``contract`` at ``due_at_ms`` (a watchdog)."""

    contract: str
    session_id: str
    due_at_ms: int
    version: Literal[1] = 1


class AppendTask(msgspec.Struct, frozen=True, tag="append", tag_field="kind", rename="camel"):
    """Append ``events`` to ``session_id`` at ``due_at_ms``; ``id`` is the schedule id."""

    id: str
    contract: str
    session_id: str
    due_at_ms: int
    events: list[ScheduledEvent]
    version: Literal[1] = 1


SchedulerTask = DrainTask | AppendTask

_decoder = msgspec.json.Decoder(SchedulerTask)


def task_decoder() -> msgspec.json.Decoder[SchedulerTask]:
    """The shared JSON decoder of task bodies (durable rows, HTTP deliveries)."""
    return _decoder


def task_id(task: SchedulerTask) -> str:
    """A stable id: the schedule id for appends, (contract, session, slot) for drains."""
    if isinstance(task, AppendTask):
        return task.id
    return f"drain:{task.contract}\x1f{task.session_id}\x1f{task.due_at_ms}"


class Scheduler(Protocol):
    """What a scheduler implements.

    ``schedule`` must be durable when it returns (for durable schedulers), and
    idempotent by :func:`task_id`. ``bind`` is entered by each server that uses
    the scheduler, for the server's lifetime; due tasks for that server's
    contract go to ``server.deliver(task)``.
    """

    async def schedule(self, task: SchedulerTask) -> None: ...

    def bind(self, server: Server) -> AbstractAsyncContextManager[None]: ...
