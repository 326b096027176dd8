"""``ids=`` on every store: one :class:`~a2trio.ids.IdSource`, deterministic ids.

The conformance check (``check_generated_ids_come_from_the_id_source``) holds
every backend to it; these tests cover the seam around it: the factories'
spelling, the default, a factory that does not take ``ids``, and the engine.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from a2trio import stores
from a2trio.clock import Clock
from a2trio.ids import IdSource, random_id
from a2trio.stores.base import AppendEvent, Store
from a2trio.stores.conformance import (
    CapabilityMissing,
    capabilities,
    check_generated_ids_come_from_the_id_source,
)
from a2trio.testing import AppFactory, TrioClock
from tests.apps import Ordered, Shipped, orders


def counting(prefix: str) -> IdSource:
    """The docstring's recipe: ``prefix-1``, ``prefix-2``, ..."""
    return map(f"{prefix}-{{}}".format, itertools.count(1)).__next__


def test_the_default_and_any_callable_are_id_sources() -> None:
    assert stores.IdSource is IdSource
    source: IdSource = random_id
    assert source() != source()
    ids = counting("e")
    assert [ids(), ids()] == ["e-1", "e-2"]


def test_random_ids_are_version_4_uuids_as_uuid_writes_them() -> None:
    drawn = [random_id() for _ in range(2_000)]
    assert len(set(drawn)) == len(drawn)
    for text in drawn:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text
    # Every variant digit turns up: the two random bits are not dropped.
    assert {text[19] for text in drawn} == set("89ab")


async def test_the_memory_and_sqlite_factories_take_ids(tmp_path: Path) -> None:
    async with stores.memory(ids=counting("m")) as store:
        appended = await store.append("s", [AppendEvent("note", None)] * 2)
        assert [e.id for e in appended.events] == ["m-1", "m-2"]
    async with stores.sqlite(str(tmp_path / "ids.db"), ids=counting("q")) as store:
        appended = await store.append("s", [AppendEvent("note", None)] * 2)
        assert [e.id for e in appended.events] == ["q-1", "q-2"]


async def test_without_ids_the_stores_generate_random_uuids() -> None:
    async with stores.memory() as store:
        [first, second] = (await store.append("s", [AppendEvent("note", None)] * 2)).events
    assert len(first.id) == len(random_id()) == 36
    assert first.id != second.id


@asynccontextmanager
async def clock_only(clock: Clock) -> AsyncIterator[Store]:
    """A third-party factory written before ``ids=``."""
    async with stores.memory(clock=clock) as store:
        yield store


async def test_a_factory_without_ids_lacks_the_capability_and_skips_the_check() -> None:
    assert "ids" not in await capabilities(clock_only)
    with pytest.raises(CapabilityMissing, match="ids"):
        await check_generated_ids_come_from_the_id_source(clock_only)


async def test_a_factory_taking_ids_has_the_capability() -> None:
    @asynccontextmanager
    async def with_options(clock: Clock, **options: Any) -> AsyncIterator[Store]:
        async with stores.memory(clock=clock, **options) as store:
            yield store

    assert "ids" in await capabilities(with_options)
    await check_generated_ids_come_from_the_id_source(with_options)


async def test_a_factory_whose_signature_cannot_be_read_lacks_ids() -> None:
    class Opaque:
        """A callable ``inspect.signature`` gives up on."""

        __signature__ = "not a signature"

        def __call__(self, clock: Clock) -> Any:
            return clock_only(clock)

    assert await capabilities(Opaque()) == await capabilities(clock_only)
    assert "ids" not in await capabilities(Opaque())


async def ship(ctx: Any) -> Any:
    return [orders.event("shipped", Shipped(ctx.event.payload.item))]


async def test_the_engine_keeps_its_derived_ids_and_draws_only_client_appends(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    """A client append without an id takes the store's next id; what a handler
    returns keeps its derived id (a retry must replay it), untouched by ``ids``."""
    store = stores.memory(clock=TrioClock(), ids=counting("client"))
    app = await a2_app(orders, store=store, handlers={"ordered": ship})
    s = app.session("order-1")
    [ordered] = await s.append(orders.event("ordered", Ordered("lamp")))
    assert ordered.id == "client-1"
    await app.settle()
    [first, shipped] = await app.assert_log(s, ["ordered", "shipped"])
    assert first.id == "client-1"
    assert not shipped.id.startswith("client-")
    [again] = await s.append(orders.event("ordered", Ordered("desk")))
    assert again.id == "client-2"


def test_call_event_ids_carry_their_batch_size_after_the_first() -> None:
    from a2trio.ids import call_event_count, call_event_id

    first = call_event_id("vault", "alice", "m", 0, 3)
    assert first == call_event_id("vault", "alice", "m", 0, 1), "the first id has no size"
    second = call_event_id("vault", "alice", "m", 1, 3)
    assert second.endswith("/3")
    assert call_event_count("vault", "alice", "m", second) == 3
    for other in (
        call_event_id("vault", "alice", "other", 1, 3),
        second.replace("/3", "/4"),
        second.replace("/3", "/03"),
        second.replace("/3", "/1"),
        first,
        "plain-id",
    ):
        assert call_event_count("vault", "alice", "m", other) is None, other
