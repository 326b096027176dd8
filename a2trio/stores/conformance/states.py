"""Snapshots: ``put_snapshot``, ``read_state`` and ``read_states``."""

from __future__ import annotations

from ..base import Snapshot, StateRead
from .kit import ManualClock, StoreFactory, append_n, indexes_of, new_sid

__all__ = [
    "check_read_states",
    "check_snapshots",
]


async def check_snapshots(open_store: StoreFactory) -> None:
    """read_state splits at the snapshot; put_snapshot never moves backwards."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("snap")
        appended = (await append_n(store, sid, 4)).events
        empty = await store.read_state(sid, "r")
        assert empty.snapshot is None
        assert [(e.id, e.index, e.payload) for e in empty.events] == [
            (e.id, e.index, e.payload) for e in appended
        ]
        state = {"count": 2, "names": ["å", None], "ratio": 0.5}
        await store.put_snapshot(sid, "r", 2, state)
        after = await store.read_state(sid, "r")
        assert after.snapshot == Snapshot(2, state)
        assert indexes_of(after.events) == [3, 4]
        assert [e.type for e in after.events] == ["note", "note"]
        await store.put_snapshot(sid, "r", 1, {"older": True})
        await store.put_snapshot(sid, "r", 2, {"same index": True})
        assert (await store.read_state(sid, "r")).snapshot == Snapshot(2, state)
        await store.put_snapshot(sid, "r", 4, {"count": 4})
        newest = await store.read_state(sid, "r")
        assert newest == StateRead(Snapshot(4, {"count": 4}), [])
        assert (await store.read_state(sid, "other")).snapshot is None
        assert (await store.read_state(new_sid("missing"), "r")) == StateRead(None, [])


async def check_read_states(open_store: StoreFactory) -> None:
    """read_states aligns with the requested ids; missing sessions read empty."""
    async with open_store(ManualClock()) as store:
        a, b, missing = new_sid("states-a"), new_sid("states-b"), new_sid("states-missing")
        await append_n(store, a, 3)
        await append_n(store, b, 2)
        await store.put_snapshot(b, "r", 1, [1])
        await store.put_snapshot(a, "elsewhere", 3, "x")
        reads = await store.read_states([b, missing, a], "r")
        assert len(reads) == 3
        assert reads[0].snapshot == Snapshot(1, [1])
        assert indexes_of(reads[0].events) == [2]
        assert reads[1] == StateRead(None, [])
        assert reads[2].snapshot is None
        assert indexes_of(reads[2].events) == [1, 2, 3]
        assert all(e.session_id == a for e in reads[2].events)
        assert await store.read_states([], "r") == []
