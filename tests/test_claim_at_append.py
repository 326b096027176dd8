"""Claim at append: an inline append claims for the session's drain in its own
transaction, and the drain runs what it was handed (memory store, autojump).

Timelines are in seconds of Trio time; "claims" counts the drain's own
``claim_available`` calls, which claim at append makes unnecessary.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine.context import Engine
from a2trio.engine.writes import Writes
from a2trio.stores.base import AppendEvent, AppendResult, ClaimRequest, ClaimResult
from a2trio.stores.memory import MemoryStore
from a2trio.testing import RecordingTelemetry

from .apps import Note, Ordered, orders


class CountingStore(MemoryStore):
    """Counts the drains' own claims; appends that claim can be slowed down
    (a long round trip) or made to fail after it."""

    def __init__(self) -> None:
        super().__init__(clock=a2trio.TrioClock())
        self.claims = 0
        self.append_delay = 0.0
        self.append_fails = False

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        self.claims += 1
        return await super().claim_available(
            session_id,
            holder=holder,
            ttl_ms=ttl_ms,
            expires_at_ms=expires_at_ms,
            exclude=exclude,
            limit=limit,
        )

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        if claim is not None and self.append_delay:
            await trio.sleep(self.append_delay)
        if claim is not None and self.append_fails:
            raise a2trio.A2Error("STORE_UNAVAILABLE", "the append's reply was lost")
        return await super().append(session_id, events, claim=claim, expected_index=expected_index)


def drains(telemetry: RecordingTelemetry) -> int:
    return sum(1 for span in telemetry.spans if span.name == "a2.drain")


async def test_appended_events_run_without_a_claim_by_the_drain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = CountingStore()
    telemetry = RecordingTelemetry()
    started: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append((ctx.event.payload.item, trio.current_time()))
        await trio.sleep(10)

    server = a2trio.Server(orders, store=store, handlers={"ordered": ship}, telemetry=telemetry)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await trio.sleep(1)
        # Into the running drain: handed over, not claimed again.
        await session.append(orders.event("ordered", Ordered("b")))
        await server.settle()
    assert started == [("a", 0.0), ("b", 1.0)]
    assert store.claims == 0
    assert drains(telemetry) == 1


async def test_a_drain_waits_for_an_append_claiming_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # "a" finishes at t=1 while the append of "b" is in flight until t=5: the
    # drain neither ends nor claims against its own fresh claim; it runs "b"
    # when the append hands it over.
    store = CountingStore()
    telemetry = RecordingTelemetry()
    started: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append((ctx.event.payload.item, trio.current_time()))
        await trio.sleep(1)

    server = a2trio.Server(orders, store=store, handlers={"ordered": ship}, telemetry=telemetry)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        store.append_delay = 5
        await session.append(orders.event("ordered", Ordered("b")))
        await server.settle()
    assert started == [("a", 0.0), ("b", 5.0)]
    assert store.claims == 0
    assert drains(telemetry) == 1


async def test_a_failed_append_releases_the_drain_waiting_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = CountingStore()
    telemetry = RecordingTelemetry()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(1)

    server = a2trio.Server(orders, store=store, handlers={"ordered": ship}, telemetry=telemetry)
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        store.append_delay, store.append_fails = 5, True
        with pytest.raises(a2trio.A2Error, match="reply was lost"):
            await session.append(orders.event("ordered", Ordered("b")))
        with trio.fail_after(60):
            await server.settle()
        # The drain waited for the answer, then ended: nothing was written and
        # "a"'s completion had said the session was drained.
        assert trio.current_time() == 5
        assert store.claims == 0
    assert drains(telemetry) == 1


async def test_an_append_does_not_claim_what_its_drain_excluded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # "bad" fails at t=0; this drain excludes it (a later drain retries it).
    # "slow" keeps the drain alive while the note is appended at t=1: the
    # append claims for the drain, without "bad".
    store = CountingStore()
    attempts: list[tuple[str, int, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.event.payload.item, ctx.attempt, trio.current_time()))
        if ctx.event.payload.item == "bad" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        if ctx.event.payload.item == "slow":
            await trio.sleep(10)

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        attempts.append(("note", ctx.attempt, trio.current_time()))

    server = a2trio.Server(orders, store=store, handlers={"ordered": ship, "note": note})
    async with server:
        session = server.session("s1")
        await session.append(
            orders.event("ordered", Ordered("slow")), orders.event("ordered", Ordered("bad"))
        )
        await trio.sleep(1)
        await session.append(orders.event("note", Note("hi")))
        await trio.sleep(1)
        assert sorted(attempts[:2]) == [("bad", 1, 0.0), ("slow", 1, 0.0)]
        assert attempts[2:] == [("note", 1, 1.0)]
        await server.settle()
        # The drain ended stalled; the next one retries "bad".
        assert (await server.drain("s1")).settled
    assert attempts[-1][:2] == ("bad", 2)


async def test_a_drain_woken_to_claim_still_claims_when_handed_events_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A wake-up (another process's append, as the listener reports it) starts
    # a drain, and in the same scheduler pass, before that drain runs, an
    # append hands it an event it claimed. The drain must still claim what the
    # wake-up was for, rather than take the handed-over event as all there is.
    store = CountingStore()
    started: list[tuple[str, float]] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.append((ctx.event.payload.item, trio.current_time()))
        await trio.sleep(10)

    # The engine's parts, wired as a server wires them, driven directly.
    engine = Engine(
        orders,
        store,
        lanes={"ordered": None},
        scheduler=None,
        telemetry=a2trio.NOOP_TELEMETRY,
        validate_push=None,
        presence_ttl_ms=60_000,
        timings=a2trio.DEFAULT_TIMINGS,
        clock=store.clock,
        run_handlers=True,
    )
    drains = Writes(engine, {"ordered": a2trio.handler(ship)}, max_handlers=256).drains
    async with store, trio.open_nursery() as nursery:
        engine.background.attach(nursery)
        key = engine.key("s1")
        await store.append(key, [AppendEvent("ordered", {"item": "remote", "qty": 1})])
        local = await store.append(
            key,
            [AppendEvent("ordered", {"item": "local", "qty": 1})],
            claim=ClaimRequest("h", 30_000),
        )
        drains.wake_key(key)
        assert drains.slots.take(len(local.claimed))
        drains.adopt("s1", "h", local.claimed, trio.current_time() + 30, 30_000, None)
        await engine.background.settle()
    # Both at once: "remote" does not wait for "local" to finish first.
    assert sorted(started) == [("local", 0.0), ("remote", 0.0)]
