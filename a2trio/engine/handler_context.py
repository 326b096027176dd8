"""What a handler receives: :class:`HandlerContext`, the triggering event, its
attempt and session, and the durable calls (``step``, ``wait_for``,
``sleep``, ``sleep_until``: :mod:`.durable`, ``docs/durable-handlers.md``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, TypeVarTuple, overload

import trio

from ..contract import Event, EventType
from .durable import DurableRun

if TYPE_CHECKING:
    from ..stores.base import StoredEvent
    from .context import Engine
    from .session import HandlerSession

__all__ = ["HandlerContext"]

T = TypeVar("T")
W = TypeVar("W")
Ts = TypeVarTuple("Ts")
#: Covariant: a handler taking ``HandlerContext[A | B]`` may be registered
#: for an event of ``A`` (the context is only read).
P_co = TypeVar("P_co", covariant=True)


class HandlerContext(Generic[P_co]):
    """What a handler receives.

    Attributes:
      event: the triggering event, payload typed.
      attempt: the durable, 1-based dispatch ordinal of this run.
      session: this session, whose ``append(name, *events)`` is idempotent per
        trigger: ids derive from (trigger id, name, position), and the store
        refuses it once a newer attempt owns the trigger (``SUPERSEDED_ATTEMPT``).
      aborted: set when an ``abort_on`` event matched. The handler is also
        cancelled then, unless it shields itself to finish and return events.

    Durable steps (:meth:`step`) journal their results in the store, so a
    later attempt of the same trigger skips them (``docs/durable-handlers.md``).
    """

    __slots__ = (
        "_aborted",
        "_durable",
        "_engine",
        "_task",
        "_trigger",
        "attempt",
        "event",
        "session",
    )

    def __init__(
        self,
        event: Event[P_co],
        session: HandlerSession,
        aborted: trio.Event | None,
        engine: Engine,
        trigger: StoredEvent,
    ) -> None:
        self.event = event
        self.attempt = trigger.attempt_count
        self.session = session
        self._aborted = aborted
        # Made at the first durable call: a handler without any reads nothing.
        self._engine = engine
        self._trigger = trigger
        self._durable: DurableRun | None = None
        # The handler's own task: only a sleep there can unwind the handler
        # (in a child task, a nursery would wrap the Suspend in a group).
        self._task = trio.lowlevel.current_task()

    @property
    def aborted(self) -> trio.Event:
        """Set when an ``abort_on`` event matched (never, for a handler without
        ``abort_on``; its event is made only if asked for: one fewer object per
        event for the garbage collector)."""
        if self._aborted is None:
            self._aborted = trio.Event()
        return self._aborted

    def _run(self) -> DurableRun:
        if self._durable is None:
            self._durable = DurableRun(self._engine, self.session.id, self._trigger)
        return self._durable

    @overload
    async def step(self, name: str, fn: Callable[[*Ts], Awaitable[T]], /, *args: *Ts) -> T: ...

    @overload
    async def step(self, name: str, fn: Callable[[*Ts], T], /, *args: *Ts) -> T: ...

    async def step(self, name: str, fn: Callable[..., Any], /, *args: object) -> Any:
        """Run ``fn(*args)`` once per (trigger event, ``name``), durably.

        The first attempt that reaches the step calls ``fn`` (awaited if
        async; a plain one runs in the Trio thread) and journals its result
        in the store before the step returns. Every later attempt of the
        same trigger (after a failure, a lapsed lease, a crash, on any
        process) gets the journaled result without calling ``fn``. The
        journal is read once per attempt, at its first step.

        The result must be encodable by msgspec as JSON; the step returns it
        decoded as ``fn``'s return annotation (``Any`` without one), the
        same value on the first run and on every replay.

        Not journaled, so run again by the next attempt: a step that raises
        (the exception propagates), and a step cancelled before its result
        is journaled (a lease lapse, an ``abort_on`` match, a ``timeout``):
        ``fn`` is cancelled at its next await, and whatever it did before
        that happens again on the next attempt. Make such effects idempotent
        (a key derived from ``ctx.event.id`` and ``name``).

        Raises:
          TypeError: ``name`` is not a non-empty string, ``fn`` is not
            callable, or its result cannot be encoded (or a journaled one
            no longer decodes as ``fn``'s return annotation).
          ValueError: ``name`` is used twice in one run, or starts with
            ``"a2:"`` (a2trio's own entries).
          A2Error: ``SUPERSEDED_ATTEMPT``, a newer attempt owns the trigger:
            nothing was journaled.
          RuntimeError: the store keeps no journal (``store.journal`` is None).
        """
        return await self._run().step(name, fn, args)

    @overload
    async def wait_for(
        self,
        type: EventType[W],
        *,
        where: Callable[[Event[W]], bool] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (journaled, not a cancel scope)
    ) -> Event[W] | None: ...

    @overload
    async def wait_for(
        self,
        type: str,
        *,
        where: Callable[[Event[Any]], bool] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (journaled, not a cancel scope)
    ) -> Event[Any] | None: ...

    async def wait_for(
        self,
        type: str | EventType[Any],
        *,
        where: Callable[[Event[Any]], bool] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (journaled, not a cancel scope)
    ) -> Event[Any] | None:
        """The first event of ``type`` in this session after the trigger for
        which ``where(event)`` is true, or None once ``timeout`` seconds have
        passed since the wait began.

        Durable: the instant the wait began is journaled (a rerun's timeout
        counts from it, not from the rerun), and so is the answer (a rerun
        answers the same event, or None, without looking again). An event
        already in the log answers at once. Otherwise, with less than the
        claim's lease (``Timings.claim_ttl_s``) left, the attempt follows the
        session's feed until one lands or the timeout passes, holding its
        claim; a longer wait (or one without a timeout) from the handler's
        own task suspends the attempt as :meth:`sleep` does: no claim, no
        task, until an event of ``type`` lands in the session (which makes
        it claimable at once: the rerun finds it in the log) or the timeout
        passes. ``where`` must be a pure function of the event: an event of
        ``type`` it refuses wakes the attempt for one more rerun.

        Raises:
          ValueError: ``type`` is not an event type of the contract, or a
            negative ``timeout``.
          TypeError: ``where`` is not callable.
          A2Error: ``SUPERSEDED_ATTEMPT``, as :meth:`step`.
        """
        name = type.name if isinstance(type, EventType) else type
        return await self._run().wait_for(name, where, timeout, self._own())

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` durably: the wake instant is journaled, so a
        rerun sleeps only what is left of it.

        A sleep shorter than the claim's lease (``Timings.claim_ttl_s``)
        sleeps in the attempt. A longer one suspends it: the handler is
        unwound (:class:`~a2trio.engine.durable.Suspend`, a
        ``BaseException``: do not swallow it; called from a child task of a
        nursery the sleep stays in the attempt instead), the claim is
        released without counting a failure, and no process holds or polls
        the event until the wake instant, when any process that runs
        handlers reruns the handler: its steps answer from the journal and
        the sleep has passed. The event's lane waits behind it.

        Raises:
          ValueError: ``seconds`` is negative or not finite.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"seconds must be a number, got {seconds!r}")
        if not (seconds >= 0 and seconds < float("inf")):
            raise ValueError(f"seconds must be non-negative and finite, got {seconds!r}")
        run = self._run()
        now = self._engine.store.clock.now_ms()
        await run.sleep_until_ms(now + round(seconds * 1000), f"sleep({seconds!r})", self._own())

    async def sleep_until(self, when: datetime) -> None:
        """:meth:`sleep` until ``when`` (an aware datetime, on the store's
        clock); at once if it has passed.

        Raises:
          ValueError: a naive datetime.
        """
        if not isinstance(when, datetime):
            raise TypeError(f"sleep_until takes a datetime, got {when!r}")
        if when.tzinfo is None:
            raise ValueError(f"sleep_until needs an aware datetime, got naive {when!r}")
        wake_at = round(when.timestamp() * 1000)
        what = f"sleep_until({when.isoformat()})"
        await self._run().sleep_until_ms(wake_at, what, self._own())

    def _own(self) -> bool:
        return trio.lowlevel.current_task() is self._task

    def __repr__(self) -> str:
        return f"HandlerContext(event={self.event.type}#{self.event.index}, attempt={self.attempt})"


HandlerContext.__module__ = "a2trio"
