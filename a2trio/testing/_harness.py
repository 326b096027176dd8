"""The harness: a user's contract and handlers on a real store, under a mock clock.

Theory of operation
-------------------

:func:`open_harness` owns a nursery. It enters the store for its whole life
(so a restart keeps the store open, as a database outlives a process) and
hosts the :class:`~a2trio.Server` in a task of that nursery. :meth:`Harness.restart`
cancels that task mid-whatever: leaving ``async with server`` cancels the
background drains without completing or failing anything, so their claims
lapse in the store exactly as after a crash. A fresh ``Server`` (and a fresh
scheduler: a local scheduler's timers die with its process) is then opened on
the same store.

Time moves in one of two ways, chosen from the running Trio clock:

* **autojump** (``MockClock(autojump_threshold=0)``, pytest-trio's
  ``autojump_clock``): :meth:`Harness.advance` sleeps until the target; Trio
  jumps the clock from one deadline to the next, so heartbeats, lease
  lapses, retries and schedules all happen, in order, in no real time. Only
  for the memory store: autojump treats a task waiting on a thread or socket
  as idle and would jump the clock in the middle of a query.
* **jump** (``MockClock()`` with no autojump, pytest-trio's ``mock_clock``):
  for real backends. The harness does autojump's work itself: it moves the
  clock with ``MockClock.jump`` to the next pending deadline at a time, and
  between jumps waits until every task is blocked *and* no store call is in
  flight (the harness's :class:`FaultyStore` counts them). ``advance``,
  ``settle`` and ``drain`` therefore move time identically in both modes, and
  one test runs unchanged on either.

"Quiet" means: every task is blocked, and (jump mode) no store call is in
flight. Deadlines already due run before the system is quiet, so a schedule
due now is delivered by :meth:`Harness.settle`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal

import msgspec
import trio
import trio.testing

from ..clock import Clock, TrioClock, ms_to_datetime
from ..contract import Contract, Event
from ..engine.drain import DrainResult
from ..engine.handlers import Handlers
from ..engine.session import Session
from ..push import ValidatePush
from ..scheduler import Scheduler
from ..schedulers import LocalScheduler
from ..server import Server
from ..stores.base import Store, StoredEvent
from ..stores.memory import memory
from ..timings import DEFAULT_TIMINGS, Timings
from ._faults import FaultyStore
from ._telemetry import RecordingTelemetry

__all__ = [
    "Harness",
    "Outcome",
    "OutcomeStatus",
    "SchedulerFactory",
    "local_scheduler",
    "open_harness",
]

#: What happened to an event, as far as its bookkeeping and spans tell:
#: ``processed`` (completed; events of a type with no handler are stored
#: processed), ``aborted`` (completed by an ``abort_on`` cancellation),
#: ``failed`` (failed at least once, will be retried), ``dead_lettered``,
#: ``skipped`` (settled unrun by a later event of its debounce key), or
#: ``pending`` (not yet run, or running).
OutcomeStatus = Literal["processed", "aborted", "failed", "dead_lettered", "skipped", "pending"]

#: Builds the scheduler for each server the harness opens (a restart builds a
#: new one), given the harness's clock.
SchedulerFactory = Callable[[Clock], Scheduler]


def local_scheduler(clock: Clock) -> Scheduler:
    """The default :data:`SchedulerFactory`: a fresh in-process
    :class:`~a2trio.schedulers.LocalScheduler` on ``clock``. Its timers die with
    the server, as they would with a process, so after :meth:`Harness.restart`
    only durable state remains."""
    return LocalScheduler(clock=clock)


#: The running server's host task: its cancel scope, and an event set once it
#: has fully stopped.
_Hosted = tuple[trio.CancelScope, trio.Event]


class Outcome(msgspec.Struct, frozen=True):
    """An event's fate.

    Attributes:
      status: see :data:`OutcomeStatus`.
      attempts: how many times it was claimed (0 if never).
      failures: how many attempts failed.
      last_error: the last failure's traceback text, if any.
      returned_ids: ids of the events its handler returned, once processed.
      last_failed_at_ms: when the last attempt failed (the store's clock).
      not_before_ms: the stored instant before which no attempt starts (a
        backoff's retry-at), None for none.
    """

    status: OutcomeStatus
    attempts: int
    failures: int
    last_error: str | None = None
    returned_ids: list[str] = msgspec.field(default_factory=list)
    last_failed_at_ms: int | None = None
    not_before_ms: int | None = None


class Harness:
    """A running app under test. Build it with :func:`open_harness` or the
    ``a2_app`` pytest fixture.

    Attributes:
      server: the current :class:`~a2trio.Server` (a new one after each restart).
      store: the :class:`FaultyStore` wrapping the real store: inject faults here.
      telemetry: the :class:`RecordingTelemetry` every server reports to.
      clock: the :class:`~a2trio.TrioClock` stored times come from.
      restarts: how many times :meth:`restart` ran.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        contract: Contract,
        *,
        store: FaultyStore,
        clock: TrioClock,
        telemetry: RecordingTelemetry,
        build_server: Callable[[], Server],
    ) -> None:
        self._nursery = nursery
        self.contract = contract
        self.store = store
        self.clock = clock
        self.telemetry = telemetry
        self._build_server = build_server
        self.server = build_server()
        self._host: _Hosted | None = None
        self.restarts = 0

    def __repr__(self) -> str:
        return f"Harness({self.contract.name!r}, store={self.store.inner!r})"

    @property
    def timings(self) -> Timings:
        """The servers' timings (``claim_ttl_s`` and friends)."""
        return self.server.timings

    def session(self, session: str | Session) -> Session:
        """A handle on a session of the current server. Does no I/O."""
        return self.server.session(session if isinstance(session, str) else session.id)

    def now(self) -> datetime:
        """The store's clock as an aware UTC datetime."""
        return ms_to_datetime(self.clock.now_ms())

    # -- hosting ---------------------------------------------------------------

    async def _serve(
        self,
        server: Server,
        *,
        task_status: trio.TaskStatus[
            tuple[trio.CancelScope, trio.Event]
        ] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                async with server:
                    task_status.started((scope, stopped))
                    await trio.sleep_forever()
        finally:
            stopped.set()

    async def _start(self) -> None:
        self._host = await self._nursery.start(self._serve, self.server)

    async def restart(self) -> Server:
        """Crash the current server mid-whatever and open a new one on the same store.

        Handlers running in background drains are cancelled where they stand:
        nothing is completed or failed, so their claims stay in the store
        until they expire. Advance past ``timings.claim_ttl_s`` (a watchdog or
        the next append then retries them), or call :meth:`drain`.

        Session handles belong to the server that made them, as objects of
        a dead process would: take new ones with :meth:`session` afterwards.
        The harness's own methods accept either.

        A real crash runs no ``finally`` blocks; this does, because
        cancellation is how Trio stops code. Everything durable is as after
        a crash.

        Cancellation: a checkpoint. Cancelled after the old server stopped
        and before the new one started, the harness has no running server
        and must not be used further.

        Returns:
          The new server (also :attr:`server`).
        """
        assert self._host is not None
        scope, stopped = self._host
        scope.cancel(reason="crash injected by Harness.restart")
        await stopped.wait()
        self.restarts += 1
        self.server = self._build_server()
        await self._start()
        return self.server

    async def drain(self, session: str | Session) -> DrainResult:
        """Drain a session in this task (``server.drain``), e.g. after a restart.

        Moves the clock as :meth:`settle` does while the drain's handlers wait
        on time, in both modes.

        Cancellation: cancels its handlers; their claims lapse and a later
        drain retries them.
        """
        session_id = self.session(session).id
        mock = trio.lowlevel.current_clock()
        if not isinstance(mock, trio.testing.MockClock) or _autojumps(mock):
            return await self.server.drain(session_id)
        results: list[DrainResult] = []

        async def run() -> None:
            results.append(await self.server.drain(session_id))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            while True:
                await self._quiet(mock)
                if results:
                    break
                self._jump_to_next_deadline(mock, "drain")
        return results[0]

    # -- time ----------------------------------------------------------------

    async def settle(self) -> None:
        """Run until quiet with no drain or append in progress.

        Delivers schedules already due and waits out every drain and append
        in progress: those an append started and those a scheduler delivered
        (watchdogs, delayed appends). While such work waits on time (a
        handler that sleeps, a heartbeat), the clock moves to the next
        deadline, in both modes; with no work in progress it never moves.

        Raises:
          RuntimeError: (jump mode) work is in progress but every task is
            blocked and no deadline is pending: it can never finish. Under
            autojump the same test would hang; guard with ``trio.fail_after``.

        Cancellation: a checkpoint; cancelling it cancels nothing else.
        """
        mock = _mock_clock()
        while True:
            await self._quiet(mock)
            if not self._busy():
                return
            if not _autojumps(mock):
                self._jump_to_next_deadline(mock, "settle")
            elif self.server.statistics().background_tasks:
                await self.server.settle()
            else:
                for name in _BUSY_SPANS:
                    await self.telemetry.wait_all_closed(name)

    def _busy(self) -> bool:
        return bool(self.server.statistics().background_tasks) or any(
            self.telemetry.open_count(name) for name in _BUSY_SPANS
        )

    @staticmethod
    def _jump_to_next_deadline(mock: trio.testing.MockClock, what: str) -> None:
        gap = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if gap == math.inf:
            raise RuntimeError(
                f"{what}: work is in progress, but every task is blocked and no deadline "
                "is pending, so it can never finish (a handler waiting on an event that "
                "never comes?)"
            )
        mock.jump(max(gap, 0.0))

    async def advance(self, seconds: float) -> None:
        """Move Trio time forward by ``seconds`` and run whatever falls due, in order.

        Heartbeats, lease lapses, retries, watchdogs and scheduled appends
        happen at their own instants on the way. Returns when the clock reads
        exactly the target and the system is quiet.

        Raises:
          ValueError: negative ``seconds``.
          RuntimeError: the test is not running on ``trio.testing.MockClock``.

        Cancellation: a checkpoint; the clock keeps whatever it reached.
        """
        if not seconds >= 0:
            raise ValueError(f"`seconds` must be non-negative, got {seconds!r}")
        mock = _mock_clock()
        target = trio.current_time() + seconds
        if _autojumps(mock):
            await trio.sleep_until(target)
            await self._quiet(mock)
            return
        await self._quiet(mock)
        while True:
            remaining = target - trio.current_time()
            if remaining <= 0:
                return
            gap = trio.lowlevel.current_statistics().seconds_to_next_deadline
            mock.jump(min(max(gap, 0.0), remaining))
            await self._quiet(mock)
            if gap >= remaining:
                return

    async def advance_to(self, when: datetime) -> None:
        """:meth:`advance` until the store's clock reads ``when`` (an aware datetime).

        Raises:
          ValueError: a naive datetime, or one in the past.

        Cancellation: as :meth:`advance`.
        """
        if when.tzinfo is None:
            raise ValueError(f"advance_to needs an aware datetime, got naive {when!r}")
        delta_ms = int(when.timestamp() * 1000) - self.clock.now_ms()
        if delta_ms < 0:
            raise ValueError(f"{when.isoformat()} is in the past (now {self.now().isoformat()})")
        await self.advance(delta_ms / 1000)

    async def _quiet(self, mock: trio.testing.MockClock) -> None:
        if _autojumps(mock):
            # Trio never autojumps while a task waits here (the run loop
            # prefers idle waiters), so this returns without moving the clock.
            await trio.testing.wait_all_tasks_blocked()
            return
        while True:
            await trio.testing.wait_all_tasks_blocked(_JUMP_CUSHION_S)
            if not self.store.statistics().in_flight:
                return
            await self.store.wait_idle()

    # -- reading outcomes --------------------------------------------------------

    async def _row(self, session: str | Session, event: int | str | Event[Any]) -> StoredEvent:
        session_id = self.session(session).id
        key = self.server.key(session_id)
        rows = await self.store.inner.read(key)
        for row in rows:
            if (isinstance(event, int) and row.index == event) or (
                isinstance(event, str) and row.id == event
            ):
                return row
            if isinstance(event, Event) and row.id == event.id:
                return row
        raise AssertionError(
            f"session {session_id!r} has no event {event!r}; its log: "
            + ", ".join(f"#{r.index} {r.type} (id {r.id})" for r in rows)
        )

    async def outcome(self, session: str | Session, event: int | str | Event[Any]) -> Outcome:
        """What happened to one event: by index, id, or the :class:`~a2trio.Event`.

        Reads the store's bookkeeping directly (no fault injection applies)
        and the recorded ``a2.event`` spans for aborts.

        Raises:
          AssertionError: no such event, with the session's log.

        Cancellation: a checkpoint; a read, so nothing to undo.
        """
        row = await self._row(session, event)
        status: OutcomeStatus
        if row.failed_at_ms is not None:
            status = "dead_lettered"
        elif row.debounced_by is not None:
            status = "skipped"
        elif row.processed_at_ms is not None:
            aborted = self.telemetry.find(
                "a2.event",
                {
                    "a2.event.id": row.id,
                    "a2.event.attempt": row.processed_by_attempt or 0,
                    "a2.event.aborted": True,
                },
            )
            status = "aborted" if aborted else "processed"
        elif row.failure_count:
            status = "failed"
        else:
            status = "pending"
        return Outcome(
            status,
            row.attempt_count,
            row.failure_count,
            row.last_error,
            list(row.returned_event_ids or []),
            row.last_failed_at_ms,
            row.not_before_ms,
        )

    # -- assertions ----------------------------------------------------------------

    async def assert_log(self, session: str | Session, types: Sequence[str]) -> list[Event[Any]]:
        """Assert the session's log holds exactly these event types, in order.

        Returns:
          The events, for further checks on payloads.

        Raises:
          AssertionError: showing both logs, with payloads.

        Cancellation: a checkpoint; a read, so nothing to undo.
        """
        events = await self.session(session).history()
        actual = [e.type for e in events]
        if actual != list(types):
            lines = "\n".join(f"  #{e.index} {e.type}: {e.payload!r}" for e in events)
            raise AssertionError(
                f"log of {self.session(session).id!r} is {actual}, expected {list(types)}:\n"
                f"{lines or '  (empty)'}"
            )
        return events

    async def assert_outcome(
        self,
        session: str | Session,
        event: int | str | Event[Any],
        status: OutcomeStatus,
        *,
        failures: int | None = None,
        attempts: int | None = None,
    ) -> Outcome:
        """Assert an event's :class:`Outcome` status (and counts, when given).

        Raises:
          AssertionError: naming the outcome found and the last error.

        Cancellation: a checkpoint; a read, so nothing to undo.
        """
        found = await self.outcome(session, event)
        expected = {"status": status, "failures": failures, "attempts": attempts}
        mismatches = [
            f"{name}={getattr(found, name)!r} (expected {want!r})"
            for name, want in expected.items()
            if want is not None and getattr(found, name) != want
        ]
        if mismatches:
            error = f"\nlast error:\n{found.last_error}" if found.last_error else ""
            raise AssertionError(
                f"event {event!r} of {self.session(session).id!r}: {', '.join(mismatches)}{error}"
            )
        return found


#: Spans whose being open means work in progress that settle() waits out,
#: wherever it runs (server background, scheduler deliveries).
_BUSY_SPANS = ("a2.drain", "a2.append")

#: Jump mode's quiet cushion: every task blocked for this long (real seconds)
#: with no store call in flight. Short, because in-flight calls are counted
#: rather than guessed at.
_JUMP_CUSHION_S = 0.005


def _autojumps(mock: trio.testing.MockClock) -> bool:
    return mock.autojump_threshold != math.inf


def _mock_clock() -> trio.testing.MockClock:
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock):
        raise RuntimeError(
            "the harness moves time with trio.testing.MockClock, but this run uses "
            f"{clock!r}: take pytest-trio's `autojump_clock` fixture (memory store) or "
            "`mock_clock` (real backends) in the test's arguments"
        )
    return clock


@asynccontextmanager
async def open_harness(
    contract: Contract,
    *,
    handlers: Handlers | None = None,
    store: Store | None = None,
    scheduler: SchedulerFactory | None = local_scheduler,
    telemetry: RecordingTelemetry | None = None,
    timings: Timings = DEFAULT_TIMINGS,
    validate_push: ValidatePush | None = None,
    presence_ttl_ms: int | None = None,
) -> AsyncIterator[Harness]:
    """Open a server for ``contract`` and ``handlers`` on a store, under test.

    Args:
      store: the real store (default: a memory store on a fresh
        :class:`~a2trio.TrioClock`). Give real backends a ``TrioClock`` too,
        so stored time follows the mock clock.
      scheduler: builds each server's scheduler from the clock (default: a
        :class:`~a2trio.schedulers.LocalScheduler`); None for no scheduler.
        To keep scheduled tasks across :meth:`Harness.restart`, return one
        shared (durable) scheduler.
      telemetry: where spans go (default: a fresh :class:`RecordingTelemetry`).
      timings / validate_push / presence_ttl_ms: passed to each ``Server``.

    Raises:
      TypeError: the store's clock is not a ``TrioClock``; anything ``Server``
        raises for a bad contract or handler.

    Cancellation: the harness's tasks live in this block; leaving it cancels
    the server's drains (their claims lapse) and closes the store.
    """
    inner = store if store is not None else memory(clock=TrioClock())
    faulty = inner if isinstance(inner, FaultyStore) else FaultyStore(inner)
    if not isinstance(faulty.clock, TrioClock):
        raise TypeError(
            f"the harness needs a store on a2trio.testing.TrioClock so stored time follows "
            f"the mock clock; {inner!r} has clock {faulty.clock!r}"
        )
    clock = faulty.clock
    recording = telemetry if telemetry is not None else RecordingTelemetry()

    def build_server() -> Server:
        return Server(
            contract,
            store=faulty,
            handlers=handlers,
            scheduler=scheduler(clock) if scheduler is not None else None,
            telemetry=recording,
            validate_push=validate_push,
            presence_ttl_ms=presence_ttl_ms,
            timings=timings,
            clock=clock,
        )

    async with faulty, trio.open_nursery() as nursery:
        harness = Harness(
            nursery,
            contract,
            store=faulty,
            clock=clock,
            telemetry=recording,
            build_server=build_server,
        )
        await harness._start()
        yield harness
        nursery.cancel_scope.cancel(reason="harness closed")
