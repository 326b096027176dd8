"""Live feeds shared by every backend: a pump task, a bounded channel, wake-ups.

A feed is an async context manager that owns one pump task. The pump reads
rows after its cursor, sends them into a bounded channel (a slow reader pushes
back), and when it has caught up waits for a wake-up or its poll interval,
whichever comes first. A notification only decides *when* to read, never
*what*: a lost one is healed by the next poll.

The wake-up is armed *before* each read, so an append that lands between the
read and the wait still wakes the pump: nothing slips through.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

import msgspec
import trio

__all__ = [
    "FEED_BUFFER",
    "ChannelFeed",
    "Feed",
    "FeedStatistics",
    "Wakeups",
    "open_pump_feed",
    "own_tasks",
]

T = TypeVar("T")

#: Items buffered between a feed's pump and its reader. Bounds a stalled
#: reader's memory to this many rows per feed; past it the pump waits.
FEED_BUFFER = 256


class FeedStatistics(msgspec.Struct, frozen=True):
    """How many feeds are waiting on wake-ups, per key (for leak tests)."""

    listeners: int
    keys: int


class Wakeups:
    """Per-key wake-ups: ``arm(key)`` before a read, ``notify(key)`` after a write."""

    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        self._waiters: dict[str, int] = {}

    def arm(self, key: str) -> trio.Event:
        """The event the next ``notify(key)`` sets."""
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = trio.Event()
        return event

    def notify(self, key: str) -> None:
        """Wake every pump armed on ``key``."""
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        """Wake every armed pump (after a reconnect, or on close)."""
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def watch(self, key: str) -> None:
        self._waiters[key] = self._waiters.get(key, 0) + 1

    def unwatch(self, key: str) -> None:
        left = self._waiters.get(key, 0) - 1
        if left > 0:
            self._waiters[key] = left
        else:
            self._waiters.pop(key, None)
            self._events.pop(key, None)

    def watched(self, key: str) -> bool:
        """Whether any feed follows ``key``."""
        return key in self._waiters

    def statistics(self) -> FeedStatistics:
        return FeedStatistics(listeners=sum(self._waiters.values()), keys=len(self._waiters))


class Feed(Generic[T]):
    """The receiving end of a live feed: ``async for item in feed``.

    A failure of the feed's source (the store went away) is raised from
    :meth:`receive` once the items before it are consumed, never swallowed.
    """

    async def receive(self) -> T:
        """The next item. Raises ``StopAsyncIteration`` when the feed ended
        cleanly, or the source's error."""
        raise NotImplementedError

    def __aiter__(self) -> Feed[T]:
        return self

    async def __anext__(self) -> T:
        return await self.receive()


class ChannelFeed(Feed[T]):
    """A feed backed by a bounded memory channel that a pump task fills."""

    def __init__(self, receive: trio.MemoryReceiveChannel[T]) -> None:
        self._receive = receive
        self._error: BaseException | None = None

    async def receive(self) -> T:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    def fail(self, error: BaseException) -> None:
        """Record the source's error; the pump closes the channel next."""
        self._error = error


@asynccontextmanager
async def own_tasks() -> AsyncIterator[trio.Nursery]:
    """A nursery for a context manager's helper tasks, cancelled when the block
    ends. An exception from the block propagates as itself rather than wrapped
    in an ``ExceptionGroup``: the helpers are cancelled, not failed, by it.
    """
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except BaseException as exc:
            error = exc
        finally:
            nursery.cancel_scope.cancel(reason="block finished")
    if error is not None:
        raise error


@asynccontextmanager
async def open_pump_feed(
    key: str,
    read_after: Callable[[int], Awaitable[list[T]]],
    index_of: Callable[[T], int],
    wakeups: Wakeups,
    *,
    start_after: int,
    poll: Callable[[bool], float] | None = None,
) -> AsyncIterator[Feed[T]]:
    """Run a pump that follows ``key`` from ``start_after`` into a :class:`Feed`.

    Args:
      read_after: rows with index greater than the argument, in order.
      poll: given whether the last read found rows, how long to wait for a
        wake-up before reading anyway (``inf``: only on wake-ups).
    """
    send, receive = trio.open_memory_channel[T](FEED_BUFFER)
    feed = ChannelFeed(receive)
    wait_for = poll or (lambda active: math.inf)

    async def pump() -> None:
        cursor = start_after
        async with send:
            try:
                while True:
                    woken = wakeups.arm(key)
                    rows = await read_after(cursor)
                    for row in rows:
                        await send.send(row)
                        cursor = index_of(row)
                    with trio.move_on_after(wait_for(bool(rows))):
                        if not rows:
                            await woken.wait()
            except Exception as exc:
                feed.fail(exc)

    wakeups.watch(key)
    try:
        async with own_tasks() as nursery:
            nursery.start_soon(pump)
            async with receive:
                yield feed
    finally:
        wakeups.unwatch(key)
