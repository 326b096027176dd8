"""The drain engine under the autojump clock: leases, failures, lanes, abort_on.

Each scenario reads as a timeline: "handler sleeps 45 s, ttl 30 s, completes at
t=45 with attempt 1".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores import memory
from a2trio.stores.base import ClaimRef, RenewResult
from a2trio.stores.memory import MemoryStore

from .apps import Cancelled, Note, Ordered, Shipped, orders

TTL = a2trio.Timings().claim_ttl_s


def new_store() -> MemoryStore:
    return memory(clock=a2trio.TrioClock())


class FailingRenewals(MemoryStore):
    """A memory store whose renewals fail while ``failing`` is set."""

    failing = True

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        if self.failing:
            await trio.lowlevel.checkpoint()
            raise a2trio.A2Error("STORE_UNAVAILABLE", "renewals are down")
        return await super().renew_claims(
            session_id, holder=holder, claims=claims, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms
        )


async def test_handler_outliving_ttl_keeps_claim_and_completes_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append((ctx.attempt, trio.current_time()))
        await trio.sleep(45)
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    server = a2trio.Server(orders, store=new_store(), handlers={"ordered": ship})
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await server.settle()
        assert trio.current_time() == 45
        assert runs == [(1, 0.0)]
        assert [e.type for e in await session.history()] == ["ordered", "shipped"]
        assert (await server.drain("s1")).settled


async def test_failed_renewals_lapse_the_lease_and_a_later_drain_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[int, float]] = []
    cancelled_at: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append((ctx.attempt, trio.current_time()))
        try:
            await trio.sleep(45 if ctx.attempt == 1 else 5)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            raise
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    store = FailingRenewals(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store, handlers={"ordered": ship})
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await server.settle()
        # ttl 30 s: the lease scope's deadline cancels the handler exactly then;
        # the claim lapsed in the store too, so the drain re-claims: attempt 2.
        assert cancelled_at == [TTL]
        assert runs == [(1, 0.0), (2, TTL)]
        assert trio.current_time() == TTL + 5
        [row, _] = await store.read(server.key("s1"))
        assert row.failure_count == 0  # surrendered: no failure spent
        assert row.processed_by_attempt == 2
        # The first attempt's late completion is fenced.
        late = await store.complete_attempt(server.key("s1"), index=1, attempt=1, events=[])
        assert late.outcome == "superseded"
        assert [e.type for e in await session.history()] == ["ordered", "shipped"]


async def test_always_failing_handler_dead_letters_after_ten_and_blocks_its_lane(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[int] = []
    ran: list[str] = []

    async def explode(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.event.payload.item == "bad":
            attempts.append(ctx.attempt)
            raise RuntimeError("boom")
        ran.append(ctx.event.payload.item)

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        ran.append(ctx.event.payload.text)

    store = new_store()
    server = a2trio.Server(
        orders,
        store=store,
        handlers={"ordered": a2trio.handler(explode, lane="fulfil"), "note": note},
    )
    async with server:
        session = server.session("s1")
        await session.append(
            orders.event("ordered", Ordered("bad")),
            orders.event("ordered", Ordered("next-in-lane")),
        )
        await server.settle()
        results = [await server.drain("s1") for _ in range(9)]
        assert attempts == list(range(1, 11))
        assert all(not r.settled and r.outcome == "stalled" for r in results)
        rows = await store.read(server.key("s1"))
        assert rows[0].failed_at_ms is not None
        assert rows[0].failure_count == 10
        assert "boom" in (rows[0].last_error or "")
        await session.append(orders.event("note", Note("unlaned runs")))
        await server.settle()
        assert ran == ["unlaned runs"]
        assert attempts == list(range(1, 11))  # dead letters are not retried


async def test_lanes_keep_order_while_other_lanes_and_unlaned_events_overlap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: dict[str, list[int]] = {}
    running: dict[str, int] = {}
    overlap: list[int] = []
    active_unlaned = 0

    async def work(ctx: a2trio.HandlerContext[Ordered]) -> None:
        lane = ctx.event.payload.item
        started.setdefault(lane, []).append(ctx.event.index)
        running[lane] = running.get(lane, 0) + 1
        assert running[lane] == 1, f"two events of lane {lane} ran at once"
        await trio.sleep(1)
        running[lane] -= 1

    async def unlaned(ctx: a2trio.HandlerContext[Note]) -> None:
        nonlocal active_unlaned
        active_unlaned += 1
        overlap.append(active_unlaned)
        await trio.sleep(1)
        active_unlaned -= 1

    server = a2trio.Server(
        orders,
        store=new_store(),
        handlers={
            "ordered": a2trio.handler(work, lane=lambda sid, ev: ev.payload.item),
            "note": unlaned,
        },
    )
    async with server:
        session = server.session("s1")
        async with trio.open_nursery() as nursery:
            for n in range(100):
                nursery.start_soon(
                    session.append, orders.event("ordered", Ordered(f"lane{n % 5}", n))
                )
            for n in range(5):
                nursery.start_soon(session.append, orders.event("note", Note(str(n))))
        await server.settle()
    assert sorted(started) == [f"lane{n}" for n in range(5)]
    for lane, order in started.items():
        assert order == sorted(order), f"{lane} ran out of log order"
        assert len(order) == 20
    assert max(overlap) > 1  # unlaned events ran concurrently
    assert trio.current_time() <= 21  # lanes ran side by side, one event a second each


async def test_a_handler_without_abort_on_still_has_an_aborted_event_never_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[bool, bool]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        aborted = ctx.aborted
        await trio.sleep(10)
        seen.append((aborted.is_set(), ctx.aborted is aborted))

    server = a2trio.Server(orders, store=new_store(), handlers={"ordered": ship})
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await trio.sleep(1)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await server.settle()
    assert seen == [(False, True)]


async def test_abort_on_list_and_predicate_cancel_only_the_matching_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcome: dict[str, str] = {}

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            outcome[ctx.event.payload.item] = f"aborted@{trio.current_time()}"
            raise
        outcome[ctx.event.payload.item] = "finished"
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    def same_item(
        event: a2trio.Event[Any], trigger: a2trio.Event[Any], context: dict[str, int]
    ) -> bool:
        assert context == {"attempt": 1}
        return bool(event.payload.item == trigger.payload.item)

    store = new_store()
    server = a2trio.Server(
        orders,
        store=store,
        handlers={"ordered": a2trio.handler(ship, abort_on={"cancelled": same_item})},
    )
    async with server:
        session = server.session("s1")
        await session.append(
            orders.event("ordered", Ordered("a")), orders.event("ordered", Ordered("b"))
        )
        await trio.sleep(10)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await server.settle()
    assert outcome == {"a": "aborted@10.0", "b": "finished"}
    history = [(e.type, e.payload) for e in await session.history()]
    assert history == [
        ("ordered", Ordered("a")),
        ("ordered", Ordered("b")),
        ("cancelled", Cancelled("a")),
        ("shipped", Shipped("b")),
    ]
    rows = await store.read(server.key("s1"))
    assert rows[0].processed_at_ms is not None  # the aborted attempt completed
    assert rows[0].returned_event_ids == []


async def test_abort_event_appended_before_the_handler_started_still_aborts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[str] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        started.append(ctx.event.payload.item)
        await trio.sleep(100)
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    store = new_store()
    # No background drain: append both, then drain by hand.
    server = a2trio.Server(
        orders, store=store, handlers={"ordered": a2trio.handler(ship, abort_on=["cancelled"])}
    )
    await store.append(
        server.key("s1"),
        [
            a2trio.stores.base.AppendEvent("ordered", {"item": "a", "qty": 1}),
            a2trio.stores.base.AppendEvent("cancelled", {"item": "a"}, settled=True),
        ],
    )
    result = await server.drain("s1")
    assert result.settled
    assert started == ["a"]
    assert trio.current_time() == 0  # aborted at once, not after 100 s
    assert [e.type for e in await server.session("s1").history()] == ["ordered", "cancelled"]


async def test_shielded_handler_sees_aborted_and_returns_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        with trio.CancelScope(shield=True):
            await ctx.aborted.wait()
        return orders.event("note", Note("cleaned up after abort"))

    server = a2trio.Server(
        orders,
        store=new_store(),
        handlers={"ordered": a2trio.handler(ship, abort_on=["cancelled"])},
    )
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await trio.sleep(3)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await server.settle()
        assert [e.type for e in await session.history()] == ["ordered", "cancelled", "note"]


async def test_retry_after_surrender_keeps_handler_and_returned_ids(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> list[a2trio.AppendInput]:
        await ctx.session.append("progress", orders.event("note", Note("started")))
        if ctx.attempt == 1:
            await trio.sleep(1000)  # outlives the failing renewals
        return [orders.event("shipped", Shipped("a")), orders.event("note", Note("done"))]

    store = FailingRenewals(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store, handlers={"ordered": ship})
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await server.settle()
        store.failing = False
        assert (await server.drain("s1")).settled
        history = await session.history()
    assert [e.type for e in history] == ["ordered", "note", "shipped", "note"]
    assert len({e.id for e in history}) == 4
    assert history[1].id == a2trio.ids.handler_event_id(history[0].id, "progress", 0)
    assert history[2].id == a2trio.ids.returned_event_id(history[0].id, 0)


async def test_handler_append_from_a_superseded_attempt_is_fenced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[a2trio.A2Error] = []
    store = FailingRenewals(clock=a2trio.TrioClock())

    async def slow(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.attempt == 1:
            # Another holder re-claims after our (unrenewed) claim expires.
            with trio.CancelScope(shield=True):
                await trio.sleep(TTL + 1)
                await store.claim_available(server.key("s1"), holder="x", ttl_ms=1)
                try:
                    await ctx.session.append("late", orders.event("note", Note("zombie")))
                except a2trio.A2Error as exc:
                    errors.append(exc)

    server = a2trio.Server(orders, store=store, handlers={"ordered": slow})
    async with server:
        await server.session("s1").append(orders.event("ordered", Ordered("a")))
        await server.settle()
    assert [e.code for e in errors] == [a2trio.ErrorCode.SUPERSEDED_ATTEMPT]
    assert [e.type for e in await server.session("s1").history()] == ["ordered"]


async def test_server_exit_mid_handler_leaves_event_pending_for_a_new_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        runs.append(ctx.attempt)
        await trio.sleep(5)
        return orders.event("shipped", Shipped("a"))

    store = new_store()
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}) as first:
        await first.session("s1").append(orders.event("ordered", Ordered("a")))
        await trio.sleep(1)  # mid-handler; leaving the block is a crash
    second = a2trio.Server(orders, store=store, handlers={"ordered": ship})
    async with second:
        result = await second.drain("s1")
        assert result.outcome == "busy"  # the dead holder's claim is still live
        await trio.sleep_until(TTL)
        assert (await second.drain("s1")).settled
    assert runs == [1, 2]
    assert [e.type for e in await second.session("s1").history()] == ["ordered", "shipped"]


async def test_returned_event_with_bad_payload_is_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def bad(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        return a2trio.AppendInput("shipped", {"item": 3})

    store = new_store()
    server = a2trio.Server(orders, store=store, handlers={"ordered": bad})
    async with server:
        await server.session("s1").append(orders.event("ordered", Ordered("a")))
        await server.settle()
    [row] = await store.read(server.key("s1"))
    assert row.failure_count == 1
    assert "INVALID_PAYLOAD" in (row.last_error or "")


def test_handler_registration_errors_name_the_bad_value() -> None:
    async def noop(ctx: a2trio.HandlerContext[Any]) -> None:
        return None

    with pytest.raises(TypeError, match="no event type 'nope'"):
        a2trio.Server(orders, store=memory(), handlers={"nope": noop})
    with pytest.raises(TypeError, match="cannot abort on it"):
        a2trio.Server(
            orders, store=memory(), handlers={"ordered": a2trio.handler(noop, abort_on=["x"])}
        )
    with pytest.raises(TypeError, match="lane must be a non-empty string"):
        a2trio.handler(noop, lane="")
    with pytest.raises(TypeError, match="not the string"):
        a2trio.handler(noop, abort_on="cancelled")


async def test_a_store_failure_reaches_drain_callers_as_a_plain_a2error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Down(MemoryStore):
        async def claim_available(self, session_id: str, **kwargs: Any) -> Any:
            await trio.lowlevel.checkpoint()
            raise a2trio.A2Error("STORE_UNAVAILABLE", "down")

    server = a2trio.Server(orders, store=Down(clock=a2trio.TrioClock()), handlers={})
    with pytest.raises(a2trio.A2Error, match="STORE_UNAVAILABLE"):
        await server.drain("s1")
