"""Running an actor's calls: read, decide, commit only if nothing moved.

Theory of operation. A call reads the actor's state at index N (the session's
``state()``: snapshot and tail), runs the call function on it, and appends
the events it returned *conditionally*: ``expected_index=N``, checked by the
store inside the append's own transaction. So a call's events always follow
exactly the state it decided on.

* In one process, calls on one actor id take turns (a :class:`trio.Lock` per
  id, dropped when nobody waits), so they never conflict with each other.
* Across processes (and with handlers, schedules or pushes appending to the
  same session) the conditional append can lose: ``INDEX_CONFLICT``. The call
  then reads the new state and runs the function again, at most
  :data:`MAX_CALL_ATTEMPTS` times in all; after that the caller gets
  ``INDEX_CONFLICT`` (409), and nothing of this call was committed.
* With a ``messageId`` the events' ids derive from it
  (:func:`~a2trio.ids.call_event_id`: contract, actor id, messageId,
  position). Before running anything, a call looks for its first id
  (``store.find_event``): if a call with this ``messageId`` committed, in this
  process or another, before or after a restart, its answer is rebuilt from
  the log (the state folded through its last event) and the function does not
  run. A racing twin in another process is caught by the same ids: the
  store replays (or refuses a different batch) and the answer is rebuilt.
* A refusal or a call that returns no events commits nothing, so nothing
  remembers it: retried with the same ``messageId`` it runs again, on the
  state of the moment.

Cancellation: a cancelled call committed all of its events or none; retrying
with the same ``messageId`` answers the original if it did.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import msgspec
import trio

from ..actor import Actor
from ..contract import AppendInput, Event
from ..errors import A2Error, ErrorCode
from ..identifiers import check_message_id
from ..ids import call_event_count, call_event_id
from ..stores.base import StoredEvent
from ..stores.feed import Feed
from .context import Appends, Engine
from .session import SessionView

__all__ = ["MAX_CALL_ATTEMPTS", "ActorCalls", "ActorHandle", "ActorState"]

S = TypeVar("S")

#: Runs of a call function per call, the first included, before a call that
#: keeps losing its conditional commit gives up with ``INDEX_CONFLICT``. Calls
#: in one process take turns, so only writers elsewhere (another process,
#: a handler, a push) can make it lose; five losses in a row means the log is
#: busier than one call can follow, and the caller decides when to retry.
MAX_CALL_ATTEMPTS = 5


#: Scheduler rounds a state feed waits, after an event, for more that is
#: already on its way (a commit's later rows pass through the feed's pumps
#: one at a time): a few rounds cost microseconds, not a timer.
_SETTLE_ROUNDS = 4


class ActorState(msgspec.Struct, Generic[S], frozen=True):
    """An actor's state and the index it was folded through: a call's answer,
    a snapshot, a stream frame (``{"state", "index"}`` on the wire)."""

    state: S
    index: int


class _Turn:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.users = 0


class ActorCalls:
    """The calls of one server's actor; the server owns it (its per-id turns)."""

    def __init__(self, engine: Engine, appends: Appends, actor: Actor[Any]) -> None:
        self.engine = engine
        self.appends = appends
        self.actor = actor
        self._turns: dict[str, _Turn] = {}

    @property
    def waiting(self) -> int:
        """Actor ids with a call running or waiting in this process (tests)."""
        return len(self._turns)

    @asynccontextmanager
    async def _turn(self, actor_id: str) -> AsyncIterator[None]:
        turn = self._turns.get(actor_id)
        if turn is None:
            turn = self._turns[actor_id] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[actor_id]

    async def call(
        self,
        actor_id: str,
        name: str,
        input: Any,
        message_id: str | None,
        trace_parent: str | None = None,
    ) -> ActorState[Any]:
        """See :meth:`ActorHandle.call`; ``actor_id`` and ``message_id`` were
        checked by the caller (the handle, or the transport's actor lane at
        its edge, before authorization)."""
        actor = self.actor
        spec, typed_input = actor.input_of(name, input)
        self.engine.background.require_open()
        view = SessionView(self.engine, self.appends, actor_id)
        async with self._turn(actor_id):
            if message_id is not None:
                found = await self.answer_of(actor_id, message_id)
                if found is not None:
                    return found
            for _ in range(MAX_CALL_ATTEMPTS):
                state, index = await view.state(actor.reducer)
                result = spec.fn(state, typed_input)
                if inspect.isawaitable(result):
                    result = await result
                events = actor.commits(name, result)
                if not events:
                    return ActorState(state, index)
                if message_id is not None:
                    contract, count = actor.name, len(events)
                    events = [
                        AppendInput(
                            e.type,
                            e.payload,
                            call_event_id(contract, actor_id, message_id, k, count),
                        )
                        for k, e in enumerate(events)
                    ]
                try:
                    appended = await self.appends.append(
                        actor_id,
                        events,
                        source="external",
                        mode="inline",
                        expected_index=index,
                        trace_parent=trace_parent,
                    )
                except A2Error as exc:
                    if exc.code is ErrorCode.INDEX_CONFLICT:
                        continue
                    if exc.code is ErrorCode.PARTIAL_DUPLICATE_BATCH and message_id is not None:
                        # A twin elsewhere committed another batch under this messageId.
                        found = await self.answer_of(actor_id, message_id)
                        if found is not None:
                            return found
                    raise
                if appended[0].index != index + 1:
                    # Replayed: a twin elsewhere had committed this messageId
                    # before this call read the state.
                    assert message_id is not None
                    found = await self.answer_of(actor_id, message_id)
                    assert found is not None
                    return found
                # Ours, or a twin's same-size batch committed right after this
                # call's read: either way the rows that follow the state read.
                for event in appended:
                    state = actor.reducer.fold(state, event)
                return ActorState(state, appended[-1].index)
        raise A2Error(
            ErrorCode.INDEX_CONFLICT,
            f"call {name!r} on actor '{actor.name}/{actor_id}' lost its commit to other writers "
            f"{MAX_CALL_ATTEMPTS} times in a row; nothing was committed: retry it",
        )

    async def answer_of(self, actor_id: str, message_id: str) -> ActorState[Any] | None:
        """The original answer of the call committed with ``message_id``, or
        None if none did: the state folded through its last event.

        Cancellation: reads only.
        """
        engine = self.engine
        key = engine.key(actor_id)
        contract = self.actor.name
        first = await engine.store.find_event(
            key, call_event_id(contract, actor_id, message_id, 0, 1)
        )
        if first is None:
            return None
        after = await engine.store.read(key, after_index=first.index, through_index=first.index + 1)
        # The second id names the batch's size (a batch commits contiguously).
        count = call_event_count(contract, actor_id, message_id, after[0].id) if after else None
        return await self.state_at(actor_id, first.index + (count or 1) - 1)

    async def state_at(self, actor_id: str, index: int) -> ActorState[Any]:
        """The state folded through ``index`` (a past one: a retried call's
        answer). Starts from the snapshot when it is not past ``index``;
        otherwise folds the log from the start.

        Cancellation: reads only.
        """
        engine = self.engine
        reducer = self.actor.reducer
        key = engine.key(actor_id)
        read = await engine.store.read_state(key, reducer.name)
        state: Any = reducer.fresh()
        at = 0
        rows: list[StoredEvent] | None = read.events if read.snapshot is None else None
        snapshot = read.snapshot
        if snapshot is not None and snapshot.index <= index:
            try:
                state = (
                    msgspec.convert(snapshot.state, reducer.state_type)
                    if reducer.state_type is not None
                    else snapshot.state
                )
                at = snapshot.index
                rows = read.events
            except (msgspec.ValidationError, TypeError):
                pass  # a stale snapshot: fold the log instead
        if rows is None:
            rows = await engine.store.read(key, through_index=index)
        for row in rows:
            if row.index > index:
                break
            state = reducer.fold(state, engine.to_public(row))
            at = row.index
        return ActorState(state, at)

    async def state(self, actor_id: str) -> ActorState[Any]:
        """See :meth:`ActorHandle.state`."""
        view = SessionView(self.engine, self.appends, actor_id)
        state, index = await view.state(self.actor.reducer)
        return ActorState(state, index)

    @asynccontextmanager
    async def states(
        self, actor_id: str, start_after: int | None
    ) -> AsyncIterator[Feed[ActorState[Any]]]:
        """See :meth:`ActorHandle.states`."""
        current = await self.state(actor_id)
        view = SessionView(self.engine, self.appends, actor_id)
        async with view.stream(current.index) as events:
            yield _StateFeed(self.actor, current, events, start_after)


class _StateFeed(Feed[ActorState[Any]]):
    """Folds a session's live events into state frames: the current state
    first (unless the reader already has it), then one frame per burst of
    events that arrive together (a commit's events usually do).

    Cancellation: ``receive`` may be cancelled anywhere (an SSE heartbeat
    does it on every idle interval): events it already folded are not lost,
    the next ``receive`` frames them (``_unsent``)."""

    def __init__(
        self,
        actor: Actor[Any],
        current: ActorState[Any],
        events: Feed[Event[Any]],
        start_after: int | None,
    ) -> None:
        self._actor = actor
        self._state = current.state
        self._index = current.index
        self._events = events
        self._seen = start_after
        self._initial = start_after is None or current.index > start_after
        self._unsent = False

    def _fold(self, event: Event[Any]) -> None:
        self._state = self._actor.reducer.fold(self._state, event)
        self._index = event.index
        self._unsent = True

    async def receive(self) -> ActorState[Any]:
        while True:
            if self._initial:
                self._initial = False
                return self._frame()
            if not self._unsent:
                self._fold(await self._events.receive())
            idle_rounds = 0
            while idle_rounds < _SETTLE_ROUNDS:
                # What is ready now joins this frame; cancelling a receive
                # that would wait loses nothing (the feed's promise).
                with trio.move_on_after(0) as idle:
                    event = await self._events.receive()
                if idle.cancelled_caught:
                    idle_rounds += 1
                    # Let the feed's pumps hand over the rest of a commit.
                    await trio.lowlevel.checkpoint()
                    continue
                idle_rounds = 0
                self._fold(event)
            self._unsent = False
            if self._seen is None or self._index > self._seen:
                return self._frame()

    def _frame(self) -> ActorState[Any]:
        # A copy, so a fold that mutates in place never changes a frame a
        # reader kept.
        return ActorState(copy.deepcopy(self._state), self._index)


class ActorHandle:
    """One actor (an id of a server's actor), from ``server.actor(id)``.
    Creating one does no I/O; every async method is a checkpoint."""

    __slots__ = ("_calls", "id")

    def __init__(self, calls: ActorCalls, actor_id: str) -> None:
        self._calls = calls
        self.id = actor_id

    def __repr__(self) -> str:
        return f"ActorHandle({self._calls.actor.name!r}, {self.id!r})"

    @property
    def calls(self) -> ActorCalls:
        """The server's call runner for this actor's contract: its
        :meth:`ActorCalls.call` takes ids already checked (the transport's
        entry, which checks them at its edge)."""
        return self._calls

    async def call(
        self,
        name: str,
        input: Any,
        *,
        message_id: str | None = None,
        trace_parent: str | None = None,
    ) -> ActorState[Any]:
        """Run call ``name`` with ``input``; commit what it returns, if the log
        has not moved since it read the state (see the module docstring).

        Args:
          name: a declared call.
          input: a value the call's input type converts (a dict, or an
            instance of the type).
          message_id: makes the call exactly-once: a retry with the same id
            returns the original answer without running again, also after a
            restart. Refusals and calls that commit nothing are not remembered.
          trace_parent: the trace context of the request that made the call
            (:func:`a2trio.encode_trace_context` of its headers): the commit's
            ``a2.append`` continues it, as a push's does.

        Returns:
          The state after this call's own commit and its index (the current
          state and index when it committed nothing).

        Raises:
          Refused: the call refused (``CALL_REFUSED``); nothing was committed.
          A2Error: ``UNKNOWN_EVENT_TYPE`` (no such call), ``INVALID_PAYLOAD``
            (the input or a returned event), ``INDEX_CONFLICT`` (lost the
            commit :data:`MAX_CALL_ATTEMPTS` times), ``STORE_UNAVAILABLE``.
          TypeError / ValueError: a bad ``message_id``; a call function that
            returned something else than events.
          RuntimeError: the server is not open.

        Cancellation: a checkpoint. Cancelled, all of its events were
        committed or none; retrying with the same ``message_id`` is safe.
        """
        if message_id is not None:
            check_message_id(message_id)
        return await self._calls.call(self.id, name, input, message_id, trace_parent)

    async def state(self) -> ActorState[Any]:
        """A fresh read of the state and its index (snapshot and tail).

        Cancellation: a read; nothing to undo.
        """
        return await self._calls.state(self.id)

    @asynccontextmanager
    async def states(self, start_after: int | None = None) -> AsyncIterator[Feed[ActorState[Any]]]:
        """Follow the state live: a frame for the current state (unless
        ``start_after`` is at or past its index), then one after each commit.
        Events that arrive together fold into one frame; a frame's state is
        the state at its index. Its task lives inside this block.

        Cancellation: ``receive()`` is a checkpoint; leaving the block stops
        the feed.
        """
        async with self._calls.states(self.id, start_after) as feed:
            yield feed


for _cls in (ActorHandle, ActorState):
    _cls.__module__ = "a2trio"
