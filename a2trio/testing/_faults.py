"""Fault injection at the store seam, without mocking a2trio's internals.

:class:`FaultyStore` wraps any real store and satisfies the same
:class:`~a2trio.stores.Store` protocol: every operation is delegated, and
chosen operations can be made to fail with ``STORE_UNAVAILABLE`` (as a real
backend outage surfaces) or to take longer, a number of times or between two
instants. The engine cannot tell an injected outage from a real one, which is
the point: what a test observes is what production would do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, get_args

import msgspec
import trio

from ..clock import Clock
from ..errors import A2Error, ErrorCode
from ..stores.base import (
    AppendEvent,
    AppendResult,
    AppTransactions,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    FailResult,
    Feed,
    Inspection,
    Journal,
    OperatorActions,
    PresenceStore,
    ReleaseResult,
    RenewResult,
    Retention,
    StateRead,
    Store,
    StoredEvent,
    SweepsClaimable,
    WatchesPending,
)

__all__ = ["Fault", "FaultyStore", "FaultyStoreStatistics", "InjectedFault", "Operation"]

T = TypeVar("T")

#: The store operations a fault can target (the :class:`~a2trio.stores.Store`
#: method names).
Operation = Literal[
    "append",
    "find_event",
    "read",
    "claim_available",
    "renew_claims",
    "complete_attempt",
    "fail_attempt",
    "release_attempt",
    "read_state",
    "read_states",
    "put_snapshot",
]
_OPERATIONS: frozenset[str] = frozenset(get_args(Operation))

#: An instant: Trio time in seconds (``trio.current_time()``), or an aware
#: datetime compared with the store's clock.
Instant = float | datetime


class InjectedFault(ConnectionError):
    """The ``__cause__`` of an injected ``STORE_UNAVAILABLE``: a stand-in for the
    driver error a real outage would carry."""


class FaultyStoreStatistics(msgspec.Struct, frozen=True):
    """Calls per operation, faults injected per operation, calls in flight."""

    calls: dict[str, int]
    injected: dict[str, int]
    in_flight: int


class Fault:
    """One injection rule, returned by :meth:`FaultyStore.fail` and
    :meth:`FaultyStore.delay`.

    It stays active until it has fired ``times`` times or is removed. Used as a
    context manager, it is removed when the block ends::

        with store.fail("renew_claims"):
            await app.advance(31)

    Attributes:
      fired: how many calls it has affected so far.
    """

    def __init__(
        self,
        store: FaultyStore,
        operations: frozenset[str],
        *,
        kind: Literal["fail", "delay"],
        times: int | None,
        start: Instant | None,
        end: Instant | None,
        seconds: float,
        after: bool,
    ) -> None:
        self._store = store
        self.operations = operations
        self.kind = kind
        self.times = times
        self.start = start
        self.end = end
        self.seconds = seconds
        self.after = after
        self.fired = 0

    def __repr__(self) -> str:
        ops = ",".join(sorted(self.operations))
        return f"Fault({self.kind} {ops}, fired={self.fired}, times={self.times})"

    def __enter__(self) -> Fault:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    @property
    def exhausted(self) -> bool:
        """True once it has fired ``times`` times."""
        return self.times is not None and self.fired >= self.times

    def remove(self) -> None:
        """Stop injecting. Idempotent."""
        self._store._remove(self)

    def _in_window(self, clock: Clock) -> bool:
        return (self.start is None or _reached(self.start, clock)) and (
            self.end is None or not _reached(self.end, clock)
        )

    def _applies(self, operation: str, clock: Clock) -> bool:
        return operation in self.operations and not self.exhausted and self._in_window(clock)

    async def _inject(self, operation: str) -> None:
        self._store._injected[operation] += 1
        if self.kind == "delay":
            await trio.sleep(self.seconds)
            return
        await trio.lowlevel.checkpoint()
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{operation} failed: injected fault"
        ) from InjectedFault(f"injected fault in {operation}")


def _reached(instant: Instant, clock: Clock) -> bool:
    if isinstance(instant, datetime):
        return clock.now_ms() >= int(instant.timestamp() * 1000)
    return trio.current_time() >= instant


class FaultyStore:
    """Wraps a store; fails or delays chosen operations on demand.

    Everything not listed in :data:`Operation` (presence, inspection,
    operator actions, retention, the app's transactions, the journal,
    ``stream``, the lifecycle) is delegated untouched.
    ``clock`` is the wrapped store's, so a server built on the wrapper
    stamps the same times. The store's wake-ups are not offered (``sweep``
    and ``pending`` are None): a server on the wrapper finds work only
    through its own appends and actions, its scheduler's watchdogs and
    explicit drains, so the instants a test asserts do not move with a sweep
    every ``sweep_s`` or another process's append.

    Args:
      inner: the store to wrap (memory, sqlite, Postgres, ...).

    Cancellation: each operation is a checkpoint. Cancelled during an injected
    delay before the call, nothing was committed; cancelled during the real
    call, the wrapped store's guarantee holds (all or nothing); with
    ``after=True`` the real call has committed before the delay or failure.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.clock: Clock = inner.clock
        self._faults: list[Fault] = []
        self._calls: Counter[str] = Counter()
        self._injected: Counter[str] = Counter()
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r})"

    # -- rules ---------------------------------------------------------------

    def fail(
        self,
        *operations: Operation,
        times: int | None = None,
        start: Instant | None = None,
        end: Instant | None = None,
        after: bool = False,
    ) -> Fault:
        """Make ``operations`` raise ``A2Error(STORE_UNAVAILABLE)``.

        Args:
          operations: store method names, e.g. ``"renew_claims"``.
          times: fire this many times, then stop (default: until removed).
          start / end: fire only from ``start`` (inclusive) until ``end``
            (exclusive): Trio seconds or aware datetimes on the store's clock.
          after: run the real operation first, then fail: the write committed
            but its answer was lost, as when a connection drops mid-reply.

        Raises:
          ValueError: an unknown operation, ``times < 1``, or ``end <= start``.
        """
        return self._add(
            operations, "fail", times=times, start=start, end=end, seconds=0.0, after=after
        )

    def delay(
        self,
        *operations: Operation,
        seconds: float,
        times: int | None = None,
        start: Instant | None = None,
        end: Instant | None = None,
        after: bool = False,
    ) -> Fault:
        """Make ``operations`` take ``seconds`` longer (Trio time: instant under
        the autojump clock).

        Args:
          seconds: the extra latency, before the real call (or after it with
            ``after=True``: committed, but the caller hears late).
          times / start / end: as for :meth:`fail`.

        Raises:
          ValueError: as for :meth:`fail`, or negative ``seconds``.
        """
        if not seconds >= 0:
            raise ValueError(f"`seconds` must be non-negative, got {seconds!r}")
        return self._add(
            operations, "delay", times=times, start=start, end=end, seconds=seconds, after=after
        )

    def clear(self) -> None:
        """Remove every fault."""
        self._faults.clear()

    @property
    def faults(self) -> list[Fault]:
        """The faults still installed, oldest first."""
        return list(self._faults)

    def statistics(self) -> FaultyStoreStatistics:
        """Calls and injected faults per operation, and calls in flight."""
        return FaultyStoreStatistics(dict(self._calls), dict(self._injected), self._in_flight)

    def _add(
        self,
        operations: Sequence[str],
        kind: Literal["fail", "delay"],
        *,
        times: int | None,
        start: Instant | None,
        end: Instant | None,
        seconds: float,
        after: bool,
    ) -> Fault:
        if not operations:
            raise ValueError(f"name at least one operation: {sorted(_OPERATIONS)}")
        unknown = sorted(set(operations) - _OPERATIONS)
        if unknown:
            raise ValueError(
                f"unknown store operation(s) {unknown}: choose from {sorted(_OPERATIONS)}"
            )
        if times is not None and (isinstance(times, bool) or times < 1):
            raise ValueError(f"`times` must be a positive integer or None, got {times!r}")
        for instant in (start, end):
            if isinstance(instant, datetime):
                if instant.tzinfo is None:
                    raise ValueError(f"use an aware datetime, got naive {instant!r}")
        if (
            start is not None and end is not None and type(start) is type(end) and not start < end  # type: ignore[operator]
        ):
            raise ValueError(f"`end` ({end!r}) must be after `start` ({start!r})")
        fault = Fault(
            self,
            frozenset(operations),
            kind=kind,
            times=times,
            start=start,
            end=end,
            seconds=seconds,
            after=after,
        )
        self._faults.append(fault)
        return fault

    def _remove(self, fault: Fault) -> None:
        if fault in self._faults:
            self._faults.remove(fault)

    async def wait_idle(self) -> None:
        """Wait until no operation is in flight (a checkpoint either way).

        The harness uses it to tell "blocked on time" from "blocked on a query"
        on backends that run queries in threads or sockets.
        """
        while self._in_flight:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    async def _call(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        self._calls[operation] += 1
        firing = [f for f in self._faults if f._applies(operation, self.clock)]
        for fault in firing:
            # Take the shot now, so concurrent calls cannot overspend `times`.
            fault.fired += 1
        try:
            for fault in firing:
                if not fault.after:
                    await fault._inject(operation)
            result = await self._real(call)
            for fault in firing:
                if fault.after:
                    await fault._inject(operation)
            return result
        finally:
            self._faults = [f for f in self._faults if not f.exhausted]

    async def _real(self, call: Callable[[], Awaitable[T]]) -> T:
        # Only the real call counts as in flight: an injected delay is a wait on
        # Trio time, which the harness must be free to jump past.
        if self._in_flight == 0:
            self._idle = trio.Event()
        self._in_flight += 1
        try:
            return await call()
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    # -- the Store protocol ---------------------------------------------------

    @property
    def presence(self) -> PresenceStore | None:
        return self.inner.presence

    @property
    def inspect(self) -> Inspection | None:
        return self.inner.inspect

    @property
    def sweep(self) -> SweepsClaimable | None:
        """None: see the class docstring."""
        return None

    @property
    def pending(self) -> WatchesPending | None:
        """None: see the class docstring."""
        return None

    @property
    def operator(self) -> OperatorActions | None:
        return self.inner.operator

    @property
    def retention(self) -> Retention | None:
        return self.inner.retention

    @property
    def journal(self) -> Journal | None:
        return self.inner.journal

    @property
    def transactions(self) -> AppTransactions | None:
        """The wrapped store's: an app transaction's statements and appends
        are not fault-injected."""
        return self.inner.transactions

    async def __aenter__(self) -> FaultyStore:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        return await self._call(
            "append",
            lambda: self.inner.append(
                session_id, events, claim=claim, expected_index=expected_index
            ),
        )

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        return await self._call("find_event", lambda: self.inner.find_event(session_id, event_id))

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        return await self._call(
            "read",
            lambda: self.inner.read(
                session_id, after_index=after_index, through_index=through_index
            ),
        )

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        return await self._call(
            "claim_available",
            lambda: self.inner.claim_available(
                session_id,
                holder=holder,
                ttl_ms=ttl_ms,
                expires_at_ms=expires_at_ms,
                exclude=exclude,
                limit=limit,
            ),
        )

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        return await self._call(
            "renew_claims",
            lambda: self.inner.renew_claims(
                session_id,
                holder=holder,
                claims=claims,
                ttl_ms=ttl_ms,
                expires_at_ms=expires_at_ms,
            ),
        )

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        return await self._call(
            "complete_attempt",
            lambda: self.inner.complete_attempt(
                session_id, index=index, attempt=attempt, events=events
            ),
        )

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
        retry_after_ms: int | None = None,
    ) -> FailResult:
        return await self._call(
            "fail_attempt",
            lambda: self.inner.fail_attempt(
                session_id,
                index=index,
                attempt=attempt,
                error=error,
                max_failures=max_failures,
                retry_after_ms=retry_after_ms,
            ),
        )

    async def release_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        delay_ms: int | None,
        wake_on: Sequence[str] = (),
        seen_through: int | None = None,
    ) -> ReleaseResult:
        return await self._call(
            "release_attempt",
            lambda: self.inner.release_attempt(
                session_id,
                index=index,
                attempt=attempt,
                delay_ms=delay_ms,
                wake_on=wake_on,
                seen_through=seen_through,
            ),
        )

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        return await self._call("read_state", lambda: self.inner.read_state(session_id, reducer))

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        return await self._call("read_states", lambda: self.inner.read_states(session_ids, reducer))

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        await self._call(
            "put_snapshot", lambda: self.inner.put_snapshot(session_id, reducer, index, state)
        )

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        return self.inner.stream(session_id, start_after=start_after)
