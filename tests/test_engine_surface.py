"""The engine's public surface where it refuses or degrades: bad registrations
and options, handler results and lanes that resolve wrongly, snapshot caches
that fail, deliveries for another contract. All through ``Server``,
``Session``, ``handler`` and the test kit, so they hold across refactors.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.scheduler import DrainTask
from a2trio.stores import memory
from a2trio.testing import FaultyStore, RecordingTelemetry, open_harness

from .apps import Note, Ordered, Shipped, orders, rooms


def counter() -> a2trio.Reducer[int]:
    return a2trio.Reducer("count", 0, lambda state, event: state + 1)


# -- registration and options ----------------------------------------------------------


def test_server_options_are_validated() -> None:
    with pytest.raises(TypeError, match=r"^Server expects a contract from a2trio.contract\(\)"):
        a2trio.Server("orders", store=memory())  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="presence_ttl_ms must be a positive integer"):
            a2trio.Server(rooms, store=memory(), presence_ttl_ms=bad)  # type: ignore[arg-type]


def test_server_exposes_what_it_was_built_with() -> None:
    telemetry = RecordingTelemetry()

    def validate(push: a2trio.PushValidation) -> bool:
        return True

    server = a2trio.Server(
        rooms, store=memory(), telemetry=telemetry, validate_push=validate, presence_ttl_ms=5_000
    )
    assert server.telemetry is telemetry
    assert server.validate_push is validate
    assert server.presence_ttl_ms == 5_000
    assert repr(server.session("r1")) == "Session('rooms', 'r1')"


def test_handler_registration_is_validated() -> None:
    async def ship(ctx: Any) -> None:
        return None

    with pytest.raises(TypeError, match=r"^handler must be an async function, got 'ship'$"):
        a2trio.handler("ship")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^abort_on\['cancelled'\] must be True or a predicate"):
        a2trio.handler(ship, abort_on={"cancelled": 3})  # type: ignore[dict-item]
    assert repr(a2trio.handler(ship)) == "handler('ship')"


async def test_a_handler_context_names_its_event_and_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        seen.append(repr(ctx))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.settle()
    assert seen == ["HandlerContext(event=ordered#1, attempt=1)"]


# -- what handlers return, and lanes ----------------------------------------------------


async def test_a_handler_returning_something_else_than_appends_fails_its_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> Any:
        return ["not an append input"]

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        await app.session("s1").append(orders.event("ordered", Ordered("a")))
        await app.settle()
        found = await app.assert_outcome("s1", 1, "failed", failures=1)
        assert "a handler returns None, an append input or a list of them" in (
            found.last_error or ""
        )
        await app.assert_log("s1", ["ordered"])


async def test_a_lane_function_must_resolve_to_a_non_empty_string(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        return None

    def lane(session_id: str, event: a2trio.AppendInput) -> Any:
        return "" if event.payload.item == "bad" else None

    handlers = {"ordered": a2trio.handler(ship, lane=lane)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        with pytest.raises(TypeError, match="lane for 'ordered' must resolve to a non-empty"):
            await session.append(orders.event("ordered", Ordered("bad")))
        with pytest.raises(TypeError, match="got None"):
            await session.append(orders.event("ordered", Ordered("none")))
        await app.assert_log(session, [])


async def test_a_handlers_session_appends_by_name_dispatches_and_sets_presence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[str] = []

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        if ctx.event.payload.text != "go":
            return
        try:
            await ctx.session.append("", rooms.event("note", Note("never")))
        except TypeError as exc:
            errors.append(str(exc))
        await ctx.session.dispatch("handed", rooms.event("note", Note("dispatched")))
        await ctx.session.set_presence("bot", {"typing": True})

    async with open_harness(rooms, handlers={"note": note}) as app:
        session = app.session("r1")
        await session.append(rooms.event("note", Note("go")))
        await app.settle()
        await app.assert_log(session, ["note", "note"])
        presence = await session.presence()
    assert errors == ["handler append name must be a non-empty string, got ''"]
    # seen defaults to the trigger's index.
    assert presence["bot"]["typing"].seen == 1


# -- state() when the snapshot cache fails ----------------------------------------------


async def test_state_reads_the_log_when_the_snapshot_read_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_harness(orders) as app:
        session = app.session("s1")
        await session.append(*[orders.event("note", Note(str(n))) for n in range(3)])
        with pytest.raises(TypeError, match=r"^state\(\) takes an a2trio.Reducer, got 'count'$"):
            await session.state("count")  # type: ignore[arg-type]
        with app.store.fail("read_states", "put_snapshot") as fault:
            assert await session.state(counter()) == (3, 3)
            await app.settle()  # the snapshot write-back runs in the background
        assert fault.fired == 2
        [span] = app.telemetry.find("a2.state")
        assert span.attributes["a2.state.snapshot"] == "miss"
        assert span.attributes["a2.state.folded"] == 3
        # The cache write failed quietly: the next read folds from the log again.
        assert await session.state(counter()) == (3, 3)
        assert app.telemetry.find("a2.state")[1].attributes["a2.state.folded"] == 3


async def test_state_reports_an_outage_of_the_log_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_harness(orders) as app:
        session = app.session("s1")
        await session.append(orders.event("note", Note("x")))
        with app.store.fail("read_states", "read"), pytest.raises(a2trio.A2Error) as caught:
            await session.state(counter())
        assert caught.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE


# -- deliveries, schedules and feeds ------------------------------------------------------


async def test_a_task_for_another_contract_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with a2trio.Server(orders, store=memory(clock=a2trio.TrioClock())) as server:
        with pytest.raises(
            ValueError, match="for contract 'rooms' cannot be delivered to 'orders'"
        ):
            await server.deliver(DrainTask("rooms", "s1", 0))


async def test_a_schedule_delay_must_land_on_a_finite_instant(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_harness(orders) as app:
        huge = "1" + "0" * 400 + "s"
        with pytest.raises(TypeError, match="schedule due time must be finite"):
            await app.session("s1").schedule("never", huge, orders.event("note", Note("x")))


async def test_a_session_of_a_server_not_yet_open_streams_from_the_store(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store)
    writer = a2trio.Server(orders, store=store)
    session = server.session("s1")
    async with writer, session.stream() as feed:
        await writer.session("s1").append(orders.event("shipped", Shipped("a")))
        event = await feed.receive()
    assert (event.index, event.payload) == (1, Shipped("a"))


async def test_a_faulty_store_passes_inspection_and_presence_through() -> None:
    inner = memory()
    faulty = FaultyStore(inner)
    assert faulty.inspect is inner.inspect
    assert faulty.presence is inner.presence
    assert repr(faulty) == f"FaultyStore({inner!r})"
