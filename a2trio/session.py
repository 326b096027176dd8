"""Sessions: handles on one instance of a contract. Creating one does no I/O."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from .contract import AppendInput, Event, Reducer
from .ids import handler_event_id
from .stores.base import EventCause, StoredEvent

if TYPE_CHECKING:
    from .presence import PresenceMap
    from .server import PushedEvent, PushedPresence, Server
    from .stores._feed import Feed

__all__ = ["HandlerSession", "Session"]

S = TypeVar("S")


class Session:
    """One session of a server's contract.

    Every async method is a checkpoint. Appends are atomic: cancelled midway,
    either every event was written or none was; retrying with the same ids is
    always safe (it replays).
    """

    __slots__ = ("_server", "id")

    def __init__(self, server: Server, session_id: str) -> None:
        self._server = server
        self.id = session_id

    def __repr__(self) -> str:
        return f"Session({self._server.contract.name!r}, {self.id!r})"

    async def append(self, *events: AppendInput | PushedEvent) -> list[Event[Any]]:
        """Append events and wake the session's drain.

        Events that came over the wire (:class:`~a2trio.PushedEvent`) go
        through the server's ``validate_push`` first.

        Returns:
          The stored events, typed, in order (the original rows on a replay).

        Raises:
          A2Error: ``UNKNOWN_EVENT_TYPE``, ``INVALID_PAYLOAD``,
            ``PARTIAL_DUPLICATE_BATCH``, ``STORE_UNAVAILABLE``; ``FORBIDDEN``
            when ``validate_push`` refuses. Nothing is written on any error.
          TypeError: no events, or an argument that is not an append input.
          RuntimeError: the server is not open (checked before writing).

        Cancellation: a checkpoint. Cancelled midway, every event was written
        or none was; retrying with the same ids replays instead of duplicating.
        The drain it wakes lives in the server's nursery, not in this task.
        """
        return await self._server._append_external(self.id, events, mode="inline")

    async def dispatch(self, *events: AppendInput | PushedEvent) -> list[Event[Any]]:
        """Append, then hand the drain to the scheduler instead of running it here.

        Raises:
          TypeError: the server has no scheduler.

        Cancellation: as :meth:`append`; cancelled after the commit and before
        the scheduler armed the drain, the next append or watchdog drains it.
        """
        return await self._server._append_external(self.id, events, mode="dispatch")

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
        await self._server._schedule(self.id, name, timing, events, trigger=None)

    async def history(self, *, gte: int | None = None, lte: int | None = None) -> list[Event[Any]]:
        """Events with ``gte <= index <= lte`` (both optional), in order.

        Raises:
          ValueError: a bound that is not a non-negative int, or ``gte > lte``.

        Cancellation: a read; nothing to undo.
        """
        return await self._server._history(self.id, gte, lte)

    async def state(self, reducer: Reducer[S]) -> tuple[S, int]:
        """Fold the session with ``reducer``: the state and the last folded index.

        Starts from the cached snapshot (refolding from the log if it fails
        ``reducer.state_type``) and writes a fresher snapshot back in the
        background.

        Cancellation: a read; the snapshot write-back, if started, lives in the
        server's nursery and is a disposable cache.
        """
        return await self._server._state(self.id, reducer)

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
        async with self._server._stream(self.id, start_after, presence) as feed:
            yield feed

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
        await self._server._set_presence(self.id, participant, values, seen, at, fallback_seen=0)

    async def presence(self) -> PresenceMap:
        """The current presence map, expired values pruned.

        Cancellation: a read; nothing to undo.
        """
        return await self._server._read_presence(self.id)


class HandlerSession(Session):
    """The session as a handler sees it: appends are idempotent per trigger."""

    __slots__ = ("_attempt", "_trigger")

    def __init__(self, server: Server, session_id: str, trigger: StoredEvent) -> None:
        super().__init__(server, session_id)
        self._trigger = trigger
        self._attempt = trigger.attempt_count

    async def append(self, name: str, *events: AppendInput) -> list[Event[Any]]:  # type: ignore[override]
        """Append on behalf of the triggering attempt.

        Ids default to ones derived from (trigger id, ``name``, position), so a
        retried attempt replays instead of duplicating. The append is fenced:
        once a newer attempt owns the trigger it raises ``SUPERSEDED_ATTEMPT``.

        Raises:
          TypeError: ``name`` is not a non-empty string.
        """
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
        return await self._server._append(
            self.id, with_ids, source="handler", mode="inline", causes=causes
        )

    async def schedule(self, name: str, timing: str | datetime, *events: AppendInput) -> None:
        """Like :meth:`Session.schedule`, but the id includes the trigger's id and a
        delay counts from the trigger's ``created_at``, so a retry schedules the
        same thing once."""
        await self._server._schedule(self.id, name, timing, events, trigger=self._trigger)

    async def set_presence(
        self,
        participant: str | PushedPresence,
        values: Mapping[str, Any],
        *,
        seen: int | None = None,
        at: int | None = None,
    ) -> None:
        """Like :meth:`Session.set_presence`; ``seen`` defaults to the trigger's index."""
        await self._server._set_presence(
            self.id, participant, values, seen, at, fallback_seen=self._trigger.index
        )
