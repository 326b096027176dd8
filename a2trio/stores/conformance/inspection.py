"""The ``inspect`` capability: sessions by prefix with their counters, event
pages and snapshots."""

from __future__ import annotations

from ..base import Inspection, SnapshotInfo, Store
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    indexes_of,
    new_sid,
)

__all__ = [
    "check_inspect_list_sessions",
    "check_inspect_read_events_and_snapshots",
]


def _inspect(store: Store) -> Inspection:
    if store.inspect is None:
        raise CapabilityMissing("inspect")
    return store.inspect


async def check_inspect_list_sessions(open_store: StoreFactory) -> None:
    """Sessions by prefix, ordered by id, paged by cursor, with their counters."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        prefix = new_sid("insp") + "/"
        a, b, c = prefix + "a", prefix + "b", prefix + "c"
        await append_n(store, c, 1)
        await append_n(store, a, 4)
        clock.advance(10)
        await append_n(store, b, 2)
        await append_n(store, prefix.rstrip("/") + "-outside", 1)
        claimed_events(await claim(store, a, ttl_ms=100))
        clock.advance(20)
        await store.fail_attempt(a, index=1, attempt=1, error="e", max_failures=1)
        clock.advance(5)
        await store.complete_attempt(a, index=2, attempt=1, events=[])
        clock.advance(100)
        claimed_events(await claim(store, a))
        clock.advance(15)
        await store.fail_attempt(a, index=3, attempt=2, error="e", max_failures=5)

        page = await inspect.list_sessions(prefix=prefix, limit=2)
        assert [s.session_id for s in page.sessions] == [a, b]
        assert page.cursor == b
        rest = await inspect.list_sessions(prefix=prefix, limit=2, cursor=page.cursor)
        assert [s.session_id for s in rest.sessions] == [c]
        assert rest.cursor is None
        exact = await inspect.list_sessions(prefix=prefix, limit=3)
        assert len(exact.sessions) == 3
        assert exact.cursor is None
        summary = page.sessions[0]
        assert (summary.event_count, summary.pending_count, summary.failed_count) == (4, 2, 1)
        # Events 1-2 were claimed once, 3-4 twice; 1 dead-lettered, 3 failed once.
        assert (summary.attempt_count, summary.failure_count) == (6, 2), f"counters: {summary!r}"
        assert summary.first_event_at_ms == T0
        assert summary.updated_at_ms == T0 + 150, "the latest of every row's timestamps"
        assert page.sessions[1].updated_at_ms == T0 + 10
        assert page.sessions[1].pending_count == 2
        assert (await inspect.list_sessions(prefix=prefix + "zz", limit=5)).sessions == []


async def check_inspect_read_events_and_snapshots(open_store: StoreFactory) -> None:
    """Event pages stop at min(through_index, frontier); snapshots list by reducer."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        sid = new_sid("insp-events")
        await append_n(store, sid, 5)
        page = await inspect.read_events(sid, after_index=1, limit=2)
        assert indexes_of(page.events) == [2, 3]
        assert page.through_index == 5
        bounded = await inspect.read_events(sid, after_index=2, limit=10, through_index=4)
        assert indexes_of(bounded.events) == [3, 4]
        assert bounded.through_index == 4
        beyond = await inspect.read_events(sid, after_index=0, limit=10, through_index=99)
        assert indexes_of(beyond.events) == [1, 2, 3, 4, 5]
        assert beyond.through_index == 5
        assert await store.read(sid) == beyond.events
        missing = await inspect.read_events(new_sid("insp-none"), after_index=0, limit=10)
        assert missing.events == []
        assert missing.through_index == 0

        await store.put_snapshot(sid, "zeta", 2, 1)
        clock.advance(50)
        await store.put_snapshot(sid, "alpha", 3, 2)
        clock.advance(50)
        await store.put_snapshot(sid, "zeta", 1, "ignored")
        assert await inspect.list_snapshots(sid) == [
            SnapshotInfo("alpha", 3, T0 + 50),
            SnapshotInfo("zeta", 2, T0),
        ]
        await store.put_snapshot(sid, "zeta", 5, "moved")
        assert (await inspect.list_snapshots(sid))[1] == SnapshotInfo("zeta", 5, T0 + 100)
        assert await inspect.list_snapshots(new_sid("insp-none")) == []
