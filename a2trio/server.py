"""The server: the composition root that binds a contract to a store, handlers
and a nursery.

``Server(contract, store=..., handlers=...)`` validates everything at
construction and does no I/O. It builds the engine's parts and wires them
together; none of them knows the server (see ``docs/architecture.md``):

* :class:`~a2trio.engine.context.Engine`, what every part shares (contract,
  store, key namespace, the background nursery, the watchdogs and lease
  window, state reads, the sessions' shared feeds);
* :class:`~a2trio.engine.writes.Writes`, the write path, with the
  :class:`~a2trio.engine.drains.DrainRegistry` of background drains it wakes;
* :class:`~a2trio.Session` handles, which read through the engine and write
  through the write path.

``async with server:`` opens the store's and the scheduler's lifetimes and the
server's nursery, where background drains, snapshot write-backs and watchdog
arms live. Leaving the block cancels them: claims lapse and a later drain
retries, exactly as after a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType

import msgspec
import trio

from .actor import Actor
from .clock import Clock
from .contract import Contract
from .engine.actor_calls import ActorCalls, ActorHandle
from .engine.context import Engine
from .engine.crons import Cron, Crons
from .engine.drain import DrainResult
from .engine.gauges import ServerGauges
from .engine.handlers import Handlers, registrations
from .engine.inputs import delivered
from .engine.inspection import ServerInspection
from .engine.retention import ServerRetention
from .engine.session import Session
from .engine.transaction import Transaction, open_transaction
from .engine.writes import Writes
from .errors import A2Error, ErrorCode
from .identifiers import check_session_id
from .push import ValidatePush
from .scheduler import DrainTask, Scheduler, SchedulerTask
from .stores import default_store
from .stores.base import Store
from .telemetry import NOOP_TELEMETRY, Metrics, Telemetry
from .timings import DEFAULT_TIMINGS, Timings

__all__ = ["DEFAULT_MAX_HANDLERS", "Server", "ServerStatistics"]

#: Handlers running at once per server by default: enough to keep a store's
#: group commits full once the bound is reached, few enough that a burst of
#: 20,000 events is 1,024 tasks and the rest rows in the store. At 256, 100
#: busy sessions got ~2.5 slots each: every claim and completion was a few
#: events long, and batched throughput (appended to completed, Postgres) was
#: 0.75x of the cap lifted; at 1,024 it is 0.93-0.96x, at 74 MiB peak RSS
#: against 167 MiB lifted (issue 30, docs/performance.md).
DEFAULT_MAX_HANDLERS = 1024


class ServerStatistics(msgspec.Struct, frozen=True):
    """A debugging snapshot: running background drains and background tasks;
    free handler slots (of ``max_handlers``)."""

    drains: int
    background_tasks: int
    free_slots: int = 0


class Server:
    """Implements a contract: binds it to a store and to handlers.

    Args:
      contract: from :func:`a2trio.contract`.
      store: where events live. Default: ``A2_STORE`` if set, else by
        ``A2_ENV``: ``production`` refuses (``STORE_NOT_CONFIGURED``), ``test``
        uses memory, anything else sqlite at ``.a2/dev.db``
        (:func:`a2trio.stores.default_store`).
      handlers: a list of :func:`a2trio.on` registrations (typed by their
        event types), or a mapping event type -> async function or
        :func:`a2trio.handler` spec. Each is checked against the contract
        (:func:`a2trio.engine.handlers.registrations`).
      scheduler: a :class:`~a2trio.scheduler.Scheduler` for watchdogs,
        ``dispatch`` and ``schedule``. Without one the server heals on the next
        append.
      telemetry: spans (no-op by default).
      metrics: where the engine's numbers go (:class:`a2trio.telemetry.Metrics`:
        :class:`a2trio.metrics.PrometheusMetrics` for ``/_a2/metrics``,
        :class:`a2trio.otel.OpenTelemetryMetrics`); None (the default)
        counts nothing. While open, the server shows its gauges there.
      validate_push: authorizes events and presence that came over the wire.
      timings: every duration; see :class:`~a2trio.Timings`.
      clock: epoch ms for due times and presence stamps; defaults to the
        store's clock.
      run_handlers: False for a process that only appends (an API tier): its
        appends still record what the handlers imply (pending, lanes), but it
        wakes no drain, follows no other process's appends and runs no
        handler on its own. A watchdog drain its scheduler delivers is handed
        on: acknowledged, nothing claimed, the work left for a worker's sweep
        or cross-process wake-up (``store.pending``: Postgres, Redis). Only
        an explicit :meth:`drain` runs handlers here.
      sweep: on a store that can tell (``store.sweep``: memory, SQLite,
        Postgres, Redis), a server that runs handlers asks it for claimable
        work when it opens and every ``timings.sweep_s``, so nothing a
        crashed process left stays stranded without a scheduler or a further
        append. False leaves that to appends and watchdogs.
      max_handlers: the most handlers running at once in this server, across
        its sessions (:data:`DEFAULT_MAX_HANDLERS`). Drains claim no more than
        the free slots, so work past it stays claimable by other processes;
        an append claims its events at insert only while there is room.
      asyncio_loop: open a trio-asyncio loop for the server's lifetime, so
        handlers can call asyncio-only libraries through
        ``trio_asyncio.aio_as_trio`` (needs the ``asyncio`` extra).

    Raises:
      TypeError / ValueError: a bad handler, ``abort_on`` or lane, a presence
        ttl on a contract without presence, ``crons`` that are not
        :func:`a2trio.cron` schedules or share a name.
      A2Error: ``STORE_NOT_CONFIGURED``; ``PRESENCE_NOT_SUPPORTED`` when the
        contract declares presence and the store has no presence capability.
    """

    def __init__(
        self,
        contract: Contract,
        *,
        store: Store | None = None,
        handlers: Handlers | None = None,
        scheduler: Scheduler | None = None,
        telemetry: Telemetry | None = None,
        metrics: Metrics | None = None,
        validate_push: ValidatePush | None = None,
        presence_ttl_ms: int | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        clock: Clock | None = None,
        asyncio_loop: bool = False,
        run_handlers: bool = True,
        sweep: bool = True,
        max_handlers: int = DEFAULT_MAX_HANDLERS,
        crons: Sequence[Cron] = (),
    ) -> None:
        if not isinstance(contract, Contract):
            raise TypeError(f"Server expects a contract from a2trio.contract(), got {contract!r}")
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
        specs = registrations(contract, handlers)
        crons = _check_crons(crons)
        store = store if store is not None else default_store(contract.name)
        if contract.declares_presence and store.presence is None:
            raise A2Error(
                ErrorCode.PRESENCE_NOT_SUPPORTED,
                f"the contract '{contract.name}' declares presence but its store "
                f"{type(store).__name__} has no presence capability",
            )
        if asyncio_loop:
            try:
                import trio_asyncio  # noqa: F401 - checked here, opened in __aenter__
            except ImportError as exc:
                raise TypeError(
                    "asyncio_loop=True needs trio-asyncio: pip install 'a2trio[asyncio]'"
                ) from exc
        self._engine = Engine(
            contract,
            store,
            lanes={type_: spec.lane for type_, spec in specs.items()},
            concurrency={
                type_: spec.concurrency
                for type_, spec in specs.items()
                if spec.concurrency is not None
            },
            debounces={t: spec.debounce for t, spec in specs.items() if spec.debounce is not None},
            throttle={
                type_: spec.throttle for type_, spec in specs.items() if spec.throttle is not None
            },
            priorities={
                type_: spec.priority for type_, spec in specs.items() if spec.priority is not None
            },
            scheduler=scheduler,
            telemetry=telemetry or NOOP_TELEMETRY,
            metrics=metrics,
            validate_push=validate_push,
            presence_ttl_ms=(
                presence_ttl_ms
                if presence_ttl_ms is not None
                else int(timings.presence_ttl_s * 1000)
            ),
            timings=timings,
            clock=clock or store.clock,
            run_handlers=run_handlers,
        )
        if isinstance(max_handlers, bool) or not isinstance(max_handlers, int) or max_handlers < 1:
            raise ValueError(f"max_handlers must be a positive integer, got {max_handlers!r}")
        self._writes = Writes(self._engine, specs, max_handlers)
        self._drains = self._writes.drains
        self._crons = Crons(self._engine, self._writes, crons)
        self._calls = (
            ActorCalls(self._engine, self._writes, contract)
            if isinstance(contract, Actor)
            else None
        )
        #: The contract's sessions and events with their processing status
        #: (:class:`~a2trio.engine.inspection.ServerInspection`).
        self.inspect = ServerInspection(self._engine, self._drains.wake, self._crons)
        #: Export, archive and erase the contract's sessions
        #: (:class:`~a2trio.engine.retention.ServerRetention`).
        self.retention = ServerRetention(self._engine)
        #: The gauges shown with :attr:`metrics` while the server is open.
        self.gauges = ServerGauges(self._engine)
        self.asyncio_loop = asyncio_loop
        self.sweep = sweep
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Server({self.contract.name!r}, store={type(self.store).__name__})"

    # -- what the server was built with (read-only) -----------------------------

    @property
    def contract(self) -> Contract:
        """The contract this server implements."""
        return self._engine.contract

    @property
    def store(self) -> Store:
        """Where the events live."""
        return self._engine.store

    @property
    def scheduler(self) -> Scheduler | None:
        """The scheduler for watchdogs, ``dispatch`` and ``schedule``, if any."""
        return self._engine.scheduler

    @property
    def telemetry(self) -> Telemetry:
        """Where spans go."""
        return self._engine.telemetry

    @property
    def metrics(self) -> Metrics | None:
        """Where the engine's numbers go, if anywhere."""
        return self._engine.metrics

    @property
    def validate_push(self) -> ValidatePush | None:
        """The hook that authorizes what came over the wire."""
        return self._engine.validate_push

    @property
    def timings(self) -> Timings:
        """Every duration the engine uses."""
        return self._engine.timings

    @property
    def clock(self) -> Clock:
        """Epoch ms for due times and presence stamps."""
        return self._engine.clock

    @property
    def presence_ttl_ms(self) -> int:
        """How long a presence field lives after its last write."""
        return self._engine.presence_ttl_ms

    @property
    def run_handlers(self) -> bool:
        """Whether this process runs handlers: appends here wake its drains and
        a delivered watchdog drain runs here (see ``Server(run_handlers=...)``)."""
        return self._engine.run_handlers

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
            self._engine.background.attach(self._nursery)
            if self._drains.handlers and self.run_handlers:
                pending, sweep = self.store.pending, self.store.sweep
                if pending is not None:
                    # Cross-process wake-up: work appended by another process
                    # starts here at once (stores that can tell, e.g. Postgres).
                    stack.callback(pending.watch_pending(self._drains.wake_key))
                if self.sweep and sweep is not None:
                    # Nothing stays stranded: not counted by settle(), it never ends.
                    self._nursery.start_soon(self._drains.sweep, sweep)
            if self._crons.crons:
                # Not counted by settle() either: it fires until the server closes.
                self._nursery.start_soon(self._crons.serve)
            if self.metrics is not None:
                stack.callback(self.metrics.observe(self.gauges))
                # Not counted by settle(): it reads until the server closes.
                self._nursery.start_soon(self.gauges.poll)
        except BaseException:
            self._engine.background.attach(None)
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
        self._engine.background.attach(None)
        self._closed = True
        # The block's own exception is not the nursery's business: background
        # tasks were cancelled above, so it propagates as itself, not wrapped
        # in an ExceptionGroup.
        await stack.__aexit__(None, None, None)
        return None

    async def settle(self) -> None:
        """Wait until background drains, snapshot writes and arms are idle.

        For tests: after ``settle()`` every inline append's reaction has run to
        an outcome (handlers that wait on time still need the clock to move).

        Cancellation: only waits; cancelling it leaves the background alone.
        """
        await self._engine.background.settle()

    def statistics(self) -> ServerStatistics:
        """Running background drains and background tasks (for tests and debugging)."""
        return ServerStatistics(
            drains=self._drains.running,
            background_tasks=self._engine.background.tasks,
            free_slots=self._drains.slots.free,
        )

    # -- sessions ----------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """A handle on one session. Does no I/O.

        Raises:
          TypeError: an empty or non-string id. ValueError: an id longer than
          :data:`~a2trio.identifiers.MAX_ID_LENGTH` or holding a control
          character (U+0000-U+001F, U+007F-U+009F) or a lone surrogate.
        """
        return Session(self._engine, self._writes, check_session_id(session_id))

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """An app transaction on the server's store (SQLite, Postgres): the
        app's own SQL and its appends commit together, or not at all::

            async with server.transaction() as tx:
                await tx.execute("insert into orders (id, total) values ($1, $2)", (oid, 12))
                await server.session(oid).append(ordered(...), transaction=tx)

        The block commits when it ends and rolls back when it raises or is
        cancelled; the events are visible, claimable and live only once it
        committed (drains and feeds wake then). See ``docs/stores-postgres.md``
        and ``docs/stores-sqlite.md`` (the app's own transaction).

        Raises:
          A2Error: ``TRANSACTIONS_NOT_SUPPORTED`` on entering the block, for a
            store without them (memory, Redis); ``STORE_UNAVAILABLE``.
          SqlError: the block swallowed an error that aborted the transaction
            (nothing was committed).
        """
        return open_transaction(self.store)

    def actor(self, actor_id: str) -> ActorHandle:
        """A handle on one actor of the server's :func:`a2trio.actor` (its
        calls, state and live states). Does no I/O.

        Raises:
          TypeError: the server's contract is not an actor; a bad id, as
            :meth:`session`. ValueError: as :meth:`session`.
        """
        if self._calls is None:
            raise TypeError(
                f"{self!r} implements a contract, not an actor: declare it with a2trio.actor()"
            )
        return ActorHandle(self._calls, check_session_id(actor_id))

    def key(self, session_id: str) -> str:
        """The store key of a session (``<contract>\\x1f<session>``): what the
        store-level API (``store.read``, ``store.inspect``) takes."""
        return self._engine.key(check_session_id(session_id))

    async def ping(self) -> float:
        """One round trip to the store (an empty read); its duration in seconds.
        What ``GET /_a2/health`` and ``serve``'s start-up check ask.

        Raises:
          Exception: the store's failure, as the store raised it.

        Cancellation: a read; nothing to undo. Callers bound it with
        ``trio.fail_after``.
        """
        started = trio.current_time()
        await self.store.read(self._engine.key("_a2-ping"), through_index=0)
        return trio.current_time() - started

    async def drain(self, session_id: str) -> DrainResult:
        """Process every eligible event of a session, in this task, to the end.

        Returns:
          ``settled`` is true when nothing actionable remains; ``busy`` says
          another holder's claims are live; ``stalled`` that an event failed.

        Cancellation: cancelling cancels the handlers; their claims lapse and a
        later drain retries them.
        """
        return await self._drains.drain(check_session_id(session_id))

    async def deliver(self, task: SchedulerTask) -> None:
        """Run a due scheduler task: a watchdog drain or a delayed append.

        A server that does not run handlers hands a watchdog drain on: it
        returns at once, claiming nothing, and the work stays claimable for a
        worker (its sweep, or the cross-process wake-up, finds it).

        Raises:
          ValueError: the task is for another contract.
          A2Error: the append failed (the scheduler retries the task).
          UpcastError: an event queued by an older release (at an older
            version of its payload) cannot be upcast (retried, too).

        Cancellation: safe to retry: appends replay by their deterministic
        ids and a drain is idempotent.
        """
        if task.contract != self.contract.name:
            raise ValueError(
                f"scheduler task for contract {task.contract!r} cannot be delivered to "
                f"{self.contract.name!r}"
            )
        session_id = check_session_id(task.session_id)
        metrics = self._engine.metrics
        if metrics is not None:
            late_ms = max(0, self.clock.now_ms() - task.due_at_ms)
            metrics.scheduler_lag(self.contract.name, late_ms / 1000)
        if isinstance(task, DrainTask):
            if self.run_handlers:
                await self._drains.drain(session_id, watchdog_due_at_ms=task.due_at_ms)
            return
        await self._writes.append(
            session_id,
            delivered(self._engine, task),
            source="external",
            mode="inline",
            require_arm=True,
            trace_parent=task.trace_parent,
        )


def _check_crons(crons: object) -> Sequence[Cron]:
    if isinstance(crons, str | bytes) or not isinstance(crons, Sequence):
        raise TypeError(f"crons must be a list of a2trio.cron(...) schedules, got {crons!r}")
    names: set[str] = set()
    for each in crons:
        if not isinstance(each, Cron):
            raise TypeError(f"crons takes schedules built with a2trio.cron(...), got {each!r}")
        if each.name in names:
            raise ValueError(
                f"crons holds two schedules named {each.name!r}: cron names must be unique"
            )
        names.add(each.name)
    return list(crons)


Server.__module__ = "a2trio"
