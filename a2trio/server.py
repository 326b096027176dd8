"""The server: a contract bound to a store, handlers, and a nursery.

``Server(contract, store=..., handlers=...)`` validates everything at
construction and does no I/O. ``async with server:`` opens the store's and the
scheduler's lifetimes and the server's nursery, where background drains,
snapshot write-backs and watchdog arms live. Leaving the block cancels them:
claims lapse and a later drain retries, exactly as after a crash.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import trio

from .clock import SYSTEM_CLOCK, Clock, ms_to_datetime
from .contract import AppendInput, Contract, Event, Reducer
from .drain import DrainResult, DrainSignal, drain_session
from .errors import A2Error, ErrorCode, store_unavailable
from .fanout import SessionFanout, open_shared_feed
from .handlers import HandlerContext, HandlerSpec, handler
from .identifiers import check_event_id, check_session_id
from .ids import returned_event_id, schedule_id, scheduled_event_id
from .scheduler import AppendTask, DrainTask, ScheduledEvent, Scheduler, SchedulerTask
from .session import HandlerSession, Session
from .stores._feed import Feed
from .stores.base import (
    AppendEvent,
    AppendResult,
    ClaimRequest,
    EventCause,
    StateRead,
    Store,
    StoredEvent,
)
from .telemetry import NOOP_TELEMETRY, Telemetry
from .timings import DEFAULT_TIMINGS, Timings

if TYPE_CHECKING:
    from .presence import PresenceMap

__all__ = ["PushValidation", "PushedEvent", "PushedPresence", "Server", "ServerStatistics"]

S = TypeVar("S")

_NS = "\x1f"
_DELAY = re.compile(r"^(?:0|[1-9]\d*)(?:\.\d+)?(ms|s|m|h|d)$")
_DELAY_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Largest epoch ms a JavaScript Date holds; the wire's clients are browsers.
MAX_DATE_MS = 8_640_000_000_000_000
RESERVED_PARTICIPANTS = frozenset({"__proto__", "constructor", "prototype"})


class PushedEvent(msgspec.Struct, frozen=True):
    """An event that arrived over the wire: ``validate_push`` sees it before its
    schema does."""

    type: str
    payload: Any
    id: str | None = None


class PushedPresence(msgspec.Struct, frozen=True):
    """A presence patch that arrived over the wire (frozen: the hook cannot
    rewrite it)."""

    participant: str
    values: dict[str, Any]
    seen: int | None = None
    at: int | None = None


class PushValidation(msgspec.Struct, frozen=True):
    """What ``validate_push`` is asked about: the pushed events or the presence
    patch for a session. Refuse by raising ``A2Error(FORBIDDEN, ...)`` or
    returning ``False``."""

    session_id: str
    events: tuple[PushedEvent, ...] = ()
    presence: PushedPresence | None = None


ValidatePush = Callable[[PushValidation], "bool | Awaitable[bool | None] | None"]


class ServerStatistics(msgspec.Struct, frozen=True):
    """A debugging snapshot: running background drains and background tasks."""

    drains: int
    background_tasks: int


def _check_index(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _default_store(contract: Contract) -> Store:
    from .stores import from_url, memory

    url = os.environ.get("A2_STORE")
    if url:
        return from_url(url)
    env = os.environ.get("A2_ENV", "development")
    if env == "production":
        raise A2Error(
            ErrorCode.STORE_NOT_CONFIGURED,
            f"the server for '{contract.name}' has no store and A2_ENV is 'production': "
            "pass store=a2trio.stores.postgres(...) or set A2_STORE",
        )
    if env == "test":
        return memory()
    from .stores import sqlite

    return sqlite(".a2/dev.db")


class Server:
    """Implements a contract: binds it to a store and to handlers.

    Args:
      contract: from :func:`a2trio.contract`.
      store: where events live. Default: ``A2_STORE`` if set, else by
        ``A2_ENV``: ``production`` refuses (``STORE_NOT_CONFIGURED``), ``test``
        uses memory, anything else sqlite at ``.a2/dev.db``.
      handlers: event type -> async function or :func:`a2trio.handler` spec.
      scheduler: a :class:`~a2trio.scheduler.Scheduler` for watchdogs,
        ``dispatch`` and ``schedule``. Without one the server heals on the next
        append.
      telemetry: spans (no-op by default).
      validate_push: authorizes events and presence that came over the wire.
      timings: every duration; see :class:`~a2trio.Timings`.
      clock: epoch ms for due times and presence stamps; defaults to the
        store's clock.
      run_handlers: False for a process that only appends (an API tier): its
        appends still record what the handlers imply (pending, lanes), but it
        wakes no drain and follows no other process's appends; worker
        processes on a store with cross-process wake-up (Postgres) run the
        handlers at once. Explicit ``drain()`` and scheduler-delivered drains
        still run them here.
      asyncio_loop: open a trio-asyncio loop for the server's lifetime, so
        handlers can call asyncio-only libraries through
        ``trio_asyncio.aio_as_trio`` (needs the ``asyncio`` extra).

    Raises:
      TypeError / ValueError: a bad handler, ``abort_on`` or lane, a presence
        ttl on a contract without presence.
      A2Error: ``STORE_NOT_CONFIGURED``; ``PRESENCE_NOT_SUPPORTED`` when the
        contract declares presence and the store has no presence capability.
    """

    def __init__(
        self,
        contract: Contract,
        *,
        store: Store | None = None,
        handlers: Mapping[str, HandlerSpec | Callable[..., Awaitable[Any]]] | None = None,
        scheduler: Scheduler | None = None,
        telemetry: Telemetry | None = None,
        validate_push: ValidatePush | None = None,
        presence_ttl_ms: int | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        clock: Clock | None = None,
        asyncio_loop: bool = False,
        run_handlers: bool = True,
    ) -> None:
        if not isinstance(contract, Contract):
            raise TypeError(f"Server expects a contract from a2trio.contract(), got {contract!r}")
        self.contract = contract
        if presence_ttl_ms is not None:
            if not contract.declares_presence:
                raise TypeError(
                    f"presence_ttl_ms requires a contract that declares presence fields: "
                    f"'{contract.name}' has none"
                )
            if (
                isinstance(presence_ttl_ms, bool)
                or not isinstance(presence_ttl_ms, int)
                or (presence_ttl_ms <= 0)
            ):
                raise ValueError(
                    f"presence_ttl_ms must be a positive integer, got {presence_ttl_ms!r}"
                )
        self.presence_ttl_ms = (
            presence_ttl_ms if presence_ttl_ms is not None else int(timings.presence_ttl_s * 1000)
        )
        self._handlers: dict[str, HandlerSpec] = {}
        for type_, entry in (handlers or {}).items():
            spec = entry if isinstance(entry, HandlerSpec) else handler(entry)
            spec.check(contract, type_)
            self._handlers[type_] = spec
        self.store: Store = store if store is not None else _default_store(contract)
        if contract.declares_presence and getattr(self.store, "presence", None) is None:
            raise A2Error(
                ErrorCode.PRESENCE_NOT_SUPPORTED,
                f"the contract '{contract.name}' declares presence but its store "
                f"{type(self.store).__name__} has no presence capability",
            )
        self.scheduler = scheduler
        self.telemetry: Telemetry = telemetry or NOOP_TELEMETRY
        self.validate_push = validate_push
        self.timings = timings
        store_clock = getattr(self.store, "clock", None)
        self.clock: Clock = clock or (
            store_clock if isinstance(store_clock, Clock) else SYSTEM_CLOCK
        )
        if asyncio_loop:
            try:
                import trio_asyncio  # noqa: F401 - checked here, opened in __aenter__
            except ImportError as exc:
                raise TypeError(
                    "asyncio_loop=True needs trio-asyncio: pip install 'a2trio[asyncio]'"
                ) from exc
        self.asyncio_loop = asyncio_loop
        self.run_handlers = run_handlers
        self._prefix = contract.name + _NS
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None
        self._closed = False
        self._drains: dict[str, DrainSignal] = {}
        self._background = 0
        self._idle = trio.Event()
        self._idle.set()
        self._armed: dict[tuple[str, int], float] = {}
        self._fanouts: dict[str, SessionFanout] = {}

    def __repr__(self) -> str:
        return f"Server({self.contract.name!r}, store={type(self.store).__name__})"

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> Server:
        if self._stack is not None:
            raise RuntimeError(f"{self!r} is already open")
        if self._closed:
            raise RuntimeError(f"cannot reopen {self!r}: create a new Server")
        stack = AsyncExitStack()
        try:
            if self.asyncio_loop:
                import trio_asyncio

                # Entered first, left last: handlers and drains run inside it.
                await stack.enter_async_context(trio_asyncio.open_loop())
            await stack.enter_async_context(self.store)
            if self.scheduler is not None:
                await stack.enter_async_context(self.scheduler.bind(self))
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            watch_pending = getattr(self.store, "watch_pending", None)
            if self._handlers and self.run_handlers and callable(watch_pending):
                # Cross-process wake-up: work appended by another process
                # starts here at once (stores that can tell, e.g. Postgres).
                stack.callback(watch_pending(self._remote_append))
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel(reason="server closed")
        self._nursery = None
        self._closed = True
        # The block's own exception is not the nursery's business: background
        # tasks were cancelled above, so it propagates as itself, not wrapped
        # in an ExceptionGroup.
        await stack.__aexit__(None, None, None)
        return None

    def _remote_append(self, key: str) -> None:
        if key.startswith(self._prefix) and self._nursery is not None:
            self._wake_drain(key[len(self._prefix) :])

    def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError(f"{self!r} is not open: use `async with server:`")
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

    async def settle(self) -> None:
        """Wait until background drains, snapshot writes and arms are idle.

        For tests: after ``settle()`` every inline append's reaction has run to
        an outcome (handlers that wait on time still need the clock to move).

        Cancellation: only waits; cancelling it leaves the background alone.
        """
        while self._background:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> ServerStatistics:
        return ServerStatistics(drains=len(self._drains), background_tasks=self._background)

    # -- sessions ----------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """A handle on one session. Does no I/O.

        Raises:
          TypeError: an empty or non-string id. ValueError: an id longer than
          :data:`~a2trio.identifiers.MAX_ID_LENGTH` or holding a control
          character (U+0000-U+001F, U+007F-U+009F) or a lone surrogate.
        """
        return Session(self, check_session_id(session_id))

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    def _to_public(self, row: StoredEvent) -> Event[Any]:
        return Event(
            id=row.id,
            type=row.type,
            payload=self.contract.decode(row.type, row.payload),
            index=row.index,
            session_id=row.session_id[len(self._prefix) :],
            created_at=ms_to_datetime(row.created_at_ms),
        )

    # -- append ------------------------------------------------------------

    def _validate(
        self, session_id: str, events: Sequence[AppendInput | PushedEvent], *, dispatch: bool = True
    ) -> list[AppendEvent]:
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
                registration = self._handlers.get(event.type)
                if registration is None:
                    settled = True
                elif registration.lane is not None:
                    lane_spec = registration.lane
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
            validated.append(AppendEvent(event.type, builtins, event.id, None, lane, settled))
        return validated

    async def _check_push(self, validation: PushValidation) -> None:
        if self.validate_push is None:
            return
        verdict = self.validate_push(validation)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is False:
            raise A2Error(ErrorCode.FORBIDDEN, "validate_push refused the push")

    async def _append_external(
        self,
        session_id: str,
        events: Sequence[AppendInput | PushedEvent],
        *,
        mode: Literal["inline", "dispatch"],
        require_arm: bool = False,
    ) -> list[Event[Any]]:
        pushed = tuple(e for e in events if isinstance(e, PushedEvent))
        if pushed:
            await self._check_push(PushValidation(session_id, pushed))
        return await self._append(
            session_id, events, source="external", mode=mode, require_arm=require_arm
        )

    async def _append(
        self,
        session_id: str,
        events: Sequence[AppendInput | PushedEvent],
        *,
        source: Literal["external", "handler"],
        mode: Literal["inline", "dispatch"],
        causes: Sequence[EventCause] | None = None,
        require_arm: bool = False,
    ) -> list[Event[Any]]:
        attributes: dict[str, str | int] = {
            "a2.contract": self.contract.name,
            "a2.session_id": session_id,
            "a2.append.source": source,
            "a2.append.mode": mode,
            "a2.append.types": ",".join(str(getattr(e, "type", "?")) for e in events),
            "a2.append.count": len(events),
        }
        with self.telemetry.span("a2.append", attributes) as span:
            if self._nursery is None:
                # Checked before writing: an append's drain needs the nursery.
                raise RuntimeError(f"{self!r} is not open: use `async with server:`")
            if mode == "dispatch" and self.scheduler is None:
                raise TypeError("dispatch requires a scheduler: pass Server(scheduler=...)")
            validated = self._validate(session_id, events)
            if causes is not None:
                validated = [
                    msgspec.structs.replace(event, cause=cause)
                    for event, cause in zip(validated, causes, strict=True)
                ]
            watchdog_at: int | None = None
            if self.scheduler is not None and source == "external" and mode == "inline":
                ttl_ms = int(self.timings.claim_ttl_s * 1000)
                grace_ms = int(self.timings.watchdog_grace_s * 1000)
                watchdog_at = self._slot(self.clock.now_ms() + ttl_ms + grace_ms)
            result = await self._store_append(session_id, validated, mode, watchdog_at)
            appended = [self._to_public(row) for row in result.events]
            if not result.has_pending:
                return appended
            if mode == "dispatch":
                await self._arm_now(session_id, self._slot_floor(self.clock.now_ms()))
                return appended
            # One arm per slot (the seed's startSchedulerArm), except that a
            # scheduler-delivered append must see its own arm succeed.
            if watchdog_at is not None and (
                self._claim_slot(session_id, watchdog_at) or require_arm
            ):
                try:
                    with trio.fail_after(self.timings.scheduler_arm_timeout_s):
                        await self._arm_now(session_id, watchdog_at)
                except (Exception, trio.TooSlowError) as exc:
                    self._armed.pop((session_id, watchdog_at), None)
                    span.set_attribute("a2.append.armed", False)
                    span.record_error(exc)
                    if require_arm:
                        raise
            return appended

    # -- drains --------------------------------------------------------------

    async def _store_append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        mode: Literal["inline", "dispatch"],
        watchdog_at_ms: int | None,
    ) -> AppendResult:
        """Append, and get the pending work of an inline append running.

        An inline append on a server that runs handlers writes its events
        claimed for this process's drain (``ClaimRequest``): the handler starts
        one round trip sooner than if the drain claimed, and the row is written
        once. The drain is woken to claim only if the session held other
        claimable events. The local lease estimate is taken before the call,
        as the drain does, so it never outlives the store's stamp. While the
        append is in flight the running drain knows an answer is coming, so it
        does not end (or claim against its own holder's fresh claims).
        """
        key = self._key(session_id)
        if mode != "inline" or not self.run_handlers or all(e.settled for e in events):
            with store_unavailable("append"):
                result = await self.store.append(key, events)
            if result.has_pending and mode == "inline" and self.run_handlers:
                self._wake_drain(session_id, watchdog_at_ms)
            return result
        ttl_s = self.timings.claim_ttl_s
        expires_at = trio.current_time() + ttl_s
        drain_watchdog_ms = self.clock.now_ms() + int(
            (ttl_s + self.timings.watchdog_grace_s) * 1000
        )
        signal = self._drains.get(session_id)
        if signal is None or signal.closed:
            signal = None
            claim = ClaimRequest(str(uuid.uuid4()), int(ttl_s * 1000))
        else:
            claim = ClaimRequest(signal.holder, int(ttl_s * 1000))
            signal.appending += 1
        try:
            with store_unavailable("append"):
                result = await self.store.append(key, events, claim=claim)
            if result.claimed:
                self._adopt(
                    session_id,
                    claim.holder,
                    result.claimed,
                    expires_at,
                    drain_watchdog_ms,
                    watchdog_at_ms,
                )
            if result.others_claimable:
                self._wake_drain(session_id, watchdog_at_ms)
        finally:
            if signal is not None:
                signal.appended()
        return result

    def _adopt(
        self,
        session_id: str,
        holder: str,
        events: list[StoredEvent],
        expires_at: float,
        drain_watchdog_ms: int,
        watchdog_at_ms: int | None,
    ) -> None:
        """Hand events an append claimed to the session's drain, starting one."""
        signal = self._drains.get(session_id)
        if signal is None or signal.closed:
            signal = DrainSignal(holder)
            self._drains[session_id] = signal
            self._spawn(self._background_drain, session_id, signal, watchdog_at_ms)
        signal.adopt(holder, events, expires_at, drain_watchdog_ms)

    def _wake_drain(self, session_id: str, watchdog_at_ms: int | None = None) -> None:
        """Wake the session's drain to claim, starting one if none runs."""
        signal = self._drains.get(session_id)
        if signal is not None and not signal.closed:
            signal.notify()
            return
        signal = DrainSignal()
        # Marked woken, so the new drain claims first even if an append hands
        # it events before it starts (it would otherwise take those as all).
        signal.notify()
        self._drains[session_id] = signal
        self._spawn(self._background_drain, session_id, signal, watchdog_at_ms)

    async def _background_drain(
        self, session_id: str, signal: DrainSignal, watchdog_at_ms: int | None
    ) -> None:
        try:
            await drain_session(self, session_id, signal=signal, watchdog_due_at_ms=watchdog_at_ms)
        except A2Error:
            # The store is unreachable: claims lapse; the next append or watchdog
            # retries. The span has recorded the error.
            pass
        finally:
            signal.closed = True
            if self._drains.get(session_id) is signal:
                del self._drains[session_id]

    async def drain(self, session_id: str) -> DrainResult:
        """Process every eligible event of a session, in this task, to the end.

        Returns:
          ``settled`` is true when nothing actionable remains; ``busy`` says
          another holder's claims are live; ``stalled`` that an event failed.

        Cancellation: cancelling cancels the handlers; their claims lapse and a
        later drain retries them.
        """
        check_session_id(session_id)
        return await drain_session(self, session_id)

    # -- scheduler ----------------------------------------------------------

    @staticmethod
    def _slot(due_at_ms: int) -> int:
        return math.ceil(due_at_ms / 1000) * 1000

    @staticmethod
    def _slot_floor(now_ms: int) -> int:
        return (now_ms // 1000) * 1000

    async def _arm_now(self, session_id: str, slot_ms: int) -> None:
        assert self.scheduler is not None
        await self.scheduler.schedule(DrainTask(self.contract.name, session_id, slot_ms))

    def _arm_watchdog(self, session_id: str, due_at_ms: int) -> None:
        """Arm a watchdog drain at the slotted due time, once per slot, in the
        background; a failure never stops the drain that asked."""
        if self.scheduler is None or self._nursery is None:
            return
        slot = self._slot(due_at_ms)
        if self._claim_slot(session_id, slot):
            self._spawn(self._arm_background, (session_id, slot))

    def _claim_slot(self, session_id: str, slot_ms: int) -> bool:
        """Record (session, slot) as armed; False if it already is. Entries are
        forgotten a second after their slot, and on a failed arm."""
        now = trio.current_time()
        for key in [k for k, forget_at in self._armed.items() if forget_at <= now]:
            del self._armed[key]
        key = (session_id, slot_ms)
        if key in self._armed:
            return False
        self._armed[key] = now + max(0.0, (slot_ms - self.clock.now_ms()) / 1000) + 1.0
        return True

    async def _arm_background(self, key: tuple[str, int]) -> None:
        try:
            with trio.fail_after(self.timings.scheduler_arm_timeout_s):
                await self._arm_now(*key)
        except (Exception, trio.TooSlowError):
            self._armed.pop(key, None)

    async def deliver(self, task: SchedulerTask) -> None:
        """Run a due scheduler task: a watchdog drain or a delayed append.

        Raises:
          ValueError: the task is for another contract.
          A2Error: the append failed (the scheduler retries the task).

        Cancellation: safe to retry: appends replay by their deterministic
        ids and a drain is idempotent.
        """
        if task.contract != self.contract.name:
            raise ValueError(
                f"scheduler task for contract {task.contract!r} cannot be delivered to "
                f"{self.contract.name!r}"
            )
        check_session_id(task.session_id)
        if isinstance(task, DrainTask):
            await drain_session(self, task.session_id, watchdog_due_at_ms=task.due_at_ms)
            return
        inputs = [AppendInput(e.type, e.payload, e.id) for e in task.events]
        await self._append(
            task.session_id, inputs, source="external", mode="inline", require_arm=True
        )

    async def _schedule(
        self,
        session_id: str,
        name: str,
        timing: str | datetime,
        events: Sequence[AppendInput],
        trigger: StoredEvent | None,
    ) -> None:
        if self.scheduler is None:
            raise TypeError("schedule requires a scheduler: pass Server(scheduler=...)")
        if not isinstance(name, str) or not name:
            raise TypeError(f"schedule name must be a non-empty string, got {name!r}")
        if not events:
            raise TypeError("schedule requires at least one event")
        base_ms = trigger.created_at_ms if trigger is not None else self.clock.now_ms()
        due_at_ms = _due_at(timing, base_ms)
        validated = self._validate(session_id, events, dispatch=False)
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
        await self.scheduler.schedule(
            AppendTask(sid, self.contract.name, session_id, due_at_ms, scheduled)
        )

    # -- handlers ------------------------------------------------------------

    def _handler_context(
        self, trigger: StoredEvent, aborted: trio.Event | None
    ) -> HandlerContext[Any]:
        session_id = trigger.session_id[len(self._prefix) :]
        return HandlerContext(
            self._to_public(trigger),
            trigger.attempt_count,
            HandlerSession(self, session_id, trigger),
            aborted,
        )

    def _returned(self, trigger: StoredEvent, result: Any) -> list[AppendEvent]:
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
        return self._validate(session_id, with_ids)

    # -- reads ----------------------------------------------------------------

    async def _history(self, session_id: str, gte: int | None, lte: int | None) -> list[Event[Any]]:
        gte = _check_index("gte", gte)
        lte = _check_index("lte", lte)
        if gte is not None and lte is not None and gte > lte:
            raise ValueError(f"gte ({gte}) must be less than or equal to lte ({lte})")
        if lte == 0:
            return []
        with store_unavailable("read"):
            rows = await self.store.read(
                self._key(session_id),
                after_index=None if gte is None else max(0, gte - 1),
                through_index=lte,
            )
        return [self._to_public(row) for row in rows]

    async def _state(self, session_id: str, reducer: Reducer[S]) -> tuple[S, int]:
        if not isinstance(reducer, Reducer):
            raise TypeError(f"state() takes an a2trio.Reducer, got {reducer!r}")
        key = self._key(session_id)
        attributes = {
            "a2.contract": self.contract.name,
            "a2.session_id": session_id,
            "a2.state.reducer": reducer.name,
        }
        with self.telemetry.span("a2.state", attributes) as span:
            try:
                read = await self.store.read_state(key, reducer.name)
            except Exception:
                # The snapshot cache is not load-bearing: fall back to the log,
                # which still reports a real outage.
                with store_unavailable("read"):
                    read = StateRead(None, await self.store.read(key))
            state = reducer.fresh()
            index = 0
            outcome = "miss"
            rows = read.events
            if read.snapshot is not None:
                try:
                    state = (
                        msgspec.convert(read.snapshot.state, reducer.state_type)
                        if reducer.state_type is not None
                        else read.snapshot.state
                    )
                    index = read.snapshot.index
                    outcome = "hit"
                except (msgspec.ValidationError, TypeError):
                    outcome = "rejected"
                    state = reducer.fresh()
                    with store_unavailable("read"):
                        rows = await self.store.read(key)
            span.set_attribute("a2.state.snapshot", outcome)
            for row in rows:
                state = reducer.fold(state, self._to_public(row))
                index = row.index
            span.set_attribute("a2.state.folded", len(rows))
            span.set_attribute("a2.state.index", index)
            if rows and self._nursery is not None:
                snapshot = msgspec.to_builtins(state)
                self._spawn(self._put_snapshot, key, reducer.name, index, snapshot)
            return state, index

    async def _put_snapshot(self, key: str, reducer: str, index: int, state: Any) -> None:
        try:
            await self.store.put_snapshot(key, reducer, index, state)
        except Exception:
            # A disposable cache write; the next state() folds from the log.
            pass

    @asynccontextmanager
    async def _stream(
        self, session_id: str, start_after: int, presence: bool
    ) -> AsyncIterator[Feed[Any]]:
        _check_index("start_after", start_after)
        if presence:
            from .presence import open_presence_feed

            async with open_presence_feed(self, session_id, start_after) as feed:
                yield feed
            return
        if self._nursery is not None:
            async with open_shared_feed(
                self._fanouts,
                self._nursery,
                self.store,
                self._key(session_id),
                self._to_public,
                start_after,
            ) as shared:
                yield shared
            return
        async with self.store.stream(self._key(session_id), start_after=start_after) as rows:
            yield _EventFeed(rows, self._to_public)

    # -- presence -------------------------------------------------------------

    async def _set_presence(
        self,
        session_id: str,
        participant: str | PushedPresence,
        values: Mapping[str, Any],
        seen: int | None,
        at: int | None,
        *,
        fallback_seen: int,
    ) -> None:
        from .presence import set_presence

        await set_presence(self, session_id, participant, values, seen, at, fallback_seen)

    async def _read_presence(self, session_id: str) -> PresenceMap:
        from .presence import read_presence

        return await read_presence(self, session_id)


class _EventFeed(Feed[Event[Any]]):
    """Maps a store feed of rows onto typed events."""

    def __init__(self, rows: Feed[StoredEvent], to_public: Callable[[StoredEvent], Event[Any]]):
        self._rows = rows
        self._to_public = to_public

    async def receive(self) -> Event[Any]:
        return self._to_public(await self._rows.receive())


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


Server.__module__ = "a2trio"
PushedEvent.__module__ = "a2trio"
PushedPresence.__module__ = "a2trio"
PushValidation.__module__ = "a2trio"
