"""Presence at the session surface: stamps and values that are refused, an
empty patch, and a two-plane feed whose event plane fails or ends.
Memory store, autojump clock (tests/test_presence.py runs every backend)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import a2trio

from .apps import Cursor, Note, orders, rooms
from .breaking_feeds import BreakingFeeds


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"seen": -1},
            ValueError,
            "presence seen must be a non-negative integer up to 2\\*\\*53 - 1, got -1",
        ),
        (
            {"seen": True},
            ValueError,
            "presence seen must be a non-negative integer up to 2\\*\\*53 - 1, got True",
        ),
        (
            {"seen": 2**63},
            ValueError,
            f"presence seen must be a non-negative integer up to 2\\*\\*53 - 1, got {2**63}",
        ),
        ({"at": "5"}, TypeError, "presence at must be epoch milliseconds, got '5'"),
        ({"at": False}, TypeError, "presence at must be epoch milliseconds, got False"),
    ],
)
async def test_bad_stamps_are_refused_and_store_nothing(
    options: dict[str, Any],
    error: type[Exception],
    message: str,
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(rooms, store=BreakingFeeds(breaks_on="-", error=None))
    async with server:
        room = server.session("r1")
        with pytest.raises(error, match=f"^{message}$"):
            await room.set_presence("ann", {"typing": True}, **options)
        assert await room.presence() == {}


async def test_values_must_be_a_mapping_and_an_empty_patch_is_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(rooms, store=BreakingFeeds(breaks_on="-", error=None))
    async with server:
        room = server.session("r1")
        with pytest.raises(TypeError, match="presence values must be a mapping"):
            await room.set_presence("ann", [("typing", True)])  # type: ignore[arg-type]
        async with room.stream(presence=True) as feed:
            assert await feed.receive() == a2trio.PresenceSnapshot({})
            await room.set_presence("ann", {})
            await room.set_presence("bob", {"cursor": Cursor(1, 2)})
            patch = await feed.receive()
        # Only bob's patch: ann's empty one wrote and announced nothing.
        assert isinstance(patch, a2trio.PresencePatch)
        assert (patch.participant, patch.values) == ("bob", {"cursor": Cursor(1, 2)})
        assert list(await room.presence()) == ["bob"]


@pytest.mark.parametrize("ends", [True, False], ids=["events-end", "events-fail"])
async def test_a_presence_feed_ends_with_its_event_plane(
    ends: bool, autojump_clock: trio.testing.MockClock
) -> None:
    error = None if ends else a2trio.A2Error("STORE_UNAVAILABLE", "the feed's connection dropped")
    store = BreakingFeeds(breaks_on="note", error=error)
    server = a2trio.Server(rooms, store=store)
    async with server:
        room = server.session("r1")
        async with room.stream(presence=True) as feed:
            assert isinstance(await feed.receive(), a2trio.PresenceSnapshot)
            await room.append(rooms.event("note", Note("breaks the event plane")))
            if ends:
                with pytest.raises(StopAsyncIteration):
                    await feed.receive()
            else:
                with pytest.raises(a2trio.A2Error, match="the feed's connection dropped"):
                    await feed.receive()
    assert store.broke_at == [0.0]


async def test_a_contract_without_presence_has_no_presence_plane(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        session = server.session("s1")
        with pytest.raises(TypeError, match=r"^contract 'orders' declares no presence fields$"):
            await session.set_presence("ann", {"typing": True})
        with pytest.raises(TypeError, match=r"^contract 'orders' declares no presence fields$"):
            await session.presence()
