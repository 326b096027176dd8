"""Live feeds shared by every backend: a pump task, a bounded channel, wake-ups.

A feed is an async context manager that owns one pump task. The pump reads
rows after its cursor, sends them into a bounded channel (a slow reader pushes
back), and when it has caught up waits for a wake-up or its poll interval,
whichever comes first. A notification only decides *when* to read, never
*what*: a lost one is healed by the next poll.

The wake-up is armed *before* each read, so an append that lands between the
read and the wait still wakes the pump: nothing slips through.

A writer in the same process may hand its committed rows over with the
wake-up (``notify(key, rows)``): a pump whose cursor they continue delivers
them without a read, and skips its next read too if no other wake-up came
meanwhile. The rows are as the writer stored them (processing state in a feed
row is a snapshot either way). Wake-ups without rows, from other processes
through LISTEN, or rows that do not continue the cursor mean a read, as before.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import msgspec
import trio

from ..timings import Timings

__all__ = [
    "FEED_BUFFER",
    "ChannelFeed",
    "Feed",
    "FeedStatistics",
    "Wake",
    "Wakeups",
    "adaptive_poll",
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


class Wake:
    """One armed wake-up: a :class:`trio.Event` that may carry a writer's rows.

    ``seq`` numbers the wake-ups of its key, so a pump can tell whether any
    other came after the one that woke it.
    """

    __slots__ = ("_event", "rows", "seq")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.rows: Sequence[Any] | None = None
        self.seq = 0

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


class Wakeups:
    """Per-key wake-ups: ``arm(key)`` before a read, ``notify(key)`` after a write."""

    def __init__(self) -> None:
        self._events: dict[str, Wake] = {}
        self._waiters: dict[str, int] = {}
        self._seq: dict[str, int] = {}

    def arm(self, key: str) -> Wake:
        """The wake-up the next ``notify(key)`` sets."""
        wake = self._events.get(key)
        if wake is None:
            wake = self._events[key] = Wake()
        return wake

    def notify(self, key: str, rows: Sequence[Any] | None = None) -> None:
        """Wake every pump armed on ``key``, handing over ``rows`` (committed,
        in index order, nothing of the key's left out between them) if given."""
        if key in self._waiters:
            self._seq[key] = self._seq.get(key, 0) + 1
        wake = self._events.pop(key, None)
        if wake is not None:
            wake.rows = rows
            wake.seq = self._seq.get(key, 0)
            wake.set()

    def seq(self, key: str) -> int:
        """How many wake-ups ``key`` has had while watched."""
        return self._seq.get(key, 0)

    def notify_all(self) -> None:
        """Wake every armed pump (after a reconnect, or on close)."""
        for key in self._waiters:
            self._seq[key] = self._seq.get(key, 0) + 1
        events, self._events = self._events, {}
        for wake in events.values():
            wake.set()

    def watch(self, key: str) -> None:
        self._waiters[key] = self._waiters.get(key, 0) + 1

    def unwatch(self, key: str) -> None:
        left = self._waiters.get(key, 0) - 1
        if left > 0:
            self._waiters[key] = left
        else:
            self._waiters.pop(key, None)
            self._events.pop(key, None)
            self._seq.pop(key, None)

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
            pass
        if self._error is not None:
            raise self._error  # as it was: its cause is the store's failure
        raise StopAsyncIteration

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


def adaptive_poll(timings: Timings) -> Callable[[bool], float]:
    """How long a polling feed waits before re-reading: ``poll_active_s`` after
    rows (and after the first empty read that follows them), then doubling on
    each empty read up to ``poll_idle_s``. Given ``True``, it also starts over."""
    interval = timings.poll_active_s

    def poll(found: bool) -> float:
        nonlocal interval
        if found:
            interval = timings.poll_active_s
            return interval
        waited = interval
        interval = min(interval * 2, timings.poll_idle_s)
        return waited

    return poll


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
        # Rows a local writer handed over, and the key's wake-up count when
        # handed rows last caught this pump up (-1: a read is due).
        handed: list[T] = []
        caught_up_at = -1
        async with send:
            try:
                while True:
                    woken = wakeups.arm(key)
                    if handed:
                        rows, handed = handed, []
                    elif caught_up_at == wakeups.seq(key):
                        rows = []
                    else:
                        rows = await read_after(cursor)
                    for row in rows:
                        await send.send(row)
                        cursor = index_of(row)
                    with trio.move_on_after(wait_for(bool(rows))) as waited:
                        if not rows:
                            await woken.wait()
                    if woken.is_set():
                        if woken.rows and index_of(woken.rows[0]) == cursor + 1:
                            handed, caught_up_at = list(woken.rows), woken.seq
                        else:
                            caught_up_at = -1
                    elif waited.cancelled_caught:
                        caught_up_at = -1  # the poll's safety read
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
