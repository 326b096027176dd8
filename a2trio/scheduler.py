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
(``bind``), which gives them a place for their timer tasks. Two ship in
:mod:`a2trio.schedulers`: ``LocalScheduler`` (Trio timers in this process)
and ``DurableScheduler`` (a sqlite or Postgres table shared by processes).
``docs/schedules.md`` explains how to write another.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

if TYPE_CHECKING:
    from .clock import Clock
    from .contract import Contract
    from .timings import Timings

__all__ = [
    "AppendTask",
    "DrainTask",
    "ScheduledEvent",
    "Scheduler",
    "SchedulerTarget",
    "SchedulerTask",
    "task_decoder",
    "task_id",
]


class ScheduledEvent(msgspec.Struct, frozen=True):
    """One event of a delayed append, its payload snapshotted as JSON builtins.

    ``version`` is the payload's schema version when its type declares
    versions (:mod:`a2trio.upcasting`), so a task queued by an older release
    is upcast when it is delivered. Unset (version 1), it is left out of the
    encoding, which is then the seed's.
    """

    id: str
    type: str
    payload: Any
    version: int | msgspec.UnsetType = msgspec.UNSET


class DrainTask(msgspec.Struct, frozen=True, tag="drain", tag_field="kind", rename="camel"):
    """Drain ``session_id`` of ``contract`` at ``due_at_ms`` (a watchdog)."""

    contract: str
    session_id: str
    due_at_ms: int = msgspec.field(name="dueAt")
    version: Literal[1] = 1


class AppendTask(msgspec.Struct, frozen=True, tag="append", tag_field="kind", rename="camel"):
    """Append ``events`` to ``session_id`` at ``due_at_ms``; ``id`` is the schedule id.

    ``trace_context`` is the scheduling span's (see :mod:`a2trio.telemetry`):
    the delivered append continues that trace. Unset, it is left out of the
    encoding, which is then the seed's, and the seed's tasks decode here.
    """

    id: str
    contract: str
    session_id: str
    due_at_ms: int = msgspec.field(name="dueAt")
    events: list[ScheduledEvent]
    version: Literal[1] = 1
    trace_context: str | msgspec.UnsetType = msgspec.UNSET

    @property
    def trace_parent(self) -> str | None:
        """``trace_context``, or None when it is unset."""
        return None if isinstance(self.trace_context, msgspec.UnsetType) else self.trace_context


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


class SchedulerTarget(Protocol):
    """What a scheduler delivers to: an :class:`a2trio.Server` satisfies it."""

    @property
    def contract(self) -> Contract:
        """The contract whose tasks this target takes."""
        ...

    @property
    def clock(self) -> Clock:
        """Epoch ms for due times."""
        ...

    @property
    def timings(self) -> Timings:
        """Arm timeouts and lease durations a scheduler may follow."""
        ...

    async def deliver(self, task: SchedulerTask) -> None:
        """Run a due task; raising keeps it queued for a retry."""
        ...


class Scheduler(Protocol):
    """What a scheduler implements (see ``docs/schedules.md``).

    The server calls :meth:`schedule` to queue a task and enters :meth:`bind`
    for its lifetime; the scheduler hands each due task back through
    ``await server.deliver(task)``.

    Obligations:

    * ``schedule`` returns once the task is stored (committed, for a durable
      scheduler) and is idempotent by :func:`task_id` while the task is
      queued: a second call with the same id changes nothing.
    * A task is delivered at or after ``due_at_ms`` (never before), at least
      once. Delivering twice is safe: appends carry deterministic event ids
      and drains are idempotent.
    * When ``deliver`` raises, the task stays queued and is retried later,
      with a backoff.
    * ``bind(server)`` delivers only tasks whose ``contract`` is
      ``server.contract.name``. It is entered after the store is open, and
      leaving it stops the scheduler's tasks for that server.
    """

    async def schedule(self, task: SchedulerTask) -> None:
        """Queue ``task`` (see the obligations above).

        Raises:
          Exception: the backend failed; nothing may be assumed queued.

        Cancellation: the store of the task is atomic: cancelled, it is
        either queued or not, and retrying is safe either way.
        """
        ...

    def bind(self, server: SchedulerTarget) -> AbstractAsyncContextManager[None]:
        """A context manager that delivers ``server``'s due tasks while inside."""
        ...
