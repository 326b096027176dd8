"""Every write a handler makes is fenced and idempotent per attempt (issue 16):
appends, returned events and dispatches alike. The regression: a retried
handler's ``ctx.session.dispatch`` wrote its event twice."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine.attempt import MAX_ERROR_CHARS, stored_error
from a2trio.testing import open_harness

from .apps import Note, Ordered, orders


async def test_a_retried_handlers_dispatch_replays_instead_of_duplicating(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        [dispatched] = await ctx.session.dispatch("label", orders.event("note", Note("label")))
        assert dispatched.index == 2
        if ctx.attempt == 1:
            raise RuntimeError("the printer jammed after the dispatch")

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await app.settle()
        await app.drain(session)  # attempt 2
        await app.assert_log(session, ["ordered", "note"])
        [trigger, note] = await session.history()
        assert note.id == a2trio.ids.handler_event_id(trigger.id, "label", 0)


async def test_a_superseded_attempts_dispatch_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused: list[a2trio.ErrorCode] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.attempt > 1:
            return
        with trio.CancelScope(shield=True):
            # Outlive the lease; another holder's claim supersedes this attempt.
            await trio.sleep(a2trio.DEFAULT_TIMINGS.claim_ttl_s + 1)
            await app.store.claim_available(app.server.key("s1"), holder="other", ttl_ms=1)
            try:
                await ctx.session.dispatch("late", orders.event("note", Note("zombie")))
            except a2trio.A2Error as exc:
                refused.append(exc.code)

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        app.store.fail("renew_claims")  # the lease lapses
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await app.settle()
        await app.assert_log(session, ["ordered"])
    assert refused == [a2trio.ErrorCode.SUPERSEDED_ATTEMPT]


async def test_dispatch_in_a_handler_needs_a_name() -> None:
    seen: list[str] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        with pytest.raises(TypeError) as info:
            await ctx.session.dispatch("", orders.event("note", Note("x")))
        seen.append(str(info.value))

    async with a2trio.Server(orders, handlers={"ordered": ship}) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await server.settle()
    assert seen == ["handler append name must be a non-empty string, got ''"]


async def test_stored_errors_keep_the_tail_of_a_long_traceback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        raise RuntimeError("a response body: " + "x" * 20_000 + " at the end")

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        [event] = await session.append(orders.event("ordered", Ordered("book")))
        await app.settle()
        outcome = await app.outcome(session, event)
    assert outcome.last_error is not None
    assert len(outcome.last_error) <= MAX_ERROR_CHARS + 40
    assert outcome.last_error.startswith("[")
    assert " characters cut]\n" in outcome.last_error
    assert outcome.last_error.endswith("x at the end\n")
    short = stored_error(ValueError("short"))
    assert short == "ValueError: short\n"


async def test_a_server_runs_at_most_max_handlers_at_once_and_claims_no_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    running = 0
    peak = 0
    finished: list[float] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1)
        running -= 1
        finished.append(trio.current_time())

    store = a2trio.stores.memory(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store, handlers={"ordered": ship}, max_handlers=3)
    async with server:
        for session in ("s1", "s2"):
            await server.session(session).append(
                *(orders.event("ordered", Ordered(str(n))) for n in range(5))
            )
        await trio.sleep(0.5)
        claimed = [
            row
            for session in ("s1", "s2")
            for row in await store.read(server.key(session))
            if row.claim_holder is not None
        ]
        assert len(claimed) == 3  # the rest stay claimable by other processes
        await server.settle()
    assert peak == 3
    assert sorted(finished) == [1.0] * 3 + [2.0] * 3 + [3.0] * 3 + [4.0]


def test_max_handlers_must_be_a_positive_integer() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match=r"^max_handlers must be a positive integer"):
            a2trio.Server(orders, max_handlers=bad)  # type: ignore[arg-type]
