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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ..signatures import return_annotation

if TYPE_CHECKING:
    from ..stores.base import Journal, JournalEntry, StoredEvent
    from .context import Engine

__all__ = ["RESERVED_PREFIX", "DurableRun"]

#: Step names the engine journals for itself (waits) start with it; a
#: handler's own step names may not.
RESERVED_PREFIX = "a2:"

_encode = msgspec.json.Encoder().encode


class DurableRun:
    """The durable calls of one handler run (one attempt of one trigger).

    Args:
      engine: the server's engine (its store's journal, the key namespace).
      session_id: the trigger's session.
      trigger: the trigger's stored row (its index and attempt).
    """

    __slots__ = ("_attempt", "_engine", "_entries", "_index", "_key", "_used")

    def __init__(self, engine: Engine, session_id: str, trigger: StoredEvent) -> None:
        self._engine = engine
        self._key = engine.key(session_id)
        self._index = trigger.index
        self._attempt = trigger.attempt_count
        self._entries: dict[str, JournalEntry] | None = None
        self._used: set[str] = set()

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
