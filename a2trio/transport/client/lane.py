"""One followed session that reconnects by itself and resumes where it was.

Theory of operation. A :class:`Lane` is what ``client.subscribe(session_id)``
yields. Its task (:meth:`Lane.run`, in the client's nursery) loops over
*tries*: each try is the transport's ``attach(start_after, live, deliver)``,
a socket subscription or an SSE request from the lane's :attr:`~Lane.index`,
that calls ``live()`` once the server confirmed it, ``deliver(frame)`` for
each frame, returns when the server ended the stream cleanly and raises
:class:`~a2trio.A2Error` when it was refused or lost. Between tries the
reconnect policy decides: a delay (state ``Connecting``) or ``False`` (state
``Paused``, until :meth:`Lane.reconnect`).

No gaps, no duplicates: the index is the last event handed to the reader,
advanced only after the frame is queued for it, so a try cancelled midway
resumes from exactly there. An event at or below the index (a replay after a
resubscribe) is skipped; one past ``index + 1`` (a gap, which a healthy server
never sends) ends the try as lost, and the next one fills it from the store.

Presence is repainted: each try that asks for presence starts with a
snapshot, which replaces :attr:`Lane.presence`; patches update it.

The loop of tries, the policy and the connection states are
:class:`Resuming`, which :class:`Lane` extends with its index, gap check and
presence; the actor client's ``follow()`` extends it too, with its states.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, Self, TypeVar

import msgspec
import trio

from ...contract import Event, Reducer
from ...errors import A2Error, ErrorCode
from .. import wire
from .connection import (
    DEFAULT_RECONNECT,
    Closed,
    Connecting,
    ConnectionState,
    ConnectionWatch,
    Live,
    Paused,
    ReconnectPolicy,
    logger,
)

if TYPE_CHECKING:
    from ...contract import Contract

__all__ = [
    "LANE_BUFFER",
    "Attach",
    "Fold",
    "Folded",
    "Lane",
    "LaneFrame",
    "Resuming",
    "Try",
    "to_event",
]

#: Frames buffered per lane for its reader. A reader that stalls past this
#: holds up the lane's transport (on a multiplexed socket, every lane of it).
LANE_BUFFER: Final = 256

LaneFrame = wire.EventFrame | wire.PresenceFrame | wire.PresenceSnapshotFrame
S = TypeVar("S")
F = TypeVar("F")


class Attach(Protocol):
    """One try of a lane, supplied by its transport (see the module docstring)."""

    def __call__(
        self,
        start_after: int,
        live: Callable[[], None],
        deliver: Callable[[LaneFrame], Awaitable[None]],
    ) -> Awaitable[None]: ...


#: One try of a :class:`Resuming` stream, supplied by its transport:
#: ``try_once(live, deliver)`` calls ``live()`` once the server confirmed the
#: stream, ``deliver(frame)`` for each frame, returns when the server ended it
#: cleanly and raises :class:`~a2trio.A2Error` when it was refused or lost.
Try = Callable[[Callable[[], None], Callable[[F], Awaitable[None]]], Awaitable[None]]


class Resuming(Generic[F]):
    """A followed stream that reconnects by itself: the tries, the reconnect
    policy and the connection state behind every live view of the clients (a
    session's :class:`Lane`, an actor client's ``follow()``).

    Iteration yields what each try delivers and :meth:`takes` lets through.
    It waits through reconnects, and while the stream is paused (the policy
    said ``False``: call :meth:`reconnect`); it ends when the stream is closed.

    Attributes:
      session_id: what the reconnect policy is told (the session, or the actor id).
      connection: this stream's :class:`~a2trio.transport.ConnectionWatch`.
    """

    def __init__(self, session_id: str, policy: ReconnectPolicy = DEFAULT_RECONNECT) -> None:
        self.session_id = session_id
        self.connection = ConnectionWatch()
        self._policy = policy
        self._send, self._receive = trio.open_memory_channel[F](LANE_BUFFER)
        self._reconnects = 0
        self._attempt = 1
        self._try: trio.CancelScope | None = None
        self._wake = trio.Event()
        self._restart = False

    @property
    def state(self) -> ConnectionState:
        """The connection's current state (``.connection.state``)."""
        return self.connection.state

    def reconnect(self) -> None:
        """Restart the stream from where it is now: a live one is replaced
        (after a write made outside this client), a waiting or paused one
        tries at once, and the policy's ``attempt`` starts again at 1.

        Does no I/O and returns at once; watch :attr:`connection` for progress.
        Does nothing on a closed stream.
        """
        state = self.state
        if isinstance(state, Closed):
            return
        if isinstance(state, Paused):
            self.connection.set(Connecting(state.reconnects, state.error))
        self._restart = True
        self._wake.set()
        if self._try is not None:
            self._try.cancel(reason="reconnect()")

    async def wait_live(self) -> Live:
        """Wait until the stream is live.

        Raises:
          A2Error: the stream paused (its error, or ``STORE_UNAVAILABLE`` after
            a clean end).
          trio.ClosedResourceError: the stream closed.

        Cancellation: a checkpoint; cancelling it changes nothing.
        """
        state = await self.connection.wait_for(lambda s: isinstance(s, Live | Paused | Closed))
        match state:
            case Live():
                return state
            case Paused(error=error):
                raise error or A2Error(ErrorCode.STORE_UNAVAILABLE, "the stream ended (paused)")
        raise trio.ClosedResourceError("the lane is closed")

    async def receive(self) -> F:
        """The next frame. Raises ``StopAsyncIteration`` once the stream is closed."""
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> F:
        return await self.receive()

    async def run_tries(
        self, try_once: Try[F], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run tries until cancelled (the client calls this in its nursery).
        Never raises but for the policy's own exceptions.

        Cancellation: the stream closes (state ``Closed``, iteration ends).
        """
        self.connection.set(Connecting(0, None))
        task_status.started()
        try:
            while True:
                error = await self._one_try(try_once)
                self._reconnects += 1
                if self._restart:
                    self._restart, self._attempt = False, 1
                    self._wake = trio.Event()
                    self.connection.set(Connecting(self._reconnects, error))
                    continue
                await self._between_tries(error)
        finally:
            self.connection.set(Closed())
            self._send.close()

    def takes(self, frame: F) -> bool:
        """Whether the reader gets ``frame`` of a try (a subclass's filter;
        every frame by default). Raising ``A2Error`` loses the try."""
        return True

    async def _deliver(self, frame: F) -> None:
        if self.takes(frame):
            await self._send.send(frame)

    async def _one_try(self, try_once: Try[F]) -> A2Error | None:
        with trio.CancelScope() as scope:
            self._try = scope
            try:
                await try_once(self._live, self._deliver)
            except A2Error as exc:
                logger.info("lane %r lost: %s", self.session_id, exc)
                return exc
            finally:
                self._try = None
        return None

    async def _between_tries(self, error: A2Error | None) -> None:
        delay = self._policy(self.session_id, error, self._attempt)
        self._attempt += 1
        if delay is False:
            self.connection.set(Paused(self._reconnects, error))
            await self._wake.wait()
        else:
            self.connection.set(Connecting(self._reconnects, error))
            with trio.move_on_after(delay):
                await self._wake.wait()
        if self._wake.is_set():
            self._restart, self._attempt = False, 1
            self._wake = trio.Event()
        self.connection.set(Connecting(self._reconnects, error))

    def _live(self) -> None:
        self._attempt = 1
        self.connection.set(Live(self._reconnects))


class Lane(Resuming[LaneFrame]):
    """One followed session: ``async for frame in lane`` across reconnects.

    Iteration yields every event after the start index exactly once, in order,
    and presence frames as they come. It waits through reconnects, and while
    the lane is paused (the policy said ``False``: call :meth:`reconnect`);
    it ends when the ``subscribe`` block exits.

    Attributes:
      session_id: the session.
      index: the last event index queued for the reader (the resume frontier;
        while a full buffer holds a frame back, already that frame's).
      connection: this lane's :class:`~a2trio.transport.ConnectionWatch`.
      presence: the session's presence map as last painted,
        ``{participant: {field: WirePresenceValue}}`` (empty without presence).
    """

    def __init__(
        self, session_id: str, start_after: int = 0, policy: ReconnectPolicy = DEFAULT_RECONNECT
    ) -> None:
        if type(start_after) is not int or start_after < 0:
            raise ValueError(f"`start_after` must be a non-negative int, got {start_after!r}")
        super().__init__(session_id, policy)
        self.index = start_after
        self.presence: dict[str, dict[str, wire.WirePresenceValue]] = {}

    async def run(
        self, attach: Attach, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run tries, each ``attach`` from :attr:`index`, until cancelled (the
        transport's client calls this in its nursery). Never raises but for
        the policy's own exceptions.

        Cancellation: the lane closes (state ``Closed``, iteration ends).
        """

        def try_once(
            live: Callable[[], None], deliver: Callable[[LaneFrame], Awaitable[None]]
        ) -> Awaitable[None]:
            return attach(self.index, live, deliver)

        await self.run_tries(try_once, task_status=task_status)

    async def _deliver(self, frame: LaneFrame) -> None:
        match frame:
            case wire.EventFrame(index=index) if index <= self.index:
                return  # already handed to the reader: a replay after a resubscribe
            case wire.EventFrame(index=index) if index != self.index + 1:
                raise A2Error(
                    ErrorCode.STORE_UNAVAILABLE,
                    f"gap in the stream: expected index {self.index + 1}, got {index}",
                )
            case wire.EventFrame():
                # The index moves first, so a reader woken by this frame sees it;
                # a send cancelled before queuing the frame moves it back.
                previous, self.index = self.index, frame.index
                try:
                    await self._send.send(frame)
                except BaseException:
                    self.index = previous
                    raise
            case wire.PresenceSnapshotFrame():
                self.presence = {p: dict(fields) for p, fields in frame.snapshot.items()}
                await self._send.send(frame)
            case wire.PresenceFrame():
                self._paint(frame)
                await self._send.send(frame)

    def _paint(self, patch: wire.PresenceFrame) -> None:
        fields = self.presence.setdefault(patch.participant, {})
        for field, value in patch.values.items():
            if value is None:
                fields.pop(field, None)
            else:
                fields[field] = wire.WirePresenceValue(value, patch.seen, patch.at)
        if not fields:
            del self.presence[patch.participant]


def to_event(frame: wire.EventFrame, contract: Contract | None = None) -> Event[Any]:
    """A socket or SSE event as an :class:`~a2trio.Event`, its payload typed by
    ``contract`` when given (else JSON builtins)."""
    payload = frame.payload if contract is None else contract.decode(frame.type, frame.payload)
    created_at = datetime.fromisoformat(frame.created_at)
    return Event(frame.id, frame.type, payload, frame.index, frame.session_id, created_at)


class Folded(msgspec.Struct, Generic[S], frozen=True):
    """A local fold's state after the event at ``index``."""

    state: S
    index: int


class Fold(Generic[S]):
    """A lane folded locally: ``async for folded in fold`` yields a
    :class:`Folded` after each event, its index only ever moving forward.

    Attributes:
      state: the state after :attr:`index` (the reducer's fresh state at the start).
      index: the last folded event.
      lane: the lane underneath (its connection, presence, ``reconnect()``).
    """

    def __init__(
        self,
        lane: Lane,
        reducer: Reducer[S],
        contract: Contract | None = None,
        state: S | None = None,
    ) -> None:
        self.lane = lane
        self.reducer = reducer
        self.contract = contract
        self.state: S = reducer.fresh() if state is None else state
        self.index = lane.index

    def __aiter__(self) -> Fold[S]:
        return self

    async def __anext__(self) -> Folded[S]:
        while True:
            frame = await self.lane.receive()
            if isinstance(frame, wire.EventFrame) and frame.index > self.index:
                self.state = self.reducer.fold(self.state, to_event(frame, self.contract))
                self.index = frame.index
                return Folded(self.state, self.index)
