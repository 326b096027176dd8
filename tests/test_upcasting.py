"""Schema versions and upcasters (issue 35): declarations checked at
construction, and events written by a contract's first version read, handled,
followed, folded and inspected as its current one on every store.

The store half (the version stored with each event and read back) is the
conformance check ``check_version_is_stored_with_the_event``."""

from __future__ import annotations

import contextlib
import importlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

import a2trio
from a2trio.scheduler import (
    AppendTask,
    ScheduledEvent,
    SchedulerTarget,
    SchedulerTask,
    task_decoder,
)
from a2trio.stores.base import Store
from a2trio.stores.conformance import ManualClock
from a2trio.stores.postgres import postgres
from examples import upcasting
from tests.backends.postgres import database_dsn, run_sql

BACKENDS = ["memory", "sqlite", "postgres", "redis"]


class OrderedV1(msgspec.Struct, frozen=True):
    item: str


class OrderedV2(msgspec.Struct, frozen=True):
    item: str
    quantity: int


class Ordered(msgspec.Struct, frozen=True):
    sku: str
    quantity: int
    note: str = ""


class Shipped(msgspec.Struct, frozen=True):
    sku: str


def v1_to_v2(old: OrderedV1) -> OrderedV2:
    if old.item == "cursed":
        raise ValueError("no quantity for a cursed item")
    return OrderedV2(old.item, quantity=1)


def v2_to_v3(old: OrderedV2) -> dict[str, Any]:
    # A dict is converted to the next version's type.
    return {"sku": old.item.upper(), "quantity": old.quantity}


first = a2trio.contract("orders", events={"ordered": OrderedV1, "shipped": Shipped})
second = a2trio.contract(
    "orders",
    events={"ordered": OrderedV2, "shipped": Shipped},
    versions={"ordered": [OrderedV1, OrderedV2]},
    upcasters={"ordered": [v1_to_v2]},
)
current = a2trio.contract(
    "orders",
    events={"ordered": Ordered, "shipped": Shipped},
    versions={"ordered": [OrderedV1, OrderedV2, Ordered]},
    upcasters={"ordered": [v1_to_v2, v2_to_v3]},
)


class Totals(msgspec.Struct):
    skus: list[str] = msgspec.field(default_factory=list)
    quantity: int = 0


def fold(state: Totals, event: a2trio.Event[Any]) -> Totals:
    if event.type == "ordered":
        assert isinstance(event.payload, Ordered), event.payload
        state.skus.append(event.payload.sku)
        state.quantity += event.payload.quantity
    return state


totals = a2trio.Reducer("totals", Totals(), fold)


# -- declarations -----------------------------------------------------------------


def test_the_current_version_is_stored_and_none_is_version_one() -> None:
    assert [current.versions.current(t) for t in ("ordered", "shipped")] == [3, 1]
    assert [current.versions.stored(t) for t in ("ordered", "shipped")] == [3, None]
    assert first.versions.stored("ordered") is None


def test_a_stored_payload_is_upcast_step_by_step() -> None:
    def read(payload: Any, version: int | None) -> Any:
        return current.upcast("ordered", payload, version, session_id="s", index=4, event_id="e-4")

    assert read({"item": "pen"}, None) == Ordered("PEN", 1)
    assert read({"item": "pen"}, 1) == Ordered("PEN", 1)
    assert read({"item": "pen", "quantity": 3}, 2) == Ordered("PEN", 3)
    assert read({"sku": "PEN", "quantity": 2, "note": "x"}, 3) == Ordered("PEN", 2, "x")
    # A type the contract does not declare passes as stored.
    assert current.upcast("gone", {"a": 1}, 2, session_id="s", index=1, event_id="e") == {"a": 1}


@pytest.mark.parametrize(
    ("payload", "version", "reason"),
    [
        ({"item": "cursed"}, 1, "the upcaster from version 1 to 2 raised ValueError: no quantity"),
        ({"sku": 1}, 1, "its payload is not a version 1 (OrderedV1)"),
        ({"item": "pen"}, 4, "the contract declares versions 1 to 3 (was it written by a newer"),
        ({"item": "pen"}, 0, "the contract declares versions 1 to 3"),
    ],
)
def test_an_event_that_cannot_be_upcast_is_a_typed_error(
    payload: Any, version: int, reason: str
) -> None:
    with pytest.raises(a2trio.UpcastError) as caught:
        current.upcast("ordered", payload, version, session_id="s1", index=7, event_id="e-7")
    error = caught.value
    assert (error.contract, error.session_id, error.index, error.event_id) == (
        "orders",
        "s1",
        7,
        "e-7",
    )
    assert (error.type, error.version, error.current) == ("ordered", version, 3)
    assert error.reason.startswith(reason), error.reason
    assert str(error).startswith(
        f"event 7 ('e-7') of session 's1' on contract 'orders': a 'ordered' event stored at "
        f"version {version} cannot be read as version 3: "
    )


def test_an_upcaster_returning_another_type_is_an_upcast_error() -> None:
    broken = a2trio.contract(
        "orders",
        events={"ordered": OrderedV2},
        versions={"ordered": [OrderedV1, OrderedV2]},
        upcasters={"ordered": [lambda old: {"item": old.item}]},
    )
    with pytest.raises(a2trio.UpcastError, match=r"returned .* which is not a OrderedV2"):
        broken.upcast("ordered", {"item": "a"}, None, session_id="s", index=1, event_id="e")


def test_an_unversioned_type_stored_at_another_version_is_an_upcast_error() -> None:
    with pytest.raises(a2trio.UpcastError, match="declares no versions of 'shipped'"):
        current.upcast("shipped", {"sku": "a"}, 2, session_id="s", index=1, event_id="e")
    with pytest.raises(a2trio.UpcastError, match="its payload is not a Shipped"):
        current.upcast("shipped", {"sku": 1}, None, session_id="s", index=1, event_id="e")


def test_handles_name_their_types_and_actors_take_versions() -> None:
    ordered = a2trio.event_type("ordered", OrderedV2)
    handled = a2trio.contract(
        "orders",
        events=[ordered],
        versions={ordered: [OrderedV1, OrderedV2]},
        upcasters={ordered: [v1_to_v2]},
    )
    assert handled.versions.stored("ordered") == 2

    async def order(state: Totals, input: OrderedV2) -> a2trio.AppendInput:
        return ordered(input)

    actor = a2trio.actor(
        "carts",
        events=[ordered],
        state=a2trio.Reducer("n", 0, lambda n, _: n + 1),
        calls={"order": a2trio.call(OrderedV2, order)},
        versions={"ordered": [OrderedV1, OrderedV2]},
        upcasters={"ordered": [v1_to_v2]},
    )
    assert actor.upcast(
        "ordered", {"item": "a"}, None, session_id="c", index=1, event_id="e"
    ) == OrderedV2("a", 1)


@pytest.mark.parametrize(
    ("versions", "upcasters", "error", "message"),
    [
        (
            {"ordered": [OrderedV2, OrderedV1]},
            {"ordered": [v1_to_v2]},
            ValueError,
            "versions['ordered'] ends with OrderedV1, but 'ordered' has payload type OrderedV2",
        ),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            None,
            ValueError,
            "'ordered' has 2 versions but no upcaster from version 1 to 2",
        ),
        (
            {"ordered": [OrderedV1, OrderedV1, OrderedV2]},
            {"ordered": [v1_to_v2]},
            ValueError,
            "'ordered' has 3 versions but no upcaster from version 2 to 3",
        ),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            {"ordered": [v1_to_v2, v1_to_v2]},
            ValueError,
            "'ordered' has 2 versions, so 1 upcaster step(s), but upcasters['ordered'] has 2",
        ),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            {"ordered": ["v1_to_v2"]},
            TypeError,
            "the upcaster of 'ordered' from version 1 to 2 is not callable: 'v1_to_v2'",
        ),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            {"ordered": v1_to_v2},
            TypeError,
            "upcasters['ordered'] must be a list of functions",
        ),
        (
            {"placed": [OrderedV1, OrderedV2]},
            None,
            ValueError,
            "versions= names 'placed', which is not one of its event types",
        ),
        (
            {"ordered": [OrderedV2]},
            {"shipped": [v1_to_v2]},
            ValueError,
            "upcasters= names 'shipped', which has no versions=",
        ),
        ({"ordered": []}, None, ValueError, "versions['ordered'] is empty"),
        (
            {"ordered": OrderedV2},
            None,
            TypeError,
            "versions['ordered'] must be a list of payload types",
        ),
        (
            {"ordered": [object(), OrderedV2]},
            {"ordered": [v1_to_v2]},
            TypeError,
            "version 1 of 'ordered' has type",
        ),
        ([OrderedV1], None, TypeError, "versions= takes a mapping"),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            [v1_to_v2],
            TypeError,
            "upcasters= takes a mapping",
        ),
        ({1: [OrderedV2]}, None, TypeError, "versions= keys are event type names (or handles)"),
        (
            {
                "ordered": [OrderedV1, OrderedV2],
                a2trio.event_type("ordered", OrderedV2): [OrderedV2],
            },
            None,
            ValueError,
            "versions= names 'ordered' twice",
        ),
        (
            {"ordered": [OrderedV1, OrderedV2]},
            {"ordered": [v1_to_v2], a2trio.event_type("ordered", OrderedV2): [v1_to_v2]},
            ValueError,
            "upcasters= names 'ordered' twice",
        ),
    ],
)
def test_bad_declarations_fail_at_construction(
    versions: Any, upcasters: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        a2trio.contract(
            "orders",
            events={"ordered": OrderedV2, "shipped": Shipped},
            versions=versions,
            upcasters=upcasters,
        )
    assert message in str(caught.value)


# -- on every store ---------------------------------------------------------------


@asynccontextmanager
async def _store(backend: str) -> AsyncIterator[Store]:
    module = importlib.import_module(f"tests.backends.{backend}")
    async with module.open_store(ManualClock()) as store:
        yield store


async def _unused(ctx: a2trio.HandlerContext[Any]) -> None:
    raise AssertionError("an appending tier runs no handler")


async def written_by_the_first_version(store: Store, session_id: str, *items: str) -> None:
    # An API tier of the first deployment: it declares the handled types, so
    # its events wait for a handler, and runs none.
    handlers = {"ordered": _unused}
    async with a2trio.Server(first, store=store, handlers=handlers, run_handlers=False) as server:
        await server.session(session_id).append(
            *(first.event("ordered", OrderedV1(item)) for item in items)
        )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_events_of_the_first_version_read_as_the_current_one(backend: str) -> None:
    async with _store(backend) as store:
        await written_by_the_first_version(store, "s1", "pen", "ink")
        # The second version's deployment writes at version 2.
        handlers = {"ordered": _unused}
        async with a2trio.Server(
            second, store=store, handlers=handlers, run_handlers=False
        ) as server:
            await server.session("s1").append(second.event("ordered", OrderedV2("cap", 4)))
        handled: list[tuple[int, Ordered]] = []
        shipped = trio.Event()

        async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput | None:
            handled.append((ctx.event.index, ctx.event.payload))
            if len(handled) == 4:
                shipped.set()
            return current.event("shipped", Shipped(ctx.event.payload.sku))

        async with a2trio.Server(current, store=store, handlers={"ordered": ship}) as server:
            session = server.session("s1")
            async with session.stream() as feed:
                await session.append(current.event("ordered", Ordered("NIB", 2, "fresh")))
                followed: list[Any] = []
                with trio.fail_after(10):
                    # Handlers' shipped events interleave: the server's sweep
                    # may run the old events before this append.
                    while len(followed) < 4:
                        event = await feed.receive()
                        if event.type == "ordered":
                            followed.append(event.payload)
                    await shipped.wait()
            await server.settle()
            expected = [
                Ordered("PEN", 1),
                Ordered("INK", 1),
                Ordered("CAP", 4),
                Ordered("NIB", 2, "fresh"),
            ]
            assert followed == expected
            history = await session.history()
            assert [e.payload for e in history if e.type == "ordered"] == expected
            assert [payload for _, payload in sorted(handled)] == expected
            stored = await store.read(server.key("s1"))
            assert [row.version for row in stored if row.type == "ordered"] == [None, None, 2, 3]
            shipped_versions = {row.version for row in stored if row.type == "shipped"}
            assert shipped_versions == {None}, "shipped has no versions"
            # Inspection sees the current struct too, and the stored version.
            page = await server.inspect.read_session_page("s1")
            inspected = [i for i in page.events if i.event.type == "ordered"]
            assert [i.event.payload for i in inspected] == expected
            assert [(i.version, i.upcast_error) for i in inspected] == [
                (1, None),
                (1, None),
                (2, None),
                (3, None),
            ]
            # A fold over old events sees the current struct; its snapshot
            # holds the state built from them, and a later read starts from it.
            state, index = await session.state(totals)
            assert (state.skus, state.quantity, index) == (["PEN", "INK", "CAP", "NIB"], 8, 8)
            await server.settle()
            snapshot = (await store.read_state(server.key("s1"), "totals")).snapshot
            assert snapshot is not None
            assert (snapshot.index, snapshot.state["quantity"]) == (8, 8)
        await written_by_the_first_version(store, "s1", "lid")
        async with a2trio.Server(current, store=store, run_handlers=False) as server:
            state, index = await server.session("s1").state(totals)
            assert (state.skus[-1], state.quantity, index) == ("LID", 9, 9)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_event_that_cannot_be_upcast_is_dead_lettered_at_once(backend: str) -> None:
    runs: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        runs.append(ctx.event.index)

    async with _store(backend) as store:
        await written_by_the_first_version(store, "s1", "pen", "cursed")
        async with a2trio.Server(current, store=store, handlers={"ordered": ship}) as server:
            # The append wakes the session's drain, which claims all three.
            await server.session("s1").append(current.event("ordered", Ordered("NIB", 1)))
            await server.settle()
            with pytest.raises(a2trio.UpcastError) as caught:
                await server.session("s1").history()
            error = caught.value
            assert (error.session_id, error.index, error.version) == ("s1", 2, 1)
            assert sorted(runs) == [1, 3], "the handler never ran on the event it cannot read"
            page = await server.inspect.list_dead_letters()
            [dead] = page.dead_letters
            assert (dead.event.index, dead.status.failures) == (2, 1)
            # The operator sees it as stored, and why it cannot be read.
            assert dead.event.payload == {"item": "cursed"}
            assert dead.version == 1
            assert dead.upcast_error is not None
            assert dead.upcast_error.startswith("event 2 (")
            assert dead.status.last_error is not None
            assert "UpcastError: event 2" in dead.status.last_error
            assert "stored at version 1 cannot be read as version 3" in dead.status.last_error
            with pytest.raises(a2trio.UpcastError, match="event 2"):
                await server.session("s1").state(totals)
            # A feed raises it to its reader, after the events before it.
            async with server.session("s1").stream() as feed:
                assert (await feed.receive()).payload == Ordered("PEN", 1)
                with pytest.raises(a2trio.UpcastError, match="event 2"):
                    await feed.receive()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_example_runs(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    async with _store(backend) as store:
        await upcasting.main(store)
    # The output examples/upcasting.py's docstring shows.
    assert capsys.readouterr().out.splitlines() == [
        "handler: ship 1 x BOOK",
        "handler: ship 3 x PEN",
        "handler: ship 2 x INK",
        "stored versions: [None, None, 2]",
        "history: BOOK x1, PEN x3, INK x2",
        "state: 6 items through index 6",
    ]


SEED_DDL = Path(__file__).resolve().parent / "seed" / "store_postgres_0.5.0_schema.sql"


async def test_rows_in_a_postgres_table_the_seeds_ddl_made_read_as_version_1() -> None:
    # The seed's DDL and a row as the seed's insert writes it (no version
    # column): a2trio's DDL adds the column, and the row reads as version 1.
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    await run_sql(
        dsn,
        f'create schema "{schema}"; set search_path to "{schema}"; {SEED_DDL.read_text()}; '
        "insert into a2_events (session_id, idx, event_type, payload, event_id, created_at)"
        " values ('orders\x1fs1', 1, 'ordered', '{\"item\": \"pen\"}', 'seed-1', 5)",
    )
    store = postgres(dsn, schema=schema)
    try:
        async with store, a2trio.Server(current, store=store, run_handlers=False) as server:
            [row] = await store.read(server.key("s1"))
            assert (row.id, row.version) == ("seed-1", None)
            await server.session("s1").append(current.event("ordered", Ordered("INK", 2)))
            history = await server.session("s1").history()
            assert [e.payload for e in history] == [Ordered("PEN", 1), Ordered("INK", 2)]
            assert [r.version for r in await store.read(server.key("s1"))] == [None, 3]
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


# -- scheduled appends --------------------------------------------------------------


class Queued:
    """A scheduler that only keeps what it is given (delivered by the test)."""

    def __init__(self) -> None:
        self.tasks: list[SchedulerTask] = []

    async def schedule(self, task: SchedulerTask) -> None:
        self.tasks.append(task)

    def bind(self, server: SchedulerTarget) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


async def test_a_delayed_append_carries_its_version_and_is_upcast_when_delivered() -> None:
    queued = Queued()
    async with (
        a2trio.Server(first, store=a2trio.stores.memory(), scheduler=queued) as old,
        a2trio.Server(current, store=old.store, scheduler=queued) as new,
    ):
        # Queued by the first release, due after the second is deployed.
        await old.session("s1").schedule("before", "1h", first.event("ordered", OrderedV1("pen")))
        await new.session("s1").schedule(
            "later",
            "1h",
            current.event("ordered", Ordered("INK", 2)),
            current.event("shipped", Shipped("INK")),
        )
        assert [type(task) for task in queued.tasks] == [AppendTask, AppendTask]
        # An unversioned event encodes as the seed's (no version key); the
        # current release's ordered event names its version.
        encoded = [msgspec.json.decode(msgspec.json.encode(t)) for t in queued.tasks]
        assert [sorted(e) for e in encoded[0]["events"]] == [["id", "payload", "type"]]
        assert [e.get("version") for e in encoded[1]["events"]] == [3, None]
        for task in queued.tasks:
            await new.deliver(task_decoder().decode(msgspec.json.encode(task)))
        history = await new.session("s1").history()
        assert [e.payload for e in history] == [
            Ordered("PEN", 1),
            Ordered("INK", 2),
            Shipped("INK"),
        ]
        rows = await new.store.read(new.key("s1"))
        assert [row.version for row in rows] == [3, 3, None]


async def test_a_delayed_append_that_cannot_be_upcast_names_the_scheduled_event() -> None:
    async with a2trio.Server(current, store=a2trio.stores.memory()) as server:
        task = AppendTask(
            "t1", "orders", "s1", 0, [ScheduledEvent("e1", "ordered", {"item": "cursed"})]
        )
        with pytest.raises(a2trio.UpcastError) as caught:
            await server.deliver(task)
        assert (caught.value.session_id, caught.value.index, caught.value.version) == (
            "s1",
            None,
            1,
        )
        assert str(caught.value).startswith("scheduled event 'e1' of session 's1' on contract")
        assert await server.session("s1").history() == []


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_an_append_in_the_apps_transaction_stores_the_current_version(backend: str) -> None:
    async with _store(backend) as store:
        await written_by_the_first_version(store, "s1", "pen")
        async with a2trio.Server(current, store=store, run_handlers=False) as server:
            async with server.transaction() as tx:
                await server.session("s1").append(
                    current.event("ordered", Ordered("INK", 2)), transaction=tx
                )
            rows = await store.read(server.key("s1"))
            assert [row.version for row in rows] == [None, 3]
            history = await server.session("s1").history()
            assert [e.payload for e in history] == [Ordered("PEN", 1), Ordered("INK", 2)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_actor_decides_on_a_state_folded_from_upcast_events(backend: str) -> None:
    async def order(state: Totals, input: Ordered) -> a2trio.AppendInput:
        if input.sku in state.skus:
            raise a2trio.Refused(f"{input.sku} is ordered already")
        return cart.event("ordered", input)

    cart = a2trio.actor(
        "orders",
        events={"ordered": Ordered, "shipped": Shipped},
        state=totals,
        calls={"order": a2trio.call(Ordered, order)},
        versions={"ordered": [OrderedV1, OrderedV2, Ordered]},
        upcasters={"ordered": [v1_to_v2, v2_to_v3]},
    )
    async with _store(backend) as store:
        await written_by_the_first_version(store, "c1", "pen")
        async with a2trio.Server(cart, store=store) as server:
            with pytest.raises(a2trio.Refused, match="PEN is ordered already"):
                await server.actor("c1").call("order", {"sku": "PEN", "quantity": 1})
            answer = await server.actor("c1").call("order", {"sku": "INK", "quantity": 2})
            assert (answer.state.skus, answer.state.quantity, answer.index) == (
                ["PEN", "INK"],
                3,
                2,
            )
