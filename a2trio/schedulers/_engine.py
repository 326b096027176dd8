"""The scheduler engine shared by every backend: a worker per bound server.

Theory of operation
-------------------

A scheduler keeps tasks in a :class:`~a2trio.schedulers._queue.TaskQueue`
(memory, sqlite or Postgres) keyed by :func:`a2trio.scheduler.task_id`, so
scheduling the same task twice queues it once. ``async with server`` enters
``scheduler.bind(server)``, which opens a nursery holding one *worker* for the
server's contract and, while they run, one task per delivery.

The worker loops: arm a wake-up, claim every due task of its contract under a
fresh lease token (up to ``max_in_flight`` deliveries at once), start a
delivery task per row, then wait until the next task becomes claimable, a
wake-up, or the cross-process poll interval, whichever comes first. Wake-ups
come from ``schedule()`` in this process at once, from a delivery that frees a
slot the worker waits for or puts its task back, and on Postgres from
``NOTIFY`` sent by other processes; sqlite has no notifications, so another
process's task is seen within one ``Timings.poll_idle_s``. The wake-up is
armed before the claim, so a task added during the claim still wakes the
worker.

A delivery calls ``server.deliver(task)`` while one task per bound server
renews the leases of every delivery in flight every third of ``lease_s``
(the renewals of one beat share a group commit), so a long drain keeps its
task; a renewal that finds the lease gone stops renewing it. Then, in a
shielded cleanup: delivered -> delete the row; raised -> reschedule it after
a backoff (1 s doubling to 60 s, forever: a schedule must fire eventually,
and the error is kept on the row); cancelled (the server is closing) -> drop
the lease so the next worker takes it at once. A crash between delivery and
delete delivers again after the lease lapses: delivery is at least once,
which is safe because delayed appends use deterministic ids and watchdog
drains are idempotent.

Times: due times and leases are epoch milliseconds from the scheduler's
clock (by default the bound server's ``clock``); waits are Trio sleeps of the
difference, so under ``MockClock`` with ``TrioClock`` a ``"30s"`` schedule
fires at exactly +30 s of Trio time.
"""

from __future__ import annotations

import logging
import math
import traceback
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import msgspec
import trio

from ..backoff import Backoff
from ..errors import store_unavailable
from ..scheduler import SchedulerTarget, SchedulerTask, task_decoder, task_id
from ..stores.feed import Wakeups
from ._queue import NotifyingQueue

if TYPE_CHECKING:
    from ..clock import Clock
    from ._queue import TaskQueue, TaskRow

#: Failed deliveries (WARNING, with the traceback), with ``a2_contract`` and
#: ``a2_task`` on each record.
logger = logging.getLogger("a2trio.scheduler")

__all__ = ["QueueScheduler", "SchedulerStatistics", "retry_delay_s"]

_encoder = msgspec.json.Encoder()

#: The waits before re-delivering a failed task: 1 s doubling to a minute, so
#: a poison task costs one delivery a minute; no jitter (the delay is stored).
REDELIVERY = Backoff(base_s=1.0, cap_s=60.0, jitter=0.0)
#: How long a claimed task stays leased without renewal, like a claim ttl.
DEFAULT_LEASE_S = 30.0
#: Deliveries running at once per bound server; past it the worker waits.
DEFAULT_MAX_IN_FLIGHT = 64
#: How long after a claim the worker waits for half its slots to free up
#: before claiming fewer (see ``_pump``).
REFILL_WAIT_S = 0.05
#: Upper bound on the shielded cleanup write after a delivery, so a hung
#: backend cannot hold a closing server forever (the lease lapses instead).
CLEANUP_TIMEOUT_S = 10.0


def retry_delay_s(attempts: int) -> float:
    """The backoff before re-delivering a task that failed ``attempts`` times."""
    return REDELIVERY.delay(attempts)


class SchedulerStatistics(msgspec.Struct, frozen=True):
    """A debugging snapshot of a scheduler.

    Attributes:
      bound: contracts with a bound server, sorted.
      in_flight: deliveries running now.
      delivered: tasks delivered and deleted.
      failed: deliveries that raised and were rescheduled.
      queue_errors: backend calls of the workers that failed (retried).
      passes: worker passes completed (claim, then look ahead), so a test
        can wait until a worker has looked at the queue after moving time.
      waiting: workers between passes, waiting for a due time or a wake-up.
      write_transactions: transactions that committed the queue's writes
        (inserts, deletes, renewals, reschedules); fewer than ``writes`` when
        writes arriving together shared one (group commit).
      writes: writes committed in them.
      largest_group: the most writes one transaction committed.
    """

    bound: tuple[str, ...]
    in_flight: int
    delivered: int
    failed: int
    queue_errors: int
    passes: int
    waiting: int
    write_transactions: int = 0
    writes: int = 0
    largest_group: int = 0


class _Binding:
    def __init__(self, server: SchedulerTarget, clock: Clock) -> None:
        self.server = server
        self.contract = server.contract.name
        self.clock = clock
        self.in_flight = 0
        #: The leases to renew: task id -> token, for deliveries in flight.
        self.leases: dict[str, str] = {}
        #: Set when a lease is added: the keeper sleeps on it while none is held.
        self.leased = trio.Event()
        #: Until when (Trio time) the worker waits for a refill's worth of slots.
        self.refill_by = -math.inf


class QueueScheduler:
    """A :class:`~a2trio.Scheduler` over a task queue (see the module docstring).

    Subclasses choose the queue: :class:`~a2trio.schedulers.LocalScheduler`
    and :class:`~a2trio.schedulers.DurableScheduler`.
    """

    #: Whether :meth:`schedule` needs an open lifetime (a connection).
    _needs_open = True

    def __init__(
        self,
        queue: TaskQueue,
        *,
        clock: Clock | None,
        lease_s: float,
        max_in_flight: int,
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {lease_s!r}")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError(f"max_in_flight must be an int, got {max_in_flight!r}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight!r}")
        self._queue = queue
        self._clock = clock
        self._lease_s = lease_s
        self._max_in_flight = max_in_flight
        #: Free slots the worker waits for before claiming again.
        self._refill = max(1, max_in_flight // 2)
        self._bindings: dict[str, _Binding] = {}
        self._wakeups = Wakeups()
        self._users = 0
        self._open_lock = trio.Lock()
        self._delivered = 0
        self._failed = 0
        self._queue_errors = 0
        self._passes = 0
        self._waiting = 0

    @property
    def queue(self) -> TaskQueue:
        """The table (or heap) this scheduler keeps its tasks in."""
        return self._queue

    # -- lifetime ------------------------------------------------------------

    async def __aenter__(self) -> QueueScheduler:
        """Open the queue for use without a bound server (scripts, other services).

        Lifetimes nest and count: the connection closes when the last of
        these blocks and bound servers ends.

        Raises:
          A2Error: ``STORE_UNAVAILABLE`` when the backend cannot be reached.

        Cancellation: a checkpoint; if cancelled, the scheduler was not opened.
        """
        await self._acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the queue if this was its last user (shielded, so always)."""
        await self._release()

    async def _acquire(self) -> None:
        async with self._open_lock:
            if self._users == 0:
                with store_unavailable("opening the scheduler"):
                    await self._queue.open()
            self._users += 1

    def _check_open(self) -> None:
        if self._needs_open and self._users == 0:
            raise RuntimeError(
                f"{self!r} is not open: enter `async with scheduler:` or a server using it"
            )

    async def _release(self) -> None:
        self._users -= 1
        if self._users == 0:
            with trio.CancelScope(shield=True):
                await self._queue.aclose()

    # -- the Scheduler protocol ----------------------------------------------

    async def schedule(self, task: SchedulerTask) -> None:
        """Queue ``task`` unless a task with the same :func:`task_id` is queued.

        Returns once the task is stored (durably, on durable backends) and
        wakes this process's worker for the task's contract.

        Raises:
          RuntimeError: a durable scheduler used outside ``async with
            scheduler`` and outside any bound server's lifetime.
          A2Error: ``STORE_UNAVAILABLE`` when the backend fails (the original
            is ``__cause__``); the task may not be assumed queued.

        Cancellation: a checkpoint. The insert is one transaction: cancelled,
        it either committed or wrote nothing, and retrying is a no-op if it
        committed.
        """
        self._check_open()
        body = _encoder.encode(task)
        with store_unavailable("schedule"):
            inserted = await self._queue.insert(task_id(task), task.contract, task.due_at_ms, body)
        if inserted:
            self._wakeups.notify(task.contract)

    @asynccontextmanager
    async def bind(self, server: SchedulerTarget) -> AsyncIterator[None]:
        """Deliver this scheduler's tasks for ``server``'s contract while inside.

        Entered by ``async with server``. Opens the queue (the first user
        connects), starts the worker in a nursery owned by this block, and on
        exit cancels in-flight deliveries: their tasks are released and
        delivered again by the next bound worker.

        Raises:
          RuntimeError: another server of the same contract is bound to this
            scheduler (run one server per contract per scheduler; other
            processes share the work through the durable queue).
        """
        contract = server.contract.name
        if contract in self._bindings:
            raise RuntimeError(
                f"a server for contract {contract!r} is already bound to {self!r}: "
                "use one server per contract per scheduler"
            )
        binding = _Binding(server, self._clock or server.clock)
        self._bindings[contract] = binding
        try:
            await self._acquire()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self._serve, binding)
                    try:
                        yield
                    finally:
                        nursery.cancel_scope.cancel(reason="server closed")
            finally:
                await self._release()
        finally:
            del self._bindings[contract]

    # -- inspection ----------------------------------------------------------

    async def queued(self, contract: str | None = None) -> int:
        """How many tasks are queued (due or not, leased or not).

        Raises:
          RuntimeError: a durable scheduler that is not open (as :meth:`schedule`).
          A2Error: ``STORE_UNAVAILABLE`` when the backend fails.

        Cancellation: a checkpoint; a read, so nothing to undo.
        """
        self._check_open()
        with store_unavailable("counting scheduler tasks"):
            return await self._queue.count(contract)

    def statistics(self) -> SchedulerStatistics:
        """Counters for tests and debugging; does no I/O."""
        groups = self._queue.group_statistics()
        return SchedulerStatistics(
            bound=tuple(sorted(self._bindings)),
            in_flight=sum(b.in_flight for b in self._bindings.values()),
            delivered=self._delivered,
            failed=self._failed,
            queue_errors=self._queue_errors,
            passes=self._passes,
            waiting=self._waiting,
            write_transactions=groups.groups,
            writes=groups.members,
            largest_group=groups.largest,
        )

    # -- the worker ----------------------------------------------------------

    def _poll_s(self, binding: _Binding) -> float:
        timings = binding.server.timings
        match self._queue.cross_process:
            case "poll":
                return timings.poll_idle_s
            case "notify":
                return timings.notify_safety_s
            case _:
                return math.inf

    async def _serve(
        self, binding: _Binding, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        contract = binding.contract
        async with trio.open_nursery() as nursery:
            if isinstance(self._queue, NotifyingQueue):
                await nursery.start(self._queue.listen, self._wakeups)
            nursery.start_soon(self._keep_leases, binding)
            task_status.started()
            failures = 0
            while True:
                woken = self._wakeups.arm(contract)
                try:
                    wait_s = await self._pump(binding, nursery)
                    failures = 0
                except Exception:
                    # The backend is unreachable: back off and retry; tasks wait.
                    self._queue_errors += 1
                    failures += 1
                    wait_s = retry_delay_s(failures)
                self._passes += 1
                self._waiting += 1
                try:
                    with trio.move_on_after(wait_s):
                        await woken.wait()
                finally:
                    self._waiting -= 1

    async def _pump(self, binding: _Binding, nursery: trio.Nursery) -> float:
        """Claim and start due deliveries; return how long to wait before the next pass."""
        free = self._max_in_flight - binding.in_flight
        if free == 0:
            # The delivery that frees the first slot wakes the worker.
            return math.inf
        refill_in_s = binding.refill_by - trio.current_time()
        if free < self._refill and refill_in_s > 0:
            # Wait, briefly, for a refill's worth of free slots and claim them
            # in one batch: a claim per finished delivery would make the
            # claim's round trip the bound on throughput. Past REFILL_WAIT_S
            # claim whatever is free, so deliveries that hold most slots for
            # long delay a due task by at most that.
            return refill_in_s
        token = str(uuid.uuid4())
        rows = await self._queue.claim(
            binding.contract,
            binding.clock.now_ms(),
            math.ceil(self._lease_s * 1000),
            token,
            free,
        )
        binding.refill_by = trio.current_time() + REFILL_WAIT_S
        for row in rows:
            binding.in_flight += 1
            nursery.start_soon(self._deliver, binding, row, token)
        if len(rows) == free:
            # More may be due: go again now if deliveries finished during the
            # claim; otherwise freed slots wake the worker (the first, and a
            # refill's worth).
            return 0.0 if binding.in_flight < self._max_in_flight else math.inf
        wait_s = self._poll_s(binding)
        next_due = await self._queue.next_due(binding.contract)
        if next_due is not None:
            # Already due (time moved during the claim): pass again at once. A
            # row claimable now is claimed by that pass, so this cannot spin.
            wait_s = min(wait_s, max(0.0, (next_due - binding.clock.now_ms()) / 1000))
        return wait_s

    async def _deliver(self, binding: _Binding, row: TaskRow, token: str) -> None:
        delivered = False
        error: str | None = None
        binding.leases[row.id] = token
        binding.leased.set()
        try:
            task = task_decoder().decode(row.body)
            await binding.server.deliver(task)
            delivered = True
        except Exception as exc:
            error = "".join(traceback.format_exception(exc))
            logger.warning(
                "scheduler task %s failed (delivery %d): it is retried after %.1f s",
                row.id,
                row.attempts,
                retry_delay_s(row.attempts),
                exc_info=exc,
                extra={"a2_contract": binding.contract, "a2_task": row.id},
            )
        finally:
            binding.leases.pop(row.id, None)
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
                await self._settle(binding, row, token, delivered, error)
            # Wake the worker when this frees a slot it waits for (the first
            # one, or a refill's worth), or when the task went back to the
            # queue with a new due time.
            binding.in_flight -= 1
            if self._max_in_flight - binding.in_flight in (1, self._refill) or not delivered:
                self._wakeups.notify(binding.contract)

    async def _settle(
        self, binding: _Binding, row: TaskRow, token: str, delivered: bool, error: str | None
    ) -> None:
        now_ms = binding.clock.now_ms()
        try:
            if delivered:
                await self._queue.delete(row.id, token)
                self._delivered += 1
            elif error is not None:
                self._failed += 1
                retry_at_ms = now_ms + math.ceil(retry_delay_s(row.attempts) * 1000)
                await self._queue.reschedule(row.id, token, retry_at_ms, error)
            else:
                # Cancelled (the server is closing): release it for the next worker.
                await self._queue.reschedule(row.id, token, now_ms, None)
        except Exception:
            # The lease lapses instead and the task is delivered again: at least once.
            self._queue_errors += 1

    async def _keep_leases(self, binding: _Binding) -> None:
        period_s = self._lease_s / 3
        lease_ms = math.ceil(self._lease_s * 1000)
        beat = trio.current_time()
        while True:
            if not binding.leases:
                # No timer while idle: a harness that steps the clock to the
                # next deadline (and a process at rest) sees none of ours.
                binding.leased = trio.Event()
                await binding.leased.wait()
                beat = trio.current_time()
            beat += period_s
            await trio.sleep_until(beat)
            until_ms = binding.clock.now_ms() + lease_ms
            async with trio.open_nursery() as renewals:
                for task_id_, token in list(binding.leases.items()):
                    renewals.start_soon(self._renew, binding, task_id_, token, until_ms)

    async def _renew(self, binding: _Binding, task_id_: str, token: str, until_ms: int) -> None:
        try:
            held = await self._queue.renew(task_id_, token, until_ms)
        except Exception:
            # A missed renewal spends lease slack; the next beat retries.
            self._queue_errors += 1
            return
        if not held and binding.leases.get(task_id_) == token:
            del binding.leases[task_id_]
