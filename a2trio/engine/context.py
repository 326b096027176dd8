"""The engine's context: what every part of the runtime shares.

:class:`Engine` is built once by :class:`a2trio.Server` and handed to every
engine part; none of them knows the server. It is a record of what the
server was built with (the contract, the store, the handled types and their
lanes, the scheduler, telemetry and metrics, ``validate_push``, timings, the clock), of
the shared parts, each the one owner of its state in a module of its own
(the background nursery, the watchdogs with the lease window, the batched
state reads, the sessions' shared feeds), and the key namespace: a session's
store key is ``<contract>\\x1f<session>``, so several contracts share one
store.

The write path is above this module (``writes.py``); the parts that append
reach it through the :class:`Appends` protocol, so this module imports no
part that appends, drains or runs handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from time import perf_counter
from typing import Any, Literal, Protocol, TypeVar

from ..clock import Clock, ms_to_datetime
from ..contract import AppendInput, Contract, Event
from ..push import PushedEvent, ValidatePush
from ..scheduler import Scheduler
from ..stores.base import EventCause, Store, StoredEvent
from ..telemetry import Metrics, Telemetry
from ..timings import Timings
from .background import Background
from .fanout import SessionFeeds
from .flow import Concurrency, FlowWaiters, PriorityFn, Throttle
from .pacing import Debounce
from .state import StateReads
from .transaction import Transaction
from .watchdogs import Watchdogs

__all__ = ["Appends", "Engine", "LaneFn", "Source", "WriteMode", "measured"]

#: ``lane(session_id, event) -> str``: a lane resolved when the event is appended.
LaneFn = Callable[[str, AppendInput], str]
Source = Literal["external", "handler"]
WriteMode = Literal["inline", "dispatch"]

_NS = "\x1f"

T = TypeVar("T")


async def measured(metrics: Metrics, operation: str, call: Awaitable[T]) -> T:
    """Await the store ``call``, reporting its time and whether it raised to
    ``metrics`` as ``operation``. Callers with no metrics await the call
    itself: ``await (call if metrics is None else measured(metrics, ...))``.
    A cancelled call is not reported: it neither failed nor took its time.
    Timed on the performance counter, not Trio's clock: a round trip's real
    length, and a cheaper read than a mock clock's."""
    started = perf_counter()
    try:
        result = await call
    except Exception:
        metrics.store_call(operation, perf_counter() - started, failed=True)
        raise
    metrics.store_call(operation, perf_counter() - started, failed=False)
    return result


class Appends(Protocol):
    """The write path (implemented by :class:`~a2trio.engine.writes.Writes`)."""

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
        transaction: Transaction | None = None,
    ) -> list[Event[Any]]:
        """Validate, append durably and hand pending work to a drain; with
        ``expected_index``, only if the log is still at that index; in the
        trace of ``trace_parent`` (a request's trace context) when given; in
        the app's ``transaction``, the drain's part once it commits."""
        ...


class Engine:
    """The shared context of one server (see the module docstring).

    Args:
      lanes: the event types that have a handler, each with its lane (a
        string, a :data:`LaneFn`, or None). Events of other types are stored
        settled.
      concurrency: the handled types with a :class:`~a2trio.Concurrency`.
      debounces: the event types whose handler is debounced, each with its
        :class:`~a2trio.Debounce`.
      throttle: the handled types with a :class:`~a2trio.Throttle`.
      priorities: the handled types with a ``priority=`` function.

    Attributes:
      background: the server's nursery and the tasks counted in it.
      watchdogs: the lease window and the watchdog arms.
      states: the batched state reads.
      feeds: the sessions' shared live feeds.
    """

    def __init__(
        self,
        contract: Contract,
        store: Store,
        *,
        lanes: Mapping[str, str | LaneFn | None],
        concurrency: Mapping[str, Concurrency] | None = None,
        debounces: Mapping[str, Debounce] | None = None,
        throttle: Mapping[str, Throttle] | None = None,
        priorities: Mapping[str, PriorityFn] | None = None,
        scheduler: Scheduler | None,
        telemetry: Telemetry,
        metrics: Metrics | None = None,
        validate_push: ValidatePush | None,
        presence_ttl_ms: int,
        timings: Timings,
        clock: Clock,
        run_handlers: bool,
    ) -> None:
        self.contract = contract
        self.store = store
        self.lanes = dict(lanes)
        #: The handled types with a concurrency limit, resolved at append.
        self.concurrency = dict(concurrency or {})
        #: The handled types with a throttle, resolved at append.
        self.throttle = dict(throttle or {})
        #: The handled types with a ``priority=``, resolved at append.
        self.priorities = dict(priorities or {})
        #: The sessions whose events wait on a full concurrency key.
        self.waiters = FlowWaiters()
        self.debounces = dict(debounces or {})
        self.scheduler = scheduler
        self.telemetry = telemetry
        #: Where the engine's numbers go; None (the default) skips every count.
        self.metrics = metrics
        self.validate_push = validate_push
        self.presence_ttl_ms = presence_ttl_ms
        self.timings = timings
        self.clock = clock
        self.run_handlers = run_handlers
        #: The store keys of this contract's sessions start with it.
        self.prefix = contract.name + _NS
        self.background = Background(contract.name)
        self.watchdogs = Watchdogs(contract.name, scheduler, timings, clock, self.background)
        self.states = StateReads(store, self.background)
        self.feeds = SessionFeeds(store, self.background, self.key, self.to_public)

    def key(self, session_id: str) -> str:
        """The store key of a session: namespaced by the contract's name."""
        return self.prefix + session_id

    def session_of(self, key: str) -> str | None:
        """The session id of a store key of this contract, or None."""
        return key[len(self.prefix) :] if key.startswith(self.prefix) else None

    def to_public(self, row: StoredEvent) -> Event[Any]:
        """A stored row as a typed event: the one place a stored payload is
        decoded, as the current version of its type (upcast from the version
        it was stored at: :mod:`a2trio.upcasting`).

        Raises:
          UpcastError: the payload cannot be read as the current version.
        """
        session_id = row.session_id[len(self.prefix) :]
        return Event(
            id=row.id,
            type=row.type,
            payload=self.contract.upcast(
                row.type,
                row.payload,
                row.version,
                session_id=session_id,
                index=row.index,
                event_id=row.id,
            ),
            index=row.index,
            session_id=session_id,
            created_at=ms_to_datetime(row.created_at_ms),
        )

    def as_stored(self, row: StoredEvent) -> Event[Any]:
        """A stored row as an event whose payload is as stored (JSON builtins,
        not upcast): what inspection shows of an event :meth:`to_public` refuses."""
        return Event(
            id=row.id,
            type=row.type,
            payload=row.payload,
            index=row.index,
            session_id=row.session_id[len(self.prefix) :],
            created_at=ms_to_datetime(row.created_at_ms),
        )
