"""Durable handlers (issue 34): one attempt's steps, journaled in the store.

Theory of operation. a2trio reruns a whole handler after a failure, a lapsed
lease or a crash; its returned events are exactly-once, but an outside
effect before the crash happens again. ``await ctx.step(name, fn, *args)``
makes one effect durable: the first attempt that reaches the step runs
``fn`` and journals its result in the store (``store.journal``,
:class:`~a2trio.stores.base.Journal`) before the step returns; every later
attempt of the same trigger event answers the step from the journal without
running ``fn``.

* The journal is keyed by (session, trigger index, name) and written once:
  the first write of a name wins, a repeat answers it.
* A write is fenced by the attempt (``rules.journals``): only the attempt
  that holds the trigger's claim journals, so a superseded attempt's step
  never lands (it raises ``SUPERSEDED_ATTEMPT``, as its appends do).
* The journal is read once per attempt, at the first step (a handler that
  never calls ``step`` reads nothing), and kept in :class:`DurableRun`.
* A step that raises journals nothing: the next attempt runs it again. So
  does a step cancelled (a lease lapse, an ``abort_on`` match, a timeout)
  before its result is journaled: ``fn`` is cancelled at its next await and
  the next attempt runs it again. An effect that ``fn`` caused before the
  cancellation happens twice unless the effect itself is idempotent (pass a
  key derived from ``ctx.event.id`` and the step's name to the payment API,
  say): the journal makes a completed step exactly-once, not the part of an
  effect that ran when the attempt was cut off.
* A step's value is what the journal holds: the result encoded as JSON
  (msgspec) and decoded as ``fn``'s return annotation (``Any`` without
  one), on the first run as on every replay, so both see the same value.

Waits and sleeps are journaled the same way, under names of a2trio's own
(``a2:wait:<n>``, ``a2:sleep:<n>``: the n-th wait or sleep of the run):

* ``wait_for`` journals the instant it began (its timeout counts from it on
  every attempt) and then its answer (the index of the event it found, or
  none after the timeout), so a rerun answers the same. A wait with less
  than the claim's lease left follows the session's feed, holding its
  claim; a longer one (or one without a timeout) suspends the attempt as a
  long sleep does, until its timeout (or no wake time), with the wait's
  type as its wake mark (``release_attempt(wake_on=..., seen_through=...)``,
  ``rules.wake_verdict``): an event of that type landing in the session
  makes the event claimable at once, and the rerun finds it in the log.
* ``sleep`` journals its wake instant. A sleep shorter than the claim's
  lease (``Timings.claim_ttl_s``) sleeps in the attempt; a longer one
  suspends the attempt (:class:`Suspend`, caught by the attempt runner): its
  claim is released without a failure and the event is not claimable before
  the wake instant (``store.release_attempt``), so no process holds it or
  polls for it meanwhile; at the wake instant any process that runs
  handlers claims it (this one's watchdog, another's sweep) and reruns the
  handler, whose steps answer from the journal and whose sleep has passed.
* A suspended handler with ``abort_on`` also wakes on its abort types
  (:mod:`.suspend`), so an abort settles it at once, not at its wake.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ..contract import Event
from ..signatures import return_annotation

if TYPE_CHECKING:
    from ..stores.base import Journal, JournalEntry, StoredEvent
    from .context import Engine

__all__ = ["RESERVED_PREFIX", "DurableRun", "Suspend", "Waiting", "waiting"]

#: Step names the engine journals for itself (waits) start with it; a
#: handler's own step names may not.
RESERVED_PREFIX = "a2:"

_encode = msgspec.json.Encoder().encode


class _Answer(msgspec.Struct, frozen=True):
    """A wait's journaled answer: the index of the event found, or None."""

    index: int | None


class _Since(msgspec.Struct, frozen=True):
    """When a wait began (epoch ms), for what event type, until when (or None)."""

    at_ms: int
    type: str
    until_ms: int | None


class Waiting(msgspec.Struct, frozen=True):
    """What a journal says its attempt waits for: an event ``type`` (a
    running ``wait_for``) or ``sleep``, ``until_ms`` (None: no timeout)."""

    what: str
    until_ms: int | None


def waiting(entries: list[JournalEntry], now_ms: int) -> Waiting | None:
    """What the trigger whose journal is ``entries`` waits for at ``now_ms``:
    its last wait that has no answer yet, or a sleep that has not passed
    (inspection's ``waiting`` state); None for neither."""
    by_name = {entry.name: entry for entry in entries}
    for entry in reversed(entries):
        if entry.name.startswith(f"{RESERVED_PREFIX}sleep:"):
            wake_at = msgspec.json.decode(entry.result, type=int)
            return Waiting("sleep", wake_at) if wake_at > now_ms else None
        if entry.name.startswith(f"{RESERVED_PREFIX}wait:") and entry.name.endswith(":since"):
            if entry.name.removesuffix(":since") in by_name:
                return None
            since = msgspec.json.decode(entry.result, type=_Since)
            return Waiting(since.type, since.until_ms)
    return None


class Suspend(BaseException):
    """Raised by a durable sleep or wait to end the attempt until
    ``wake_at_ms`` (epoch ms on the store's clock; None: no wake time): the
    attempt runner releases the claim without a failure. A
    ``BaseException``, so a handler's ``except Exception`` lets it through;
    a handler must not swallow it.

    Attributes:
      wake_at_ms: when the event becomes claimable again (None: only when
        an event of ``wake_on`` lands, or an operator wakes it).
      reason: what the attempt waits for (for logs and inspection).
      wake_on: the event types whose arrival wakes it sooner (a wait's).
      seen_through: the last index the wait read (``wake_on``'s events up
        to it were looked at).
    """

    def __init__(
        self,
        wake_at_ms: int | None,
        reason: str,
        wake_on: tuple[str, ...] = (),
        seen_through: int | None = None,
    ) -> None:
        super().__init__(f"suspended until {wake_at_ms} ({reason})")
        self.wake_at_ms = wake_at_ms
        self.reason = reason
        self.wake_on = wake_on
        self.seen_through = seen_through


class DurableRun:
    """The durable calls of one handler run (one attempt of one trigger).

    Args:
      engine: the server's engine (its store's journal, the key namespace).
      session_id: the trigger's session.
      trigger: the trigger's stored row (its index and attempt).
    """

    __slots__ = (
        "_attempt",
        "_engine",
        "_entries",
        "_index",
        "_key",
        "_session_id",
        "_sleeps",
        "_used",
        "_waits",
    )

    def __init__(self, engine: Engine, session_id: str, trigger: StoredEvent) -> None:
        self._engine = engine
        self._key = engine.key(session_id)
        self._index = trigger.index
        self._attempt = trigger.attempt_count
        self._session_id = session_id
        self._entries: dict[str, JournalEntry] | None = None
        self._used: set[str] = set()
        self._waits = 0
        self._sleeps = 0

    def _journal(self) -> Journal:
        journal = self._engine.store.journal
        if journal is None:
            raise RuntimeError(
                f"the store {self._engine.store!r} keeps no journal (store.journal is None): "
                "durable handler steps need one (memory, SQLite, Postgres and Redis keep it)"
            )
        return journal

    async def _journaled(self) -> dict[str, JournalEntry]:
        """The trigger's journal, read once per run (at its first use)."""
        if self._entries is None:
            entries = await self._journal().read_journal(self._key, self._index)
            self._entries = {entry.name: entry for entry in entries}
        return self._entries

    def _claim_name(self, name: str) -> None:
        if name in self._used:
            raise ValueError(
                f"step name {name!r} is used twice in one run of the handler: "
                "each step of a handler needs a name of its own"
            )
        self._used.add(name)

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """See :meth:`a2trio.HandlerContext.step`."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"step name must be a non-empty string, got {name!r}")
        if name.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"step name {name!r} starts with {RESERVED_PREFIX!r}, which a2trio keeps "
                "for its own journal entries: choose another name"
            )
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, got {fn!r}")
        self._claim_name(name)
        kind = return_annotation(fn)
        stored = (await self._journaled()).get(name)
        if stored is None:
            result = fn(*args)
            if inspect.isawaitable(result):
                result = await result
            stored = await self.record(name, result, f"step {name!r}")
        return decode(stored, kind, f"step {name!r}")

    async def record(self, name: str, value: object, what: str) -> JournalEntry:
        """Journal ``value`` under ``name`` (fenced by the attempt) and keep
        the entry the store answers (the first one written)."""
        try:
            encoded = _encode(value)
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(
                f"{what} returned {type(value).__name__}, which cannot be journaled: "
                f"return a value msgspec encodes as JSON ({exc})"
            ) from exc
        entry = await self._journal().write_step(
            self._key, index=self._index, attempt=self._attempt, name=name, result=encoded
        )
        if self._entries is not None:
            self._entries[name] = entry
        return entry

    async def _journaled_value(self, name: str, value: object, kind: Any) -> Any:
        """The value journaled under ``name``, written as ``value`` if none is."""
        entry = (await self._journaled()).get(name)
        if entry is None:
            entry = await self.record(name, value, name)
        return decode(entry, kind, name)

    async def wait_for(
        self,
        type: str,
        where: Callable[[Event[Any]], bool] | None,
        timeout_s: float | None,
        suspendable: bool,
    ) -> Event[Any] | None:
        """See :meth:`a2trio.HandlerContext.wait_for` (``suspendable``: called
        from the handler's own task)."""
        engine = self._engine
        if type not in engine.contract.events:
            raise ValueError(
                f"contract {engine.contract.name!r} has no event type {type!r} to wait for"
            )
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not (timeout_s >= 0 and math.isfinite(timeout_s))
        ):
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout_s!r}")
        if where is not None and not callable(where):
            raise TypeError(f"where must be a predicate over events, got {where!r}")
        self._waits += 1
        name = f"{RESERVED_PREFIX}wait:{self._waits}"
        clock = engine.store.clock
        now = clock.now_ms()
        until = None if timeout_s is None else now + math.ceil(timeout_s * 1000)
        # The first run's start, what it waits for and until when (a rerun keeps them).
        began = await self._journaled_value(f"{name}:since", _Since(now, type, until), _Since)
        answered = (await self._journaled()).get(name)
        if answered is not None:
            index = decode(answered, _Answer, name).index
            return None if index is None else await self._event_at(index)
        deadline = began.until_ms
        rows = await engine.store.read(self._key, after_index=self._index)
        found = self._match(type, where, rows)
        now = clock.now_ms()
        if found is None and (deadline is None or now < deadline):
            # The feed (or the release's own check) starts after the rows
            # just read: nothing between is missed.
            cursor = rows[-1].index if rows else self._index
            ttl_ms = self._engine.timings.claim_ttl_s * 1000
            if suspendable and (deadline is None or deadline - now >= ttl_ms):
                raise Suspend(deadline, f"wait_for({type!r})", (type,), cursor)
            found = await self._follow(type, where, cursor, deadline)
        await self.record(name, _Answer(None if found is None else found.index), name)
        return found

    def _match(
        self,
        type: str,
        where: Callable[[Event[Any]], bool] | None,
        rows: list[StoredEvent],
    ) -> Event[Any] | None:
        for row in rows:
            if row.type == type and row.index > self._index:
                event = self._engine.to_public(row)
                if where is None or where(event):
                    return event
        return None

    async def _follow(
        self,
        type: str,
        where: Callable[[Event[Any]], bool] | None,
        cursor: int,
        deadline: int | None,
    ) -> Event[Any] | None:
        """Follow the session's feed after ``cursor`` until a match, or None
        at ``deadline`` (epoch ms on the store's clock)."""
        clock = self._engine.store.clock
        remaining = math.inf if deadline is None else (deadline - clock.now_ms()) / 1000
        with trio.move_on_after(max(0.0, remaining)):
            # The process's shared feed of the session (one store feed for
            # every reader of it here).
            async with self._engine.feeds.open(self._session_id, cursor) as events:
                while True:
                    event = await events.receive()
                    if event.type == type and (where is None or where(event)):
                        return event
        return None

    async def _event_at(self, index: int) -> Event[Any]:
        [row] = await self._engine.store.read(self._key, after_index=index - 1, through_index=index)
        return self._engine.to_public(row)

    async def sleep_until_ms(self, wake_at_ms: int, what: str, suspendable: bool) -> None:
        """See :meth:`a2trio.HandlerContext.sleep`: ``wake_at_ms`` is asked
        for (journaled on the first run; a rerun keeps the first);
        ``suspendable``: called from the handler's own task."""
        self._sleeps += 1
        name = f"{RESERVED_PREFIX}sleep:{self._sleeps}"
        wake_at = await self._journaled_value(name, wake_at_ms, int)
        remaining = (wake_at - self._engine.store.clock.now_ms()) / 1000
        if remaining <= 0:
            await trio.lowlevel.checkpoint()
            return
        if remaining < self._engine.timings.claim_ttl_s or not suspendable:
            # Short, or in a child task: in the attempt, the claim renewed.
            await trio.sleep(remaining)
            return
        raise Suspend(wake_at, what)


def decode(entry: JournalEntry, kind: Any, what: str) -> Any:
    """A journaled value as ``kind``.

    Raises:
      TypeError: the journaled JSON is not a ``kind`` (the step's annotation
        changed since it was journaled).
    """
    try:
        return msgspec.json.decode(entry.result, type=kind)
    except msgspec.ValidationError as exc:
        raise TypeError(
            f"{what}: the journaled result {entry.result[:200]!r} is not a "
            f"{getattr(kind, '__name__', kind)} ({exc}): was the step's return type changed?"
        ) from exc
