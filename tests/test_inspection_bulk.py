"""Bulk operator actions on ``server.inspect`` (issue 35): redrive or skip
every dead letter a filter matches, one fenced single action each, recorded
like one, with a dry run, a limit, and refusals reported per event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import trio

import a2trio
from a2trio.inspection import BulkFilterError, DeadLetterFilter
from tests.test_identifiers import open_backend

from .apps import Cancelled, Note, Ordered, orders

BACKENDS = ["memory", "sqlite", "postgres"]


class _Failing:
    """Fails every event until ``fixed``; records what ran."""

    def __init__(self) -> None:
        self.fixed = False
        self.ran: list[str] = []

    async def __call__(self, ctx: a2trio.HandlerContext[Any]) -> None:
        if not self.fixed:
            raise RuntimeError(f"{ctx.event.type} failed: {ctx.event.session_id}")
        self.ran.append(f"{ctx.event.session_id}#{ctx.event.index}")


@asynccontextmanager
async def dead_letters(
    backend: str, failing: _Failing, sessions: dict[str, list[str]]
) -> AsyncIterator[a2trio.Server]:
    """A server whose ``sessions`` (id -> event types) all dead-lettered."""
    async with (
        open_backend(backend) as store,
        a2trio.Server(
            orders,
            store=store,
            handlers={
                "ordered": a2trio.handler(failing, lane="stock"),
                "cancelled": a2trio.handler(failing, lane="stock"),
            },
            timings=a2trio.Timings(max_failures=1),
            sweep=False,
        ) as server,
    ):
        for session_id, types in sessions.items():
            session = server.session(session_id)
            for event_type in types:
                payload = Ordered(session_id) if event_type == "ordered" else Cancelled(session_id)
                await session.append(orders.event(event_type, payload))
            await server.settle()
            await trio.sleep(0.003)  # distinct dead-letter times, for the range
        yield server


def _where(result: a2trio.inspection.BulkResult) -> list[tuple[str, int, str]]:
    return [(i.session_id, i.index, i.outcome) for i in result.items]


async def _dead(server: a2trio.Server) -> list[tuple[str, int]]:
    page = await server.inspect.list_dead_letters(limit=1000)
    return [(d.event.session_id, d.event.index) for d in page.dead_letters]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_dry_run_lists_the_matches_and_touches_nothing(backend: str) -> None:
    failing = _Failing()
    shape = {"eu-1": ["ordered"], "eu-2": ["cancelled"], "us-1": ["ordered"]}
    async with dead_letters(backend, failing, shape) as server:
        before = await server.inspect.list_dead_letters()
        dry = await server.inspect.bulk(
            "redrive", DeadLetterFilter(session_prefix="eu-"), by="op", dry_run=True
        )
        assert _where(dry) == [("eu-1", 1, "matched"), ("eu-2", 1, "matched")]
        assert (dry.matched, dry.acted, dry.refused, dry.limited, dry.dry_run) == (
            2,
            0,
            0,
            False,
            True,
        )
        assert await server.inspect.list_dead_letters() == before, "no action recorded"
        everything = await server.inspect.bulk("skip", by="op", reason="look", dry_run=True)
        assert everything.matched == 3, "an empty filter is fine on a dry run"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_filter_field_narrows_the_match(backend: str) -> None:
    failing = _Failing()
    shape = {"a": ["ordered"], "b": ["cancelled"], "c": ["ordered"]}
    async with dead_letters(backend, failing, shape) as server:
        inspect = server.inspect

        async def matched(where: DeadLetterFilter) -> list[tuple[str, int]]:
            result = await inspect.bulk("redrive", where, by="op", dry_run=True)
            return [(i.session_id, i.index) for i in result.items]

        assert await matched(DeadLetterFilter(event_types=("cancelled",))) == [("b", 1)]
        assert await matched(DeadLetterFilter(error_contains="ordered failed: c")) == [("c", 1)]
        assert await matched(DeadLetterFilter(error_contains="ORDERED")) == [], "case-sensitive"
        assert await matched(DeadLetterFilter(session_prefix="b")) == [("b", 1)]
        page = await inspect.list_dead_letters()
        times = {(d.event.session_id): d.status.dead_lettered_at_ms for d in page.dead_letters}
        at_b = cast("int", times["b"])
        later = [(s, 1) for s, at in sorted(times.items()) if cast("int", at) >= at_b]
        assert await matched(DeadLetterFilter(dead_lettered_from_ms=at_b)) == later
        assert ("a", 1) not in later
        assert await matched(DeadLetterFilter(dead_lettered_until_ms=cast("int", times["a"]))) == []
        both = DeadLetterFilter(event_types=("ordered",), dead_lettered_from_ms=at_b)
        assert await matched(both) == [("c", 1)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_bulk_redrive_records_each_action_and_the_events_run(backend: str) -> None:
    failing = _Failing()
    shape = {"a": ["ordered", "ordered"], "b": ["cancelled"], "c": ["ordered"]}
    async with dead_letters(backend, failing, shape) as server:
        failing.fixed = True
        where = DeadLetterFilter(event_types=("ordered",))
        result = await server.inspect.bulk("redrive", where, by="alice", reason="fixed in v2")
        assert _where(result) == [("a", 1, "acted"), ("c", 1, "acted")]
        assert (result.matched, result.acted, result.refused) == (2, 2, 0)
        first = result.items[0].action
        assert first is not None
        assert (first.action, first.session_id, first.index, first.by, first.reason) == (
            "redrive",
            "a",
            1,
            "alice",
            "fixed in v2",
        )
        await server.settle()
        assert sorted(failing.ran) == ["a#1", "a#2", "c#1"], "the lane behind moved on"
        assert await _dead(server) == [("b", 1)]
        [event, _] = (await server.inspect.read_session_page("a")).events
        assert event.actions == [first], "recorded like a single redrive"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_bulk_skip_needs_a_reason_and_hands_the_lanes_on(backend: str) -> None:
    failing = _Failing()
    async with dead_letters(backend, failing, {"a": ["ordered"], "b": ["ordered"]}) as server:
        with pytest.raises(ValueError, match="`reason` must not be empty"):
            await server.inspect.bulk("skip", by="op", all=True)
        result = await server.inspect.bulk("skip", by="op", reason="obsolete", all=True)
        assert _where(result) == [("a", 1, "acted"), ("b", 1, "acted")]
        assert await _dead(server) == []
        [skipped] = (await server.inspect.read_session_page("b")).events
        assert skipped.status.state == "skipped"
        assert [(a.action, a.by, a.reason) for a in skipped.actions] == [("skip", "op", "obsolete")]


class _Racing:
    """The store's operator, where someone else redrives ``stolen`` between
    the bulk action's read and its act."""

    def __init__(self, operator: Any, stolen: tuple[str, int]) -> None:
        self._operator = operator
        self._stolen = stolen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._operator, name)

    async def dead_letters(self, prefix: str, **kw: Any) -> Any:
        rows = await self._operator.dead_letters(prefix, **kw)
        for row in rows:
            if (row.session_id.rpartition("\x1f")[2], row.index) == self._stolen:
                await self._operator.redrive(row.session_id, row.index, by="bob", reason="mine")
        return rows


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_refused_event_is_reported_and_the_others_go_on(backend: str) -> None:
    failing = _Failing()
    shape = {"a": ["ordered"], "b": ["ordered"], "c": ["ordered"], "d": ["ordered"]}
    async with dead_letters(backend, failing, shape) as server:
        store = cast("Any", server.store)
        store.operator = _Racing(store.operator, ("b", 1))
        failing.fixed = True

        async def allow(session_id: str, index: int) -> bool:
            return session_id != "c"

        result = await server.inspect.bulk("redrive", by="op", all=True, allow=allow)
        assert _where(result) == [
            ("a", 1, "acted"),
            ("b", 1, "refused"),
            ("c", 1, "refused"),
            ("d", 1, "acted"),
        ]
        assert (result.matched, result.acted, result.refused) == (4, 2, 2)
        b, c = result.items[1], result.items[2]
        assert (b.refusal, b.action) == ("not_dead_lettered", None)
        assert "event 1 of session 'b'" in (b.detail or ""), "named without the namespace"
        assert (c.refusal, c.detail) == (
            "forbidden",
            "event 1 of session 'c' is not allowed to redrive",
        )
        assert await _dead(server) == [("c", 1)]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_the_limit_bounds_one_call_and_pages_through_the_store(backend: str) -> None:
    failing = _Failing()
    shape = {f"s{n:03}": ["ordered"] for n in range(5)}
    async with dead_letters(backend, failing, shape) as server:
        reads: list[int] = []
        store = cast("Any", server.store)
        real = store.operator.dead_letters

        async def counted(prefix: str, *, limit: int, after: Any = None) -> Any:
            reads.append(limit)
            return await real(prefix, limit=limit, after=after)

        store.operator.dead_letters = counted
        failing.fixed = True
        first = await server.inspect.bulk("redrive", by="op", all=True, limit=3)
        assert [i.session_id for i in first.items] == ["s000", "s001", "s002"]
        assert (first.matched, first.acted, first.limited) == (3, 3, True)
        assert reads
        assert all(limit <= 200 for limit in reads), "bounded pages"
        rest = await server.inspect.bulk("redrive", by="op", all=True, limit=3)
        assert [i.session_id for i in rest.items] == ["s003", "s004"]
        assert rest.limited is False
        await server.settle()
        exact = await server.inspect.bulk("redrive", by="op", all=True, dry_run=True, limit=1)
        assert (exact.matched, exact.limited) == (0, False)


async def test_the_filter_pages_past_many_dead_letters() -> None:
    failing = _Failing()
    async with dead_letters("memory", failing, {"a": ["ordered"]}) as server:
        session = server.session("many")
        for _ in range(450):
            await session.append(orders.event("note", Note("n")))
        for n in range(450):
            await server.session(f"m{n:03}").append(orders.event("ordered", Ordered("x")))
        await server.settle()
        result = await server.inspect.bulk(
            "redrive", DeadLetterFilter(session_prefix="m"), by="op", dry_run=True
        )
        assert result.matched == 450
        assert [i.session_id for i in result.items][-1] == "m449"


async def test_bad_filters_and_bounds_are_clear_errors() -> None:
    failing = _Failing()
    async with dead_letters("memory", failing, {"a": ["ordered"]}) as server:
        inspect = server.inspect
        with pytest.raises(BulkFilterError, match="empty filter would redrive every dead letter"):
            await inspect.bulk("redrive", by="op")
        with pytest.raises(BulkFilterError, match="ends before it starts"):
            await inspect.bulk(
                "redrive",
                DeadLetterFilter(dead_lettered_from_ms=10, dead_lettered_until_ms=10),
                by="op",
            )
        bad = [
            DeadLetterFilter(dead_lettered_from_ms=-1),
            DeadLetterFilter(dead_lettered_until_ms=True),
            DeadLetterFilter(event_types=("",)),
            DeadLetterFilter(error_contains=""),
            cast("Any", "a"),
        ]
        for where in bad:
            with pytest.raises(BulkFilterError):
                await inspect.bulk("redrive", where, by="op", dry_run=True)
        for limit in (0, 10_001, True):
            with pytest.raises(BulkFilterError, match="limit is 1 to 10000"):
                await inspect.bulk("redrive", by="op", dry_run=True, limit=limit)
        with pytest.raises(ValueError, match="'redrive' or 'skip'"):
            await inspect.bulk(cast("Any", "retry_now"), by="op", all=True)
        with pytest.raises(ValueError, match="`by` must not be empty"):
            await inspect.bulk("redrive", by="", all=True)
        assert issubclass(BulkFilterError, ValueError)
        assert await _dead(server) == [("a", 1)], "nothing written"
