"""Durable handler steps (issue 34): ``await ctx.step(name, fn, *args)`` on
the autojump clock (the memory store; the stores' side is the conformance
suite's ``journal`` module, and the multi-process crash test is
``tests/test_durable_crash.py``).

A step runs ``fn`` once per (trigger, name) and journals its result before it
returns; a later attempt answers it from the journal. Not journaled: a step
that raises, and one cancelled (abort, timeout) before its result is stored.
The journal is read once per attempt, and not at all by a handler without
steps.
"""

from __future__ import annotations

import re

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores.base import Journal, JournalEntry
from a2trio.stores.memory import MemoryStore
from a2trio.testing import TrioClock, open_harness

from .apps import Cancelled, Ordered, Shipped, orders


class Charge(msgspec.Struct, frozen=True):
    id: str
    cents: int


class CountingJournal:
    """A journal that counts its reads and writes (the memory store's inside)."""

    def __init__(self, inner: Journal) -> None:
        self.inner = inner
        self.reads = 0
        self.writes = 0

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        self.reads += 1
        return await self.inner.read_journal(session_id, index)

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        self.writes += 1
        return await self.inner.write_step(
            session_id, index=index, attempt=attempt, name=name, result=result
        )


def counted_store() -> tuple[MemoryStore, CountingJournal]:
    store = MemoryStore(clock=TrioClock())
    journal = CountingJournal(store.journal)
    store.journal = journal  # type: ignore[assignment]
    return store, journal


async def test_a_step_runs_once_and_a_later_attempt_answers_it_from_the_journal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, journal = counted_store()
    charged: list[int] = []
    seen: list[tuple[int, Charge]] = []

    async def charge(item: str, cents: int) -> Charge:
        charged.append(cents)
        await trio.sleep(1)
        return Charge(f"ch-{item}", cents)

    def label(item: str) -> str:
        return item.upper()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        receipt = await ctx.step("charge", charge, ctx.event.payload.item, 1250)
        seen.append((ctx.attempt, receipt))
        if ctx.attempt == 1:
            raise RuntimeError("the courier is down")
        name = await ctx.step("label", label, receipt.id)
        return orders.event("shipped", Shipped(name))

    async with open_harness(orders, handlers={"ordered": ship}, store=store) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await app.advance(60)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
        events = await app.assert_log(session, ["ordered", "shipped"])
        assert events[1].payload == Shipped("CH-BOOK")
    assert charged == [1250], "the charge ran once across two attempts"
    # The same typed value on the first run and on the replay.
    assert seen == [(1, Charge("ch-book", 1250)), (2, Charge("ch-book", 1250))]
    assert (journal.reads, journal.writes) == (2, 2), "one read per attempt"


async def test_a_handler_without_steps_reads_no_journal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, journal = counted_store()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        return None

    async with open_harness(orders, handlers={"ordered": ship}, store=store) as app:
        session = app.session("s1")
        for item in ("a", "b", "c"):
            await session.append(orders.event("ordered", Ordered(item)))
        await app.advance(1)
        for index in (1, 2, 3):
            await app.assert_outcome(session, index, "processed", attempts=1)
    assert (journal.reads, journal.writes) == (0, 0)


async def test_a_step_that_raises_is_not_journaled_and_runs_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[int] = []

    def flaky(attempt: int) -> int:
        calls.append(attempt)
        if attempt == 1:
            raise ConnectionError("gateway timeout")
        return attempt * 10

    results: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        results.append(await ctx.step("call", flaky, ctx.attempt))

    async with open_harness(orders, handlers={"ordered": ship}) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(60)
        found = await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
        assert "ConnectionError: gateway timeout" in (found.last_error or "")
    assert calls == [1, 2]
    assert results == [20]


async def test_a_step_cancelled_by_abort_is_cancelled_at_its_next_await_and_not_journaled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, journal = counted_store()
    log: list[tuple[str, float]] = []

    async def slow() -> str:
        log.append(("started", trio.current_time()))
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            log.append(("cancelled", trio.current_time()))
            raise
        return "done"

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await ctx.step("slow", slow)

    handlers = {"ordered": a2trio.handler(ship, abort_on=["cancelled"])}
    async with open_harness(orders, handlers=handlers, store=store) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(2)
        await session.append(orders.event("cancelled", Cancelled("a")))
        await app.advance(60)
        await app.assert_outcome(session, 1, "aborted", attempts=1)
        key = app.server.key("s1")
        assert await store.journal.read_journal(key, 1) == []
    assert log == [("started", 0.0), ("cancelled", 2.0)]
    assert journal.writes == 0


async def test_a_step_cut_off_by_the_timeout_runs_again_on_the_next_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[int, str]] = []

    async def call(attempt: int) -> int:
        try:
            await trio.sleep(10 if attempt == 1 else 1)
        except trio.Cancelled:
            runs.append((attempt, "cancelled"))
            raise
        runs.append((attempt, "finished"))
        return attempt

    answers: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        answers.append(await ctx.step("call", call, ctx.attempt))

    handlers = {"ordered": a2trio.handler(ship, timeout=5)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(120)
        await app.assert_outcome(session, 1, "processed", attempts=2, failures=1)
    assert runs == [(1, "cancelled"), (2, "finished")]
    assert answers == [2]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("twice", r"^step name 'pay' is used twice in one run of the handler"),
        ("reserved", r"^step name 'a2:x' starts with 'a2:'"),
        ("empty", r"^step name must be a non-empty string, got ''$"),
        ("unencodable", r"^step 'pay' returned object, which cannot be journaled"),
    ],
)
async def test_bad_steps_fail_the_attempt_with_a_clear_error(
    autojump_clock: trio.testing.MockClock, body: str, error: str
) -> None:
    raised: list[BaseException] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        try:
            if body == "twice":
                await ctx.step("pay", lambda: 1)
                await ctx.step("pay", lambda: 2)
            elif body == "reserved":
                await ctx.step("a2:x", lambda: 1)
            elif body == "empty":
                await ctx.step("", lambda: 1)
            else:
                await ctx.step("pay", object)
        except Exception as exc:
            raised.append(exc)
            raise

    handlers = {"ordered": a2trio.handler(ship, retry=a2trio.Retry(1))}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(1)
        await app.assert_outcome(session, 1, "dead_lettered", attempts=1)
    [exc] = raised
    assert isinstance(exc, (TypeError, ValueError))
    assert re.match(error, str(exc)), str(exc)


async def test_a_lapsed_attempts_step_is_not_journaled_and_the_next_attempt_runs_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Attempt 1 is cut off from its renewals and its lease lapses while its
    step still runs (shielded, as an effect that ignores cancellation would);
    another holder takes the event (attempt 2). When attempt 1's step ends,
    it is cancelled at its next await, before its journal write: nothing is
    journaled, and the next attempt that runs (3) runs the step. (A zombie
    that reached the write would be refused by the store's fence: the
    conformance suite's ``check_journal_fence``.)"""
    store = MemoryStore(clock=TrioClock())
    outcomes: list[tuple[int, str, float]] = []
    ttl = a2trio.Timings().claim_ttl_s

    async def effect(attempt: int) -> int:
        if attempt == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(ttl + 10)
        return attempt

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        try:
            got = await ctx.step("effect", effect, ctx.attempt)
        except trio.Cancelled:
            outcomes.append((ctx.attempt, "cancelled", trio.current_time()))
            raise
        outcomes.append((ctx.attempt, f"journaled {got}", trio.current_time()))

    async with open_harness(orders, handlers={"ordered": ship}, store=store) as app:
        app.store.fail("renew_claims")
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(ttl + 1)
        key = app.server.key("s1")
        thief = await store.claim_available(key, holder="thief", ttl_ms=60_000)
        assert [e.attempt_count for e in getattr(thief, "events", [])] == [2], thief
        await app.advance(10)
        assert outcomes == [(1, "cancelled", ttl + 10)]
        assert await store.journal.read_journal(key, 1) == []
        app.store.clear()
        await app.advance(60)
        await app.drain(session)
        await app.advance(1)
        await app.assert_outcome(session, 1, "processed", attempts=3)
        [entry] = await store.journal.read_journal(key, 1)
        assert (entry.attempt, entry.result) == (3, b"3")
    assert [o[:2] for o in outcomes] == [(1, "cancelled"), (3, "journaled 3")]
