"""The ``presence`` capability: last writer wins, expiry on the store clock,
and pushed patches (``presence push``)."""

from __future__ import annotations

from typing import Any

import trio

from ..base import PresenceStore, Store, StoredPresencePatch
from .kit import FEED_DEADLINE_S, T0, CapabilityMissing, ManualClock, StoreFactory, new_sid

__all__ = [
    "check_presence_expiry_and_order",
    "check_presence_last_writer_wins",
    "check_presence_subscribe",
]


class _Recorder:
    """A presence subscriber that records patches and wakes a waiting check."""

    def __init__(self) -> None:
        self.patches: list[StoredPresencePatch] = []
        self._grew = trio.Event()

    def __call__(self, patch: StoredPresencePatch) -> None:
        self.patches.append(patch)
        self._grew.set()

    async def wait_for(self, count: int, what: str) -> None:
        """Wait until ``count`` patches arrived (push delivery may lag ``set``)."""
        try:
            with trio.fail_after(FEED_DEADLINE_S):
                while len(self.patches) < count:
                    self._grew = trio.Event()
                    await self._grew.wait()
        except trio.TooSlowError:
            raise AssertionError(f"{what}: not delivered within {FEED_DEADLINE_S} s") from None


def _presence(store: Store) -> PresenceStore:
    if store.presence is None:
        raise CapabilityMissing("presence")
    return store.presence


async def check_presence_last_writer_wins(open_store: StoreFactory) -> None:
    """Field-wise LWW on ``at_ms``: older writes lose, ties go to the incoming write."""
    async with open_store(ManualClock()) as store:
        presence = _presence(store)
        sid = new_sid("lww")

        async def put(values: dict[str, Any], at_ms: int) -> StoredPresencePatch | None:
            return await presence.set(sid, "p1", values, seen=at_ms, at_ms=at_ms, ttl_ms=60_000)

        async def fields() -> dict[str, Any]:
            return {r.field: r.value for r in await presence.read(sid)}

        assert await put({}, 1) is None
        first = await put({"a": 1, "b": {"x": [1, 2]}}, 100)
        assert first == StoredPresencePatch("p1", {"a": 1, "b": {"x": [1, 2]}}, 100, 100)
        assert await put({"a": 9}, 50) is None
        assert await fields() == {"a": 1, "b": {"x": [1, 2]}}
        tie = await put({"a": 3, "b": "é"}, 100)
        assert tie == StoredPresencePatch("p1", {"a": 3, "b": "é"}, 100, 100)
        await put({"a": 7}, 200)
        partial = await put({"a": 8, "b": 8}, 150)
        assert partial == StoredPresencePatch("p1", {"b": 8}, 150, 150)
        assert await fields() == {"a": 7, "b": 8}
        rows = {r.field: (r.seen, r.at_ms) for r in await presence.read(sid)}
        assert rows == {"a": (200, 200), "b": (150, 150)}

        cleared = await put({"b": None}, 300)
        assert cleared == StoredPresencePatch("p1", {"b": None}, 300, 300)
        assert await fields() == {"a": 7}
        assert await put({"a": None}, 199) is None, "an older clear loses to a newer value"
        assert await fields() == {"a": 7}
        assert await put({"a": None}, 200) is not None, "a clear at the same at applies"
        assert await presence.read(sid) == []


async def check_presence_expiry_and_order(open_store: StoreFactory) -> None:
    """Rows expire exactly ``ttl_ms`` after the write on the store clock; reads sort."""
    clock = ManualClock()
    async with open_store(clock) as store:
        presence = _presence(store)
        sid = new_sid("presence-ttl")
        # `at_ms` orders writes; it never anchors expiry.
        await presence.set(sid, "bob", {"z": 1, "a": 2}, seen=4, at_ms=5, ttl_ms=1_000)
        clock.advance(100)
        await presence.set(sid, "alice", {"m": True}, seen=9, at_ms=6, ttl_ms=1_000)
        rows = await presence.read(sid)
        assert [(r.participant, r.field) for r in rows] == [
            ("alice", "m"),
            ("bob", "a"),
            ("bob", "z"),
        ]
        assert [(r.value, r.seen, r.at_ms, r.expires_at_ms) for r in rows] == [
            (True, 9, 6, T0 + 1_100),
            (2, 4, 5, T0 + 1_000),
            (1, 4, 5, T0 + 1_000),
        ]
        assert await presence.read(new_sid("presence-other")) == []
        clock.advance(899)
        assert len(await presence.read(sid)) == 3
        clock.advance(1)
        assert [(r.participant, r.field) for r in await presence.read(sid)] == [("alice", "m")]
        clock.advance(100)
        assert await presence.read(sid) == []


async def check_presence_subscribe(open_store: StoreFactory) -> None:
    """Push-tier stores deliver applied patches to subscribers until unsubscribed."""
    async with open_store(ManualClock()) as store:
        presence = _presence(store)
        if not presence.push:
            raise CapabilityMissing("presence push")
        sid, other = new_sid("presence-sub"), new_sid("presence-sub-other")
        gone, stays = _Recorder(), _Recorder()
        unsubscribe_gone = presence.subscribe(sid, gone)
        unsubscribe_stays = presence.subscribe(sid, stays)
        try:
            await presence.set(other, "p", {"f": 0}, seen=1, at_ms=1, ttl_ms=60_000)
            patch = await presence.set(sid, "p", {"f": 1}, seen=1, at_ms=10, ttl_ms=60_000)
            assert patch is not None
            await gone.wait_for(1, "a pushed patch")
            await stays.wait_for(1, "a pushed patch")
            assert gone.patches == [patch], "only this session's applied patch is pushed"
            assert stays.patches == [patch]
            assert await presence.set(sid, "p", {"f": 2}, seen=1, at_ms=5, ttl_ms=60_000) is None
            unsubscribe_gone()
            last = await presence.set(sid, "p", {"f": 3}, seen=2, at_ms=20, ttl_ms=60_000)
            # Patches arrive in order, so once `stays` has the last one, `gone`
            # would have had it too.
            await stays.wait_for(2, "the second patch")
            assert stays.patches == [patch, last], "an unapplied write is never pushed"
            assert gone.patches == [patch], "an unsubscribed listener still received patches"
        finally:
            unsubscribe_stays()
