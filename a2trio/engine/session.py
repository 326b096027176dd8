"""Sessions: handles on one instance of a contract. Creating one does no I/O.

Three classes, one per audience: :class:`SessionView` holds the reads every
session has (history, state, the live feed, presence); :class:`Session` is
what an app writes through; :class:`HandlerSession` is what a handler gets,
whose appends are idempotent per trigger and fenced by its attempt. A handler
session is not a :class:`Session`: its ``append`` takes a name first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from ..contract import AppendInput, Event, Reducer
from ..identifiers import MAX_SAFE_INTEGER
from ..ids import handler_event_id
from ..push import PushedEvent, PushedPresence, PushValidation
from ..stores.base import EventCause, StateRead, StoredEvent
from ..stores.feed import Feed
from .context import Appends, Engine, WriteMode
from .fanout import Subscription
from .inputs import check_push, schedule
from .presence import (
    PresenceMap,
    check_pushed_presence,
    open_presence_feed,
    read_presence,
    set_presence,
    store_patch,
)
from .transaction import Transaction

__all__ = ["MAX_HISTORY_EVENTS", "HandlerSession", "Session", "SessionView"]

S = TypeVar("S")
Tx = Transaction | None


#: The most events one ``history()`` read returns (and the HTTP history lane
#: answers): a read holds every row in memory at once.
MAX_HISTORY_EVENTS = 10_000


def _too_long(after: int, lte: int | None) -> str:
    span = f"gte={after + 1}" + ("" if lte is None else f", lte={lte}")
    return (
        f"history reads at most {MAX_HISTORY_EVENTS:,} events at once and {span} holds more: "
        "page through it with gte and lte"
    )


def _check_index(name: str, value: object) -> int | None:
    if value is None:
        return None
    # Bounded so that no store sees an index past its integer columns (SQLite
    # raised OverflowError past 64 bits: an outage, not the caller's error).
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(
            f"{name} must be a non-negative integer up to {MAX_SAFE_INTEGER}, got {value!r}"
        )
    return value


class SessionView:
    """The reads of one session, shared by :class:`Session` and
    :class:`HandlerSession`. Every async method is a checkpoint."""

    __slots__ = ("_appends", "_engine", "id")

    def __init__(self, engine: Engine, appends: Appends, session_id: str) -> None:
        self._engine = engine
        self._appends = appends
        self.id = session_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._engine.contract.name!r}, {self.id!r})"

    async def history(self, *, gte: int | None = None, lte: int | None = None) -> list[Event[Any]]:
        """Events with ``gte <= index <= lte`` (both optional), in order: at most
        :data:`MAX_HISTORY_EVENTS` of them.

        Raises:
          ValueError: a bound that is not a non-negative int, ``gte > lte``, or
            a range holding more than ``MAX_HISTORY_EVENTS`` events (page
            through it with ``gte`` and ``lte``).

        Cancellation: a read; nothing to undo.
        """
        gte = _check_index("gte", gte)
        lte = _check_index("lte", lte)
        if gte is not None and lte is not None and gte > lte:
            raise ValueError(f"gte ({gte}) must be less than or equal to lte ({lte})")
        if lte == 0:
            return []
        after = 0 if gte is None else max(0, gte - 1)
        # Indexes are contiguous, so a bounded range's size is known; an open
        # one reads one row past the cap to tell.
        if lte is not None and lte - after > MAX_HISTORY_EVENTS:
            raise ValueError(_too_long(after, lte))
        through = lte if lte is not None else after + MAX_HISTORY_EVENTS + 1
        engine = self._engine
        rows = await engine.store.read(
            engine.key(self.id),
            after_index=None if gte is None else after,
            through_index=through,
        )
        if len(rows) > MAX_HISTORY_EVENTS:
            raise ValueError(_too_long(after, None))
        return [engine.to_public(row) for row in rows]

    async def state(self, reducer: Reducer[S]) -> tuple[S, int]:
        """Fold the session with ``reducer``: the state and the last folded index.

        Starts from the cached snapshot (refolding from the log if it fails
        ``reducer.state_type``) and writes a fresher snapshot back in the
        background.

        Cancellation: a read; the snapshot write-back, if started, lives in the
        server's nursery and is a disposable cache.
        """
        if not isinstance(reducer, Reducer):
            raise TypeError(f"state() takes an a2trio.Reducer, got {reducer!r}")
        engine = self._engine
        store = engine.store
        key = engine.key(self.id)
        attributes = {
            "a2.contract": engine.contract.name,
            "a2.session_id": self.id,
            "a2.state.reducer": reducer.name,
        }
        with engine.telemetry.span("a2.state", attributes) as span:
            try:
                read = await engine.states.read(key, reducer.name)
            except Exception:
                # The snapshot cache is not load-bearing: fall back to the log,
                # which still reports a real outage.
                read = StateRead(None, await store.read(key))
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
                    rows = await store.read(key)
            span.set_attribute("a2.state.snapshot", outcome)
            for row in rows:
                state = reducer.fold(state, engine.to_public(row))
                index = row.index
            span.set_attribute("a2.state.folded", len(rows))
            span.set_attribute("a2.state.index", index)
            if rows and engine.background.is_open:
                snapshot = msgspec.to_builtins(state)
                engine.background.spawn(_put_snapshot, engine, key, reducer.name, index, snapshot)
            return state, index

    @asynccontextmanager
    async def stream(
        self, start_after: int = 0, *, presence: bool = False
    ) -> AsyncIterator[Feed[Any]]:
        """Follow the session live: events after ``start_after``, then new ones.

        With ``presence=True`` (contracts with presence) the feed first yields
        one :class:`~a2trio.PresenceSnapshot`, then :class:`~a2trio.PresencePatch`
        items interleaved with events.

        The feed's task lives inside this block; leaving it stops the feed and
        releases the store's listener.

        Cancellation: ``feed.receive()`` is a checkpoint; cancelling it loses
        nothing (the next receive returns the same next item). An exception
        raised in the block propagates as itself.
        """
        _check_index("start_after", start_after)
        if presence:
            async with open_presence_feed(self._engine, self.id, start_after) as feed:
                yield feed
            return
        async with self._engine.feeds.open(self.id, start_after) as events:
            yield events

    @asynccontextmanager
    async def subscribe(self, start_after: int = 0) -> AsyncIterator[Subscription]:
        """Follow the session as a network lane does: events after
        ``start_after``, then new ones, as runs of shared
        :class:`~a2trio.FeedEntry` (the event and its encodings, each made
        once for every reader of the session in this process).

        Unlike :meth:`stream`, a subscriber that falls more than
        :data:`~a2trio.engine.fanout.RING` events behind the session is dropped:
        ``receive_run()`` raises :class:`~a2trio.Lapped` naming the
        last index it received, to resume from with a new subscription.

        Cancellation: as :meth:`stream`.
        """
        _check_index("start_after", start_after)
        async with self._engine.feeds.open(self.id, start_after, drop=True) as subscription:
            yield subscription

    async def presence(self) -> PresenceMap:
        """The current presence map, expired values pruned.

        Cancellation: a read; nothing to undo.
        """
        return await read_presence(self._engine, self.id)


async def _put_snapshot(engine: Engine, key: str, reducer: str, index: int, state: Any) -> None:
    try:
        await engine.store.put_snapshot(key, reducer, index, state)
    except Exception:
        # A disposable cache write; the next state() folds from the log.
        pass


class Session(SessionView):
    """One session of a server's contract.

    Every async method is a checkpoint. Appends are atomic: cancelled midway,
    either every event was written or none was; retrying with the same ids is
    always safe (it replays).
    """

    __slots__ = ()

    async def append(
        self, *events: AppendInput | PushedEvent, transaction: Transaction | None = None
    ) -> list[Event[Any]]:
        """Append events and wake the session's drain (in a ``transaction``, at its commit).

        Events that came over the wire (:class:`~a2trio.PushedEvent`) go
        through the server's ``validate_push`` first.

        Returns:
          The stored events, typed, in order (the original rows on a replay).

        Raises:
          A2Error: ``UNKNOWN_EVENT_TYPE``, ``INVALID_PAYLOAD``,
            ``PARTIAL_DUPLICATE_BATCH``, ``STORE_UNAVAILABLE``; ``FORBIDDEN``
            when ``validate_push`` refuses. Nothing is written on any error.
          TypeError: no events, or an argument that is not an append input.
          RuntimeError: the server is not open, or the ``transaction`` is over.

        Cancellation: a checkpoint. Cancelled midway, every event was written
        or none was; retrying with the same ids replays instead of duplicating.
        The drain it wakes lives in the server's nursery, not in this task.
        """
        return await self._append_external(events, "inline", transaction)

    async def dispatch(self, *events: AppendInput | PushedEvent) -> list[Event[Any]]:
        """Append, then hand the drain to the scheduler instead of running it here.

        Raises:
          TypeError: the server has no scheduler.

        Cancellation: as :meth:`append`; cancelled after the commit and before
        the scheduler armed the drain, the next append or watchdog drains it.
        """
        return await self._append_external(events, "dispatch")

    async def push(
        self,
        events: Sequence[PushedEvent],
        presence: PushedPresence | None = None,
        *,
        trace_parent: str | None = None,
    ) -> list[Event[Any]]:
        """Write what came over the wire, all or nothing: ``validate_push`` on
        the events and on the presence patch, then every schema, all before
        anything is written; then the events are appended and the patch set.

        ``trace_parent`` is the trace context of the request that carried the
        push (:func:`a2trio.telemetry.encode_trace_context` of its headers):
        the append's span continues that trace, and so do the handlers of the
        events, in whichever process runs them.

        Returns:
          The stored events, as :meth:`append`.

        Raises:
          TypeError: neither events nor presence.
          A2Error / TypeError / ValueError: as :meth:`append` and
            :meth:`set_presence`; nothing is written on any of them.

        Cancellation: as :meth:`append`. Cancelled, or failing in the store,
        between the append and the presence write, the events are stored and
        the patch is not: presence is ephemeral, and repeating the push with
        the same event ids replays the events and sets the patch.
        """
        if not events and presence is None:
            raise TypeError("push needs events, presence or both")
        engine = self._engine
        pushed = tuple(events)
        if pushed:
            await check_push(engine, PushValidation(self.id, pushed))
        patch = (
            await check_pushed_presence(engine, self.id, presence) if presence is not None else None
        )
        appended = (
            await self._appends.append(
                self.id, pushed, source="external", mode="inline", trace_parent=trace_parent
            )
            if pushed
            else []
        )
        await store_patch(engine, self.id, patch)
        return appended

    async def _append_external(
        self, events: tuple[AppendInput | PushedEvent, ...], mode: WriteMode, tx: Tx = None
    ) -> list[Event[Any]]:
        pushed = tuple(e for e in events if isinstance(e, PushedEvent))
        if pushed:
            await check_push(self._engine, PushValidation(self.id, pushed))
        appends = self._appends
        return await appends.append(self.id, events, source="external", mode=mode, transaction=tx)

    async def schedule(self, name: str, timing: str | datetime, *events: AppendInput) -> None:
        """Append ``events`` later: after a delay (``"30s"``, ``"1.5h"``; units
        ms, s, m, h, d) or at an aware ``datetime``.

        The schedule id derives from (contract, session, name), so scheduling
        the same name twice schedules once.

        Raises:
          TypeError: no scheduler, an empty name, no events, bad timing.
          A2Error: a bad payload, or ``PARTIAL_DUPLICATE_BATCH`` for an id twice.

        Cancellation: a checkpoint; safe to retry (the schedule id makes a
        repeat a no-op).
        """
        await schedule(self._engine, self.id, name, timing, events, trigger=None)

    async def set_presence(
        self,
        participant: str | PushedPresence,
        values: Mapping[str, Any],
        *,
        seen: int | None = None,
        at: int | None = None,
    ) -> None:
        """Set presence fields for ``participant`` (``None`` clears a field).

        A :class:`~a2trio.PushedPresence` (from the wire) carries its own
        values and stamps and goes through ``validate_push`` first; ``values``
        is then ignored (pass ``{}``).

        Never an append. ``at`` is the sender's last-writer-wins stamp in epoch
        ms (receipt time when absent); ``seen`` the log index the participant
        has seen.

        Raises:
          A2Error: ``UNKNOWN_PRESENCE_FIELD`` or ``INVALID_PAYLOAD`` (nothing is
            stored); ``FORBIDDEN`` from ``validate_push`` for wire input.
          TypeError / ValueError: a bad participant, ``at`` or ``seen``.

        Cancellation: a checkpoint; a patch applies whole or not at all per
        store, and repeating it is harmless (last writer wins).
        """
        await set_presence(self._engine, self.id, participant, values, seen, at, fallback_seen=0)


class HandlerSession(SessionView):
    """The session as a handler sees it: appends are idempotent per trigger and
    fenced by the attempt. Not a :class:`Session`: ``append`` takes a name."""

    __slots__ = ("_attempt", "_trigger")

    def __init__(
        self, engine: Engine, appends: Appends, session_id: str, trigger: StoredEvent
    ) -> None:
        super().__init__(engine, appends, session_id)
        self._trigger = trigger
        self._attempt = trigger.attempt_count

    async def append(self, name: str, *events: AppendInput) -> list[Event[Any]]:
        """Append on behalf of the triggering attempt.

        Ids default to ones derived from (trigger id, ``name``, position), so a
        retried attempt replays instead of duplicating. The append is fenced:
        once a newer attempt owns the trigger it raises ``SUPERSEDED_ATTEMPT``.

        Raises:
          TypeError: ``name`` is not a non-empty string.
        """
        return await self._write(name, events, "inline")

    async def dispatch(self, name: str, *events: AppendInput) -> list[Event[Any]]:
        """Append as :meth:`append` does (the same ids and fence: a retried
        attempt replays), then hand the drain to the scheduler instead of
        running it in this process.

        Raises:
          TypeError: ``name`` is not a non-empty string; the server has no
            scheduler.
        """
        return await self._write(name, events, "dispatch")

    async def _write(
        self, name: str, events: tuple[AppendInput, ...], mode: WriteMode
    ) -> list[Event[Any]]:
        if not isinstance(name, str) or not name:
            raise TypeError(f"handler append name must be a non-empty string, got {name!r}")
        trigger = self._trigger
        generated = [event.id is None for event in events if isinstance(event, AppendInput)]
        with_ids = [
            AppendInput(e.type, e.payload, handler_event_id(trigger.id, name, position))
            if isinstance(e, AppendInput) and e.id is None
            else e
            for position, e in enumerate(events)
        ]
        base = EventCause(trigger.index, self._attempt)
        batched = EventCause(trigger.index, self._attempt, len(events))
        causes = [batched if g else base for g in generated]
        return await self._appends.append(
            self.id, with_ids, source="handler", mode=mode, causes=causes
        )

    async def schedule(self, name: str, timing: str | datetime, *events: AppendInput) -> None:
        """Like :meth:`Session.schedule`, but the id includes the trigger's id and a
        delay counts from the trigger's ``created_at``, so a retry schedules the
        same thing once."""
        await schedule(self._engine, self.id, name, timing, events, trigger=self._trigger)

    async def set_presence(
        self,
        participant: str | PushedPresence,
        values: Mapping[str, Any],
        *,
        seen: int | None = None,
        at: int | None = None,
    ) -> None:
        """Like :meth:`Session.set_presence`; ``seen`` defaults to the trigger's index."""
        await set_presence(
            self._engine, self.id, participant, values, seen, at, self._trigger.index
        )
