"""``server.inspect`` (issue 18): the contract's sessions with the namespace
stripped, and a session's events page by page with their processing status,
on every store with inspection."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine.inspection import MAX_INSPECTION_PAGE
from a2trio.engine.inspection_records import event_status
from a2trio.stores.base import SessionPage, StoredEvent
from tests.test_identifiers import open_backend

from .apps import Note, Ordered, orders


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_sessions_and_pages_with_their_status(backend: str) -> None:
    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.event.payload.item == "broken":
            raise RuntimeError("no stock")

    other = a2trio.contract("other", events={"note": Note})
    timings = a2trio.Timings(max_failures=1)
    async with open_backend(backend) as store:
        server = a2trio.Server(
            orders, store=store, handlers={"ordered": ship}, timings=timings, sweep=False
        )
        async with server, a2trio.Server(other, store=store) as neighbour:
            await neighbour.session("not-ours").append(other.event("note", Note("x")))
            s1 = server.session("s1")
            await s1.append(
                orders.event("note", Note("a")),
                orders.event("ordered", Ordered("book")),
                orders.event("ordered", Ordered("broken")),
            )
            await server.settle()
            await server.session("s2").append(orders.event("note", Note("b")))
            assert await s1.state(a2trio.Reducer("count", 0, lambda n, e: n + 1)) == (3, 3)
            await server.settle()
            first = await server.inspect.list_sessions(limit=1)
            prefix = f"{orders.name}\x1f"
            assert [s.session_id for s in first.sessions] == ["s1"]
            assert first.cursor == "s1"
            rest = await server.inspect.list_sessions(limit=10, cursor=first.cursor)
            assert [s.session_id for s in rest.sessions] == ["s2"]
            assert not any(s.session_id.startswith(prefix) for s in rest.sessions)
            page = await server.inspect.read_session_page("s1", limit=2)
            assert [e.event.index for e in page.events] == [1, 2]
            assert [e.status.state for e in page.events] == ["settled", "processed"]
            assert (page.through_index, page.next_index) == (3, 2)
            assert [s.reducer_name for s in page.snapshots] == ["count"]
            tail = await server.inspect.read_session_page("s1", after_index=2)
            [dead] = tail.events
            assert dead.event.payload == Ordered("broken")
            assert (dead.status.state, dead.status.attempts, dead.status.failures) == (
                "dead_lettered",
                1,
                1,
            )
            assert dead.status.last_error is not None
            assert "RuntimeError: no stock" in dead.status.last_error
            assert (tail.snapshots, tail.next_index) == ([], None)
            bounded = await server.inspect.read_session_page("s1", after_index=1, through_index=2)
            assert ([e.event.index for e in bounded.events], bounded.next_index) == ([2], None)


def _row(**bookkeeping: Any) -> StoredEvent:
    return StoredEvent("e", "t", {}, 1, "k", 0, **bookkeeping)


def test_the_status_follows_the_bookkeeping() -> None:
    now = 1_000
    cases = [
        (_row(), "pending"),
        (_row(attempt_count=1, claim_holder="h", claim_expires_at_ms=2_000), "claimed"),
        (_row(attempt_count=1, claim_holder="h", claim_expires_at_ms=1_000), "pending"),
        (_row(attempt_count=1, failure_count=1, last_error="x"), "failed"),
        (_row(attempt_count=2, failure_count=2, failed_at_ms=900), "dead_lettered"),
        (_row(processed_at_ms=5), "settled"),
        (_row(attempt_count=1, processed_at_ms=5, processed_by_attempt=1), "processed"),
    ]
    for row, state in cases:
        assert event_status(row, now).state == state, row
    claimed = event_status(cases[1][0], now)
    assert (claimed.claim_holder, claimed.claim_expires_at_ms) == ("h", 2_000)
    assert event_status(cases[2][0], now).claim_holder is None


def test_the_status_carries_the_timings_and_the_last_failure() -> None:
    row = _row(
        lane="payments",
        attempt_count=2,
        failure_count=2,
        first_claimed_at_ms=100,
        last_claimed_at_ms=400,
        last_failed_attempt=2,
        last_failed_at_ms=450,
        last_error="ConnectionError: down",
        failed_at_ms=450,
    )
    status = event_status(row, 1_000)
    assert (status.lane, status.first_claimed_at_ms, status.last_claimed_at_ms) == (
        "payments",
        100,
        400,
    )
    assert (status.last_failed_attempt, status.last_failed_at_ms) == (2, 450)
    assert (status.dead_lettered_at_ms, status.processed_at_ms) == (450, None)
    done = event_status(_row(attempt_count=1, processed_at_ms=7, processed_by_attempt=1), 1_000)
    assert (done.processed_at_ms, done.dead_lettered_at_ms) == (7, None)


async def test_bad_bounds_and_a_store_without_inspection_are_refused() -> None:
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        cases: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"limit": 0}, TypeError),
            ({"limit": True}, TypeError),
            ({"limit": MAX_INSPECTION_PAGE + 1}, ValueError),
            ({"after_index": -1}, TypeError),
            ({"through_index": 2**53}, TypeError),
        ]
        for bounds, error in cases:
            with pytest.raises(error, match=r"^inspection "):
                await server.inspect.read_session_page("s1", **bounds)
        with pytest.raises(ValueError, match=r"^session id "):
            await server.inspect.read_session_page("a\x00b")
        with pytest.raises(TypeError, match=r"^inspection limit"):
            await server.inspect.list_sessions(limit=0)

    blind_store = a2trio.stores.memory()
    cast("Any", blind_store).inspect = None  # a store without the capability
    async with a2trio.Server(orders, store=blind_store) as blind:
        with pytest.raises(a2trio.InspectionUnsupportedError, match="does not support"):
            await blind.inspect.list_sessions()
        with pytest.raises(a2trio.InspectionUnsupportedError):
            await blind.inspect.read_session_page("s1")


async def test_a_store_page_that_is_not_contiguous_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = a2trio.stores.memory()
    cast("Any", store).inspect = _GappyInspection(store.inspect)
    async with a2trio.Server(orders, store=store) as server:
        await server.session("s1").append(*(orders.event("note", Note(str(n))) for n in range(3)))
        with pytest.raises(a2trio.A2Error, match="not contiguous"):
            await server.inspect.read_session_page("s1")


class _GappyInspection:
    """The memory store's inspection, losing index 2 from every page."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def list_sessions(self, *, prefix: str, limit: int, cursor: str | None = None) -> Any:
        return SessionPage([], None)

    async def list_snapshots(self, session_id: str) -> list[Any]:
        return []

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> Any:
        page = await self.inner.read_events(
            session_id, after_index=after_index, limit=limit, through_index=through_index
        )
        return type(page)([e for e in page.events if e.index != 2], page.through_index)
