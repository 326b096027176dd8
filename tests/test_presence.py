"""The presence plane on every store: LWW, expiry, clears, the two-plane feed.

Store time is a ``ManualClock`` moved by hand, so the same test runs on the
memory store (push tier), Postgres (push tier, through its one listener) and
sqlite (degraded tier: re-read and diffed on the feed's cadence).
"""

from __future__ import annotations

import importlib
import os
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import a2trio
from a2trio.stores.conformance import ManualClock

from .apps import Cursor, Note, rooms

BACKENDS = ["memory", "sqlite", "postgres"]
ROOT = str(Path(__file__).resolve().parent.parent)
FAST = a2trio.Timings(poll_idle_s=0.05, poll_active_s=0.01, notify_safety_s=0.05)


@asynccontextmanager
async def open_server(
    backend: str, clock: ManualClock, **options: Any
) -> AsyncIterator[a2trio.Server]:
    open_store = importlib.import_module(f"tests.backends.{backend}").open_store
    async with open_store(clock) as store:
        server = a2trio.Server(rooms, store=store, clock=clock, timings=FAST, **options)
        async with server:
            yield server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def values(presence: a2trio.PresenceMap) -> dict[str, dict[str, Any]]:
    return {p: {f: v.value for f, v in fields.items()} for p, fields in presence.items()}


async def test_last_writer_wins_per_field_on_at_and_ties_go_to_the_incoming_write(
    backend: str,
) -> None:
    clock = ManualClock()
    async with open_server(backend, clock) as server:
        room = server.session(f"r-{secrets.token_hex(4)}")
        await room.set_presence("ann", {"typing": True, "cursor": Cursor(1, 1)}, at=200)
        await room.set_presence("ann", {"typing": False}, at=100)  # older: ignored
        await room.set_presence("ann", {"cursor": Cursor(2, 2)}, at=200)  # tie: wins
        presence = await room.presence()
        assert values(presence) == {"ann": {"typing": True, "cursor": Cursor(2, 2)}}
        assert presence["ann"]["typing"].at_ms == 200


async def test_none_clears_and_values_expire_exactly_at_the_ttl(backend: str) -> None:
    clock = ManualClock()
    async with open_server(backend, clock, presence_ttl_ms=1000) as server:
        room = server.session(f"r-{secrets.token_hex(4)}")
        await room.set_presence("ann", {"typing": True, "cursor": Cursor(0, 0)}, seen=4)
        await room.set_presence("ann", {"typing": None})
        assert values(await room.presence()) == {"ann": {"cursor": Cursor(0, 0)}}
        assert (await room.presence())["ann"]["cursor"].seen == 4
        clock.advance(999)
        assert values(await room.presence()) == {"ann": {"cursor": Cursor(0, 0)}}
        clock.advance(1)
        assert await room.presence() == {}


async def test_bad_presence_input_raises_and_stores_nothing(backend: str) -> None:
    clock = ManualClock()
    async with open_server(backend, clock) as server:
        room = server.session(f"r-{secrets.token_hex(4)}")
        cases: list[tuple[Any, type[Exception], str]] = [
            (
                {"participant": "ann", "values": {"mood": 1}},
                a2trio.A2Error,
                "UNKNOWN_PRESENCE_FIELD",
            ),
            (
                {"participant": "ann", "values": {"mood": None}},
                a2trio.A2Error,
                "UNKNOWN_PRESENCE_FIELD",
            ),
            (
                {"participant": "ann", "values": {"typing": True, "cursor": {"x": "a"}}},
                a2trio.A2Error,
                "INVALID_PAYLOAD",
            ),
            ({"participant": "", "values": {"typing": True}}, TypeError, "non-empty"),
            ({"participant": "__proto__", "values": {"typing": True}}, ValueError, "must not be"),
            ({"participant": "ann", "values": {"typing": True}, "at": -1}, ValueError, "in range"),
            (
                {"participant": "ann", "values": {"typing": True}, "at": float("inf")},
                ValueError,
                "in range",
            ),
        ]
        for case, error, text in cases:
            with pytest.raises(error, match=text):
                await room.set_presence(case["participant"], case["values"], at=case.get("at"))
        assert await room.presence() == {}


async def test_two_plane_feed_yields_one_snapshot_then_patches_and_events(backend: str) -> None:
    clock = ManualClock()
    async with open_server(backend, clock) as server:
        room = server.session(f"r-{secrets.token_hex(4)}")
        await room.set_presence("ann", {"typing": True})
        await room.append(rooms.event("note", Note("before")))
        items: list[Any] = []
        async with room.stream(presence=True) as feed:
            with trio.fail_after(10):
                items.append(await feed.receive())  # the snapshot
                items.append(await feed.receive())  # event 1
                async with trio.open_nursery() as writers:
                    writers.start_soon(room.set_presence, "bob", {"cursor": Cursor(3, 4)})
                    writers.start_soon(room.append, rooms.event("note", Note("after")))
                while len(items) < 4:
                    items.append(await feed.receive())
                await room.set_presence("bob", {"cursor": None})
                items.append(await feed.receive())
        snapshot = items[0]
        assert isinstance(snapshot, a2trio.PresenceSnapshot)
        assert values(snapshot.snapshot) == {"ann": {"typing": True}}
        assert isinstance(items[1], a2trio.Event)
        assert items[1].index == 1
        rest = items[2:4]
        patches = [i for i in rest if isinstance(i, a2trio.PresencePatch)]
        events = [i for i in rest if isinstance(i, a2trio.Event)]
        assert [(p.participant, p.values) for p in patches] == [("bob", {"cursor": Cursor(3, 4)})]
        assert [e.index for e in events] == [2]
        cleared = items[4]
        assert isinstance(cleared, a2trio.PresencePatch)
        assert (cleared.participant, cleared.values) == ("bob", {"cursor": None})
        assert not any(isinstance(i, a2trio.PresenceSnapshot) for i in items[1:])


async def test_a_stalled_reader_holds_at_most_the_live_cardinality() -> None:
    clock = ManualClock()
    async with open_server("memory", clock) as server:
        room = server.session("stalled")
        async with room.stream(presence=True) as feed:
            assert isinstance(await feed.receive(), a2trio.PresenceSnapshot)
            for n in range(10_000):
                await room.set_presence(
                    f"p{n % 10}", {"cursor": Cursor(n, n), "typing": n % 2 == 0}, at=n
                )
            assert feed.queued() <= 10 * len(rooms.presence)  # type: ignore[attr-defined]
            latest: dict[tuple[str, str], Any] = {}
            while feed.queued():  # type: ignore[attr-defined]
                patch = await feed.receive()
                assert isinstance(patch, a2trio.PresencePatch)
                for field, value in patch.values.items():
                    latest[(patch.participant, field)] = value
        assert latest[("p9", "cursor")] == Cursor(9999, 9999)
        assert latest[("p0", "typing")] is True


async def test_presence_needs_a_store_with_the_capability() -> None:
    store = a2trio.stores.memory()
    store.presence = None  # type: ignore[assignment]
    with pytest.raises(a2trio.A2Error) as info:
        a2trio.Server(rooms, store=store)
    assert info.value.code == a2trio.ErrorCode.PRESENCE_NOT_SUPPORTED


async def test_validate_push_sees_a_frozen_copy_of_pushed_presence() -> None:
    seen: list[a2trio.PushValidation] = []

    def tamper(validation: a2trio.PushValidation) -> bool:
        seen.append(validation)
        assert validation.presence is not None
        validation.presence.values["typing"] = False  # must not reach the store
        return True

    clock = ManualClock()
    async with open_server("memory", clock, validate_push=tamper) as server:
        room = server.session("r")
        pushed = a2trio.PushedPresence("ann", {"typing": True}, at=5)
        await room.set_presence(pushed, {})
        assert values(await room.presence()) == {"ann": {"typing": True}}
        assert [v.presence.participant for v in seen if v.presence] == ["ann"]


async def test_a_patch_set_through_one_postgres_store_reaches_a_subscriber_of_another() -> None:
    from .backends.postgres import database_dsn

    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    clock = ManualClock()
    writer_store = a2trio.stores.postgres(dsn, clock=clock, schema=schema)
    reader_store = a2trio.stores.postgres(dsn, clock=clock, schema=schema)
    writer = a2trio.Server(rooms, store=writer_store, clock=clock)
    reader = a2trio.Server(rooms, store=reader_store, clock=clock)
    async with writer, reader:
        async with reader.session("shared").stream(presence=True) as feed:
            with trio.fail_after(10):
                assert isinstance(await feed.receive(), a2trio.PresenceSnapshot)
                await writer.session("shared").set_presence("ann", {"typing": True})
                patch = await feed.receive()
    assert isinstance(patch, a2trio.PresencePatch)
    assert (patch.participant, patch.values) == ("ann", {"typing": True})


async def test_expired_fields_surface_as_none_patches_on_every_tier(backend: str) -> None:
    clock = ManualClock()
    async with open_server(backend, clock, presence_ttl_ms=1000) as server:
        room = server.session(f"r-{secrets.token_hex(4)}")
        await room.set_presence("ann", {"typing": True}, seen=2)
        async with room.stream(presence=True) as feed:
            with trio.fail_after(10):
                snapshot = await feed.receive()
                assert isinstance(snapshot, a2trio.PresenceSnapshot)
                assert values(snapshot.snapshot) == {"ann": {"typing": True}}
                clock.advance(1000)
                patch = await feed.receive()
    assert isinstance(patch, a2trio.PresencePatch)
    assert (patch.participant, patch.values, patch.seen) == ("ann", {"typing": None}, 2)


async def test_a_patch_set_in_another_process_reaches_a_postgres_subscriber() -> None:
    from .backends.postgres import database_dsn

    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    store = a2trio.stores.postgres(dsn, schema=schema)
    async with a2trio.Server(rooms, store=store) as server:
        async with server.session("shared").stream(presence=True) as feed:
            with trio.fail_after(30):
                assert isinstance(await feed.receive(), a2trio.PresenceSnapshot)
                await trio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "tests.pg_workers.presence_writer",
                        dsn,
                        schema,
                        "shared",
                    ],
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": ROOT},
                )
                patch = await feed.receive()
    assert isinstance(patch, a2trio.PresencePatch)
    assert (patch.participant, patch.values) == ("ann", {"typing": True})
