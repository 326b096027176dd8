"""Live feeds: ``stream`` catches up, follows, serves feeds side by side and
stops when left."""

from __future__ import annotations

import trio
import trio.testing

from ..base import EventCause
from .kit import (
    FEED_DEADLINE_S,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    new_uid,
    receive,
)

__all__ = [
    "check_stream_catches_up_then_follows",
    "check_stream_close_stops_the_feed",
    "check_stream_concurrent_feeds",
]


async def check_stream_catches_up_then_follows(open_store: StoreFactory) -> None:
    """A feed yields rows after ``start_after``, then later appends and returned events."""
    async with open_store(ManualClock()) as store:
        sid, other = new_sid("stream"), new_sid("stream-other")
        await append_n(store, sid, 3)
        async with store.stream(sid, start_after=1) as feed:
            assert indexes_of(await receive(feed, 2)) == [2, 3]
            await store.append(other, [ev("elsewhere")])
            await store.append(sid, [ev("live", {"n": 4})])
            live = await receive(feed, 1)
            assert [(e.index, e.type, e.payload) for e in live] == [(4, "live", {"n": 4})]
            claimed_events(await claim(store, sid))
            child = new_uid("child")
            await store.complete_attempt(sid, index=2, attempt=1, events=[ev("out", id=child)])
            returned = await receive(feed, 1)
            assert [(e.index, e.id, e.cause) for e in returned] == [(5, child, EventCause(2, 1))]
        async with store.stream(sid, start_after=5) as tail:
            await store.append(sid, [ev("after")])
            assert indexes_of(await receive(tail, 1)) == [6]


async def check_stream_concurrent_feeds(open_store: StoreFactory) -> None:
    """Two feeds on one session each see every row once, in order."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("stream-two")
        await append_n(store, sid, 1)
        seen: dict[str, list[int]] = {"a": [], "b": []}

        async def follow(name: str, start_after: int) -> None:
            async with store.stream(sid, start_after=start_after) as feed:
                seen[name] = indexes_of(await receive(feed, 4 - start_after))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "a", 0)
            nursery.start_soon(follow, "b", 2)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(3):
                await store.append(sid, [ev("x")])
        assert seen == {"a": [1, 2, 3, 4], "b": [3, 4]}


async def check_stream_close_stops_the_feed(open_store: StoreFactory) -> None:
    """Leaving the feed's block stops it promptly, even with rows undelivered."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("stream-close")
        # More rows than any reasonable buffer, so the pump is blocked when we leave.
        await store.append(sid, [ev("x", i) for i in range(300)])
        with trio.fail_after(FEED_DEADLINE_S):
            async with store.stream(sid) as feed:
                assert indexes_of(await receive(feed, 1)) == [1]
        with trio.fail_after(FEED_DEADLINE_S):
            try:
                await feed.receive()
            except Exception:
                pass
            else:
                raise AssertionError("a closed feed still delivered a row")
        assert len((await store.append(sid, [ev("after close")])).events) == 1
