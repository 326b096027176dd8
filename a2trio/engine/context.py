"""The engine core: what the session, drain, presence and fan-out parts share.

:class:`Engine` is built once by :class:`a2trio.Server` and handed to every
engine part; none of them knows the server. It holds the contract, the store
and the configuration, and does the work they all need, through public
methods only:

* the key namespace: a session's store key is ``<contract>\\x1f<session>``, so
  several contracts share one store;
* conversion of stored rows to typed public events;
* validation of append inputs (schemas, resolved lanes, which events are
  settled because no handler takes them) and of pushes (``validate_push``);
* the background: a nursery the server opens, where background drains,
  snapshot write-backs and watchdog arms live, with ``settle()`` for tests;
* watchdog arming, at most once per (session, one-second slot), as the
  seed's ``startSchedulerArm``;
* schedules (``session.schedule``) and the session's shared event feed.

The write path that wakes drains is above this module (``drains.py``); the
parts that append reach it through the :class:`Appends` protocol, so this
module imports no engine part.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal, Protocol

import msgspec
import trio

from ..clock import Clock, ms_to_datetime
from ..contract import AppendInput, Contract, Event
from ..errors import A2Error, ErrorCode
from ..identifiers import check_event_id
from ..ids import returned_event_id, schedule_id, scheduled_event_id
from ..push import PushedEvent, PushValidation, ValidatePush
from ..scheduler import AppendTask, DrainTask, ScheduledEvent, Scheduler
from ..stores.base import AppendEvent, EventCause, StateRead, Store, StoredEvent
from ..telemetry import Telemetry
from ..timings import Timings
from .fanout import SessionFanout, Subscription, open_store_subscription, open_subscription

__all__ = ["Appends", "Engine", "LaneFn", "Source", "WriteMode"]

#: ``lane(session_id, event) -> str``: a lane resolved when the event is appended.
LaneFn = Callable[[str, AppendInput], str]
Source = Literal["external", "handler"]
WriteMode = Literal["inline", "dispatch"]

_NS = "\x1f"
_DELAY = re.compile(r"^(?:0|[1-9]\d*)(?:\.\d+)?(ms|s|m|h|d)$")
_DELAY_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class Appends(Protocol):
    """The write path (implemented by the drain registry, ``drains.py``)."""

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendInput | PushedEvent],
        *,
        source: Source,
        mode: WriteMode,
        causes: Sequence[EventCause] | None = None,
        require_arm: bool = False,
        expected_index: int | None = None,
        trace_parent: str | None = None,
    ) -> list[Event[Any]]:
        """Validate, append durably and hand pending work to a drain; with
        ``expected_index``, only if the log is still at that index; in the
        trace of ``trace_parent`` (a request's trace context) when given."""
        ...


class Engine:
    """The shared core of one server (see the module docstring).

    Args:
      lanes: the event types that have a handler, each with its lane (a
        string, a :data:`LaneFn`, or None). Events of other types are stored
        settled.
    """

    def __init__(
        self,
        contract: Contract,
        store: Store,
        *,
        lanes: Mapping[str, str | LaneFn | None],
        scheduler: Scheduler | None,
        telemetry: Telemetry,
        validate_push: ValidatePush | None,
        presence_ttl_ms: int,
        timings: Timings,
        clock: Clock,
        run_handlers: bool,
    ) -> None:
        self.contract = contract
        self.store = store
        self.lanes = dict(lanes)
        self.scheduler = scheduler
        self.telemetry = telemetry
        self.validate_push = validate_push
        self.presence_ttl_ms = presence_ttl_ms
        self.timings = timings
        self.clock = clock
        self.run_handlers = run_handlers
        self._prefix = contract.name + _NS
        self._nursery: trio.Nursery | None = None
        self._background = 0
        self._idle = trio.Event()
        self._idle.set()
        self._armed: dict[tuple[str, int], float] = {}
        self._fanouts: dict[str, SessionFanout] = {}
        self._state_batches: dict[str, _StateBatch] = {}

    # -- the key namespace -----------------------------------------------------

    def key(self, session_id: str) -> str:
        """The store key of a session: namespaced by the contract's name."""
        return self._prefix + session_id

    def session_of(self, key: str) -> str | None:
        """The session id of a store key of this contract, or None."""
        return key[len(self._prefix) :] if key.startswith(self._prefix) else None

    def to_public(self, row: StoredEvent) -> Event[Any]:
        """A stored row as a typed event (payload decoded to the contract's type)."""
        return Event(
            id=row.id,
            type=row.type,
            payload=self.contract.decode(row.type, row.payload),
            index=row.index,
            session_id=row.session_id[len(self._prefix) :],
            created_at=ms_to_datetime(row.created_at_ms),
        )

    # -- validation ------------------------------------------------------------

    def validate(
        self,
        session_id: str,
        events: Sequence[AppendInput | PushedEvent],
        *,
        dispatch: bool = True,
        trace_context: str | None = None,
    ) -> list[AppendEvent]:
        """Validate append inputs into store records, resolving lanes.

        With ``dispatch=False`` (schedules) no lane is resolved and nothing is
        marked settled: the events are appended later, by a scheduler.
        ``trace_context`` is stored with every event (the appender's span).

        Raises:
          TypeError: no events, or an input not built with ``contract.event``.
          A2Error: ``UNKNOWN_EVENT_TYPE`` or ``INVALID_PAYLOAD``.
        """
        if not events:
            raise TypeError("append requires at least one event")
        validated = []
        for event in events:
            if not isinstance(event, AppendInput | PushedEvent):
                raise TypeError(
                    f"append takes events built with contract.event(...), got {event!r}"
                )
            if event.id is not None:
                check_event_id(event.id)
            typed, builtins = self.contract.validate(event.type, event.payload)
            lane = None
            settled = False
            if dispatch:
                if event.type not in self.lanes:
                    settled = True
                else:
                    lane_spec = self.lanes[event.type]
                    if lane_spec is not None:
                        lane = (
                            lane_spec
                            if isinstance(lane_spec, str)
                            else lane_spec(session_id, AppendInput(event.type, typed, event.id))
                        )
                        if not isinstance(lane, str) or not lane:
                            raise TypeError(
                                f"lane for {event.type!r} must resolve to a non-empty string, "
                                f"got {lane!r}"
                            )
            validated.append(
                AppendEvent(event.type, builtins, event.id, None, lane, settled, trace_context)
            )
        return validated

    async def check_push(self, validation: PushValidation) -> None:
        """Ask ``validate_push`` about what came over the wire. It fails
        closed, like ``authorize``: anything but ``True`` refuses.

        Raises:
          A2Error: ``FORBIDDEN`` on a refusal (or what the hook raised).
        """
        if self.validate_push is None:
            return
        verdict: object = self.validate_push(validation)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is not True:
            raise A2Error(ErrorCode.FORBIDDEN, "validate_push refused the push")

    def returned(self, trigger: StoredEvent, result: Any) -> list[AppendEvent]:
        """A handler's return value as validated records with deterministic ids,
        in the trace of the span current here (the handler's ``a2.event``).

        Raises:
          TypeError: not None, an append input or a list of them.
        """
        if result is None:
            return []
        items = [result] if isinstance(result, AppendInput) else list(result)
        if not all(isinstance(item, AppendInput) for item in items):
            raise TypeError(
                f"a handler returns None, an append input or a list of them, got {result!r}"
            )
        session_id = trigger.session_id[len(self._prefix) :]
        with_ids = [
            AppendInput(e.type, e.payload, e.id or returned_event_id(trigger.id, position))
            for position, e in enumerate(items)
        ]
        return self.validate(session_id, with_ids, trace_context=self.telemetry.trace_context())

    # -- the background ----------------------------------------------------------

    def attach(self, nursery: trio.Nursery | None) -> None:
        """Give the engine the server's nursery (None when the server closes)."""
        self._nursery = nursery

    @property
    def is_open(self) -> bool:
        """Whether background work can start (the server is open)."""
        return self._nursery is not None

    def require_open(self) -> None:
        """Raise RuntimeError unless the server is open."""
        if self._nursery is None:
            raise RuntimeError(
                f"the server for '{self.contract.name}' is not open: use `async with server:`"
            )

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the server's nursery, counted for :meth:`settle`.

        Raises:
          RuntimeError: the server is not open.
        """
        self.require_open()
        assert self._nursery is not None
        if self._background == 0:
            self._idle = trio.Event()
        self._background += 1
        self._nursery.start_soon(self._tracked, fn, *args)

    async def _tracked(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        finally:
            self._background -= 1
            if self._background == 0:
                self._idle.set()

    @property
    def background_tasks(self) -> int:
        """Background tasks running now."""
        return self._background

    async def settle(self) -> None:
        """Wait until no background task runs (see ``Server.settle``)."""
        while self._background:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    # -- watchdogs -----------------------------------------------------------------

    @staticmethod
    def slot(due_at_ms: int) -> int:
        """The one-second slot a watchdog due at ``due_at_ms`` is armed for."""
        return math.ceil(due_at_ms / 1000) * 1000

    @staticmethod
    def slot_floor(now_ms: int) -> int:
        """The slot that is due now (``dispatch`` arms it)."""
        return (now_ms // 1000) * 1000

    async def arm_now(self, session_id: str, slot_ms: int) -> None:
        """Ask the scheduler for a drain of ``session_id`` at ``slot_ms``."""
        assert self.scheduler is not None
        await self.scheduler.schedule(DrainTask(self.contract.name, session_id, slot_ms))

    def arm_watchdog(self, session_id: str, due_at_ms: int) -> None:
        """Arm a watchdog drain at the slotted due time, once per slot, in the
        background; a failure never stops the drain that asked."""
        if self.scheduler is None or self._nursery is None:
            return
        slot = self.slot(due_at_ms)
        if self.claim_slot(session_id, slot):
            self.spawn(self._arm_background, session_id, slot)

    def claim_slot(self, session_id: str, slot_ms: int) -> bool:
        """Record (session, slot) as armed; False if it already is. Entries are
        forgotten a second after their slot, and on a failed arm
        (:meth:`forget_slot`)."""
        now = trio.current_time()
        for key in [k for k, forget_at in self._armed.items() if forget_at <= now]:
            del self._armed[key]
        key = (session_id, slot_ms)
        if key in self._armed:
            return False
        self._armed[key] = now + max(0.0, (slot_ms - self.clock.now_ms()) / 1000) + 1.0
        return True

    def forget_slot(self, session_id: str, slot_ms: int) -> None:
        """Forget an arm that failed, so the next one tries again."""
        self._armed.pop((session_id, slot_ms), None)

    async def _arm_background(self, session_id: str, slot_ms: int) -> None:
        try:
            with trio.fail_after(self.timings.scheduler_arm_timeout_s):
                await self.arm_now(session_id, slot_ms)
        except (Exception, trio.TooSlowError):
            self.forget_slot(session_id, slot_ms)

    # -- schedules -------------------------------------------------------------------

    async def schedule(
        self,
        session_id: str,
        name: str,
        timing: str | datetime,
        events: Sequence[AppendInput],
        trigger: StoredEvent | None,
    ) -> None:
        """Queue a delayed append (see ``Session.schedule``); with a ``trigger``
        the schedule id includes its id and delays count from its creation."""
        if self.scheduler is None:
            raise TypeError("schedule requires a scheduler: pass Server(scheduler=...)")
        if not isinstance(name, str) or not name:
            raise TypeError(f"schedule name must be a non-empty string, got {name!r}")
        if not events:
            raise TypeError("schedule requires at least one event")
        base_ms = trigger.created_at_ms if trigger is not None else self.clock.now_ms()
        due_at_ms = _due_at(timing, base_ms)
        validated = self.validate(session_id, events, dispatch=False)
        sid = schedule_id(
            self.contract.name, session_id, trigger.id if trigger is not None else None, name
        )
        scheduled = [
            ScheduledEvent(e.id or scheduled_event_id(sid, position), e.type, e.payload)
            for position, e in enumerate(validated)
        ]
        if len({e.id for e in scheduled}) != len(scheduled):
            raise A2Error(
                ErrorCode.PARTIAL_DUPLICATE_BATCH,
                "scheduled batch contains the same event id more than once",
            )
        # The delivered append continues the scheduling span's trace.
        trace = self.telemetry.trace_context()
        await self.scheduler.schedule(
            AppendTask(
                sid,
                self.contract.name,
                session_id,
                due_at_ms,
                scheduled,
                trace_context=msgspec.UNSET if trace is None else trace,
            )
        )

    # -- state reads -------------------------------------------------------------------

    async def read_state(self, key: str, reducer: str) -> StateRead:
        """The snapshot and tail of ``key`` for ``reducer``. While the server is
        open, calls made in the same scheduler round coalesce into one
        ``store.read_states`` (the seed's batching): three sessions' ``state()``
        at once are one round trip. Each caller gets a read of its own (a
        second caller of one key a deep copy), so a fold may mutate its state.

        Raises:
          Exception: the store's failure (the caller falls back to the log).

        Cancellation: a cancelled caller stops waiting; the batch's read runs
        on for the others, in the server's nursery.
        """
        if self._nursery is None:
            return await self.store.read_state(key, reducer)
        batch = self._state_batches.get(reducer)
        if batch is None:
            batch = self._state_batches[reducer] = _StateBatch()
            # Runs after this scheduler round: every caller meanwhile joins.
            self.spawn(self._read_states, reducer, batch)
        batch.keys[key] = batch.keys.get(key, 0) + 1
        await batch.done.wait()
        if batch.reads is None:
            if batch.error is not None:
                # The store's error as it raised it, to every caller of the
                # batch (as a shared feed's error goes to every reader).
                raise batch.error
            # The read was cancelled: the server closed under it.
            raise A2Error(ErrorCode.STORE_UNAVAILABLE, "read state failed")
        return batch.reads[key].pop()

    async def _read_states(self, reducer: str, batch: _StateBatch) -> None:
        if self._state_batches.get(reducer) is batch:
            del self._state_batches[reducer]  # later callers start the next batch
        keys = list(batch.keys)
        try:
            reads = await self.store.read_states(keys, reducer)
            # One read per caller, copied before any of them folds: a fold may
            # mutate its state in place, and callers of one key would
            # otherwise fold into one shared snapshot (issue 29).
            batch.reads = {
                key: [read, *(copy.deepcopy(read) for _ in range(batch.keys[key] - 1))]
                for key, read in zip(keys, reads, strict=True)
            }
        except Exception as exc:
            batch.error = exc
        finally:
            batch.done.set()

    # -- feeds -------------------------------------------------------------------------

    @asynccontextmanager
    async def open_events(
        self, session_id: str, start_after: int, *, drop: bool = False
    ) -> AsyncIterator[Subscription]:
        """A session's typed events after ``start_after``, then live: the
        process's shared feed of the session while the server is open
        (``fanout.py``; with ``drop`` a reader that lags past its ring is
        dropped), the store's own feed otherwise."""
        key = self.key(session_id)
        if self._nursery is not None:
            async with open_subscription(
                self._fanouts,
                self._nursery,
                self.store,
                key,
                session_id,
                self.to_public,
                start_after,
                drop=drop,
            ) as shared:
                yield shared
            return
        async with open_store_subscription(self.store, key, self.to_public, start_after) as own:
            yield own


class _StateBatch:
    """``read_state`` calls waiting for one ``read_states``."""

    __slots__ = ("done", "error", "keys", "reads")

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}  # key -> callers waiting on it
        self.done = trio.Event()
        self.reads: dict[str, list[StateRead]] | None = None  # a read per caller
        self.error: BaseException | None = None


def _due_at(timing: str | datetime, base_ms: int) -> int:
    if isinstance(timing, datetime):
        if timing.tzinfo is None:
            raise TypeError(f"schedule at must be an aware datetime, got naive {timing!r}")
        return int(timing.timestamp() * 1000)
    if not isinstance(timing, str):
        raise TypeError(
            f"schedule timing must be a delay like '30s' or an aware datetime, got {timing!r}"
        )
    match = _DELAY.match(timing)
    amount = float(timing[: -len(match.group(1))]) if match else 0.0
    if match is None or not amount > 0:
        raise TypeError(
            f"schedule delay must be positive and use ms, s, m, h or d (for example '30s'), "
            f"got {timing!r}"
        )
    due = base_ms + amount * _DELAY_MS[match.group(1)]
    if not math.isfinite(due):
        raise TypeError(f"schedule due time must be finite, got {timing!r}")
    return math.ceil(due)
