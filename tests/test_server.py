"""Sessions at the Python surface: appends, reads, state, and bad input that writes nothing."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
import trio

import a2trio
import a2trio.engine.session
from a2trio.stores import memory

from .apps import Note, Ordered, Shipped, orders


def counter() -> a2trio.Reducer[int]:
    return a2trio.Reducer("count", 0, lambda state, event: state + 1)


class Totals(msgspec.Struct):
    items: list[str] = msgspec.field(default_factory=list)


def totals() -> a2trio.Reducer[Totals]:
    def fold(state: Totals, event: a2trio.Event[Any]) -> Totals:
        if event.type == "ordered":
            state.items.append(event.payload.item)
        return state

    return a2trio.Reducer("totals", Totals(), fold)


async def test_append_returns_typed_events_with_contiguous_indexes() -> None:
    async with a2trio.Server(orders, store=memory()) as server:
        session = server.session("s1")
        first = await session.append(
            orders.event("ordered", {"item": "book", "qty": 2}),
            orders.event("note", Note("hi"), id="client-1"),
        )
        assert [(e.index, e.type) for e in first] == [(1, "ordered"), (2, "note")]
        assert first[0].payload == Ordered("book", 2)
        assert first[1].id == "client-1"
        assert first[0].session_id == "s1"
        assert first[0].created_at.tzinfo is not None
        again = await session.append(orders.event("note", Note("hi"), id="client-1"))
        assert again == [first[1]]  # idempotent replay
        assert len(await session.history()) == 2


async def test_bad_input_raises_the_documented_error_and_writes_nothing() -> None:
    async with a2trio.Server(orders, store=memory()) as server:
        session = server.session("s1")
        await session.append(orders.event("note", Note("keep"), id="n1"))
        cases: list[tuple[Any, type[BaseException], str]] = [
            (lambda: orders.event("nope", {}), a2trio.A2Error, "UNKNOWN_EVENT_TYPE"),
            (
                lambda: session.append(a2trio.AppendInput("ordered", {"item": 3})),
                a2trio.A2Error,
                "INVALID_PAYLOAD",
            ),
            (
                lambda: session.append(
                    orders.event("note", Note("fresh")), orders.event("note", Note("x"), id="n1")
                ),
                a2trio.A2Error,
                "PARTIAL_DUPLICATE_BATCH",
            ),
            (lambda: session.append(), TypeError, "at least one event"),
            (lambda: session.append(cast("Any", {"type": "note"})), TypeError, "contract.event"),
        ]
        for make, error, text in cases:
            with pytest.raises(error, match=text):
                result = make()
                if hasattr(result, "__await__"):
                    await result
        assert [e.id for e in await session.history()] == ["n1"]


def test_invalid_payload_details_carry_msgspecs_path() -> None:
    with pytest.raises(a2trio.A2Error) as info:
        orders.event("ordered", {"item": "book", "qty": "two"})
    assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
    assert info.value.details == {"message": "Expected `int`, got `str`", "path": "$.qty"}


def test_event_accepts_a_struct_instance_or_a_dict() -> None:
    assert orders.event("shipped", Shipped("x")) == orders.event("shipped", {"item": "x"})
    with pytest.raises(TypeError, match="event id must be a non-empty string"):
        orders.event("shipped", Shipped("x"), id="")


@pytest.mark.parametrize(
    ("session_id", "error"),
    [("", TypeError), (3, TypeError), ("a\x1fb", ValueError)],
)
def test_bad_session_ids_are_refused(session_id: Any, error: type[Exception]) -> None:
    server = a2trio.Server(orders, store=memory())
    with pytest.raises(error, match="session id"):
        server.session(session_id)


async def test_history_bounds() -> None:
    async with a2trio.Server(orders, store=memory()) as server:
        session = server.session("s1")
        await session.append(*(orders.event("note", Note(str(n))) for n in range(5)))
        assert [e.index for e in await session.history(gte=2, lte=4)] == [2, 3, 4]
        assert [e.index for e in await session.history(gte=4)] == [4, 5]
        assert [e.index for e in await session.history(lte=2)] == [1, 2]
        assert await session.history(lte=0) == []
        assert await session.history(gte=9) == []
        cases: list[tuple[dict[str, Any], str]] = [
            ({"gte": -1}, "gte must be a non-negative integer"),
            ({"lte": 1.5}, "lte must be a non-negative integer"),
            ({"gte": True}, "gte must be a non-negative integer"),
            ({"gte": 3, "lte": 2}, r"gte \(3\) must be less than or equal to lte \(2\)"),
        ]
        for bounds, text in cases:
            with pytest.raises(ValueError, match=text):
                await session.history(**bounds)


async def test_state_folds_caches_a_snapshot_and_reads_only_the_tail() -> None:
    store = memory()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("s1")
        await session.append(
            orders.event("ordered", Ordered("a")), orders.event("ordered", Ordered("b"))
        )
        assert await session.state(counter()) == (2, 2)
        state, index = await session.state(totals())
        assert (state.items, index) == (["a", "b"], 2)
        await server.settle()
        snaps = await store.inspect.list_snapshots(server.key("s1"))
        assert [(s.reducer_name, s.index) for s in snaps] == [("count", 2), ("totals", 2)]
        await session.append(orders.event("ordered", Ordered("c")))
        read = await store.read_state(server.key("s1"), "totals")
        assert read.snapshot is not None
        assert read.snapshot.index == 2
        assert [e.index for e in read.events] == [3]
        state, index = await session.state(totals())
        assert (state.items, index) == (["a", "b", "c"], 3)
        # The reducer's initial state is never mutated across folds.
        assert totals().initial == Totals()


async def test_a_snapshot_rejected_by_state_type_refolds_from_the_log() -> None:
    store = memory()
    async with a2trio.Server(orders, store=store) as server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await store.put_snapshot(server.key("s1"), "totals", 1, {"items": "not a list"})
        state, index = await session.state(totals())
        assert (state.items, index) == (["a"], 1)


def test_default_store_follows_a2_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A2_ENV", "production")
    with pytest.raises(a2trio.A2Error) as info:
        a2trio.Server(orders)
    assert info.value.code == a2trio.ErrorCode.STORE_NOT_CONFIGURED
    monkeypatch.setenv("A2_ENV", "test")
    assert isinstance(a2trio.Server(orders).store, a2trio.stores.MemoryStore)
    monkeypatch.setenv("A2_STORE", "memory:")
    monkeypatch.setenv("A2_ENV", "production")
    assert isinstance(a2trio.Server(orders).store, a2trio.stores.MemoryStore)


def test_presence_options_need_a_presence_contract() -> None:
    with pytest.raises(TypeError, match="declares presence fields"):
        a2trio.Server(orders, store=memory(), presence_ttl_ms=1000)


async def test_lifecycle_misuse_has_plain_messages() -> None:
    store = memory()
    server = a2trio.Server(orders, store=store, handlers={"ordered": _noop})
    with pytest.raises(RuntimeError, match="not open"):
        await server.session("s").append(orders.event("ordered", Ordered("a")))
    assert await store.read(server.key("s")) == []  # refused before writing
    async with server:
        with pytest.raises(RuntimeError, match="already open"):
            await server.__aenter__()
    with pytest.raises(RuntimeError, match="cannot reopen"):
        async with server:
            pass


async def _noop(ctx: a2trio.HandlerContext[Any]) -> None:
    return None


async def test_stream_catches_up_then_follows() -> None:
    async with a2trio.Server(orders, store=memory()) as server:
        session = server.session("s1")
        await session.append(orders.event("note", Note("1")), orders.event("note", Note("2")))
        seen: list[int] = []
        async with session.stream(start_after=1) as feed:
            first = await feed.receive()
            seen.append(first.index)
            await session.append(orders.event("note", Note("3")))
            with trio.fail_after(1):
                seen.append((await feed.receive()).index)
        assert seen == [2, 3]
        assert server.store.feed_statistics().listeners == 0  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="start_after"):
            async with session.stream(start_after=-1):
                pass


async def test_validate_push_sees_pushed_events_before_their_schema() -> None:
    seen: list[a2trio.PushValidation] = []

    def refuse_bob(validation: a2trio.PushValidation) -> bool:
        seen.append(validation)
        return validation.session_id != "bob"

    async with a2trio.Server(orders, store=memory(), validate_push=refuse_bob) as server:
        pushed = a2trio.PushedEvent("note", {"text": "hi"})
        [event] = await server.session("alice").append(pushed)
        assert event.payload == Note("hi")
        with pytest.raises(a2trio.A2Error) as info:
            await server.session("bob").append(pushed)
        assert info.value.code == a2trio.ErrorCode.FORBIDDEN
        assert await server.session("bob").history() == []
        # Refusal comes before schema validation, as in the seed.
        with pytest.raises(a2trio.A2Error, match="FORBIDDEN"):
            await server.session("bob").append(a2trio.PushedEvent("nope", {}))
        assert [v.session_id for v in seen] == ["alice", "bob", "bob"]


async def test_an_error_in_the_server_block_propagates_unwrapped() -> None:
    with pytest.raises(KeyError):
        async with a2trio.Server(orders, store=memory()):
            raise KeyError("mine")
    with pytest.raises(KeyError):
        async with a2trio.Server(orders, store=memory()) as server:
            async with server.session("s").stream() as feed:
                assert feed is not None
                raise KeyError("mine")


async def test_asyncio_loop_lets_handlers_call_asyncio_libraries() -> None:
    import asyncio

    import trio_asyncio

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        item = await trio_asyncio.aio_as_trio(_asyncio_lookup)(ctx.event.payload.item)
        return orders.event("shipped", Shipped(item))

    async def _asyncio_lookup(item: str) -> str:
        await asyncio.sleep(0)
        return item.upper()

    server = a2trio.Server(orders, store=memory(), handlers={"ordered": ship}, asyncio_loop=True)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await server.settle()
        assert [e.payload for e in await session.history()][-1] == Shipped("BOOK")


async def test_a_handler_session_reads_like_a_session_and_appends_by_name() -> None:
    """A handler's session is not a ``Session`` (its ``append`` takes a name
    first) but shares every read with it."""
    seen: list[object] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.Returned:
        session = ctx.session
        seen.append(isinstance(session, a2trio.Session))
        seen.append([e.type for e in await session.history()])
        seen.append(await session.state(counter()))
        [note] = await session.append("progress", orders.event("note", Note("packing")))
        seen.append(note.id == a2trio.ids.handler_event_id(ctx.event.id, "progress", 0))
        return None

    server = a2trio.Server(orders, store=memory(), handlers={"ordered": ship})
    async with server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await server.settle()
    assert seen == [False, ["ordered"], (1, 1), True]


async def test_history_reads_are_capped_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(a2trio.engine.session, "MAX_HISTORY_EVENTS", 5)
    async with a2trio.Server(orders, store=memory()) as server:
        session = server.session("s1")
        await session.append(*(orders.event("note", Note(str(n))) for n in range(7)))
        assert [e.index for e in await session.history(gte=1, lte=5)] == [1, 2, 3, 4, 5]
        assert [e.index for e in await session.history(gte=3)] == [3, 4, 5, 6, 7]
        for bounds, span in [({}, "gte=1"), ({"gte": 2}, "gte=2"), ({"lte": 6}, "gte=1, lte=6")]:
            with pytest.raises(ValueError, match=r"^history reads at most 5 events") as info:
                await session.history(**bounds)
            assert str(info.value) == (
                f"history reads at most 5 events at once and {span} holds more: "
                "page through it with gte and lte"
            )
