"""The operator's actions on ``server.inspect`` (issue 18): dead letters across
the contract's sessions, redrive, skip and retry now, each recorded on the
event and followed by the session's drain, on memory, SQLite and Postgres."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing

import a2trio
from a2trio import OperatorActionError
from tests.test_identifiers import open_backend

from .apps import Note, Ordered, orders

BACKENDS = ["memory", "sqlite", "postgres"]


class _Stock:
    """A handler that fails until the stock arrives."""

    def __init__(self) -> None:
        self.arrived = False
        self.shipped: list[str] = []

    async def __call__(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        if not self.arrived:
            raise RuntimeError(f"no stock for {ctx.event.payload.item}")
        self.shipped.append(ctx.event.payload.item)


def _server(store: a2trio.Store, stock: _Stock, **kw: Any) -> a2trio.Server:
    return a2trio.Server(
        orders,
        store=store,
        handlers={"ordered": a2trio.handler(stock, lane="stock")},
        timings=a2trio.Timings(max_failures=kw.pop("max_failures", 1)),
        sweep=False,
        **kw,
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_dead_letter_is_found_redriven_and_runs_again(backend: str) -> None:
    stock = _Stock()
    async with open_backend(backend) as store, _server(store, stock) as server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await session.append(orders.event("ordered", Ordered("pen")))
        await server.settle()
        page = await server.inspect.list_dead_letters()
        [dead] = page.dead_letters
        assert (dead.event.session_id, dead.event.index, dead.status.state) == (
            "s1",
            1,
            "dead_lettered",
        )
        assert page.cursor is None
        assert "no stock for book" in (dead.status.last_error or "")
        blocked = await server.inspect.read_session_page("s1")
        assert [e.status.state for e in blocked.events] == ["dead_lettered", "pending"]

        stock.arrived = True
        action = await server.inspect.redrive("s1", 1, by="alice", reason="stock arrived")
        assert (action.action, action.session_id, action.index, action.by) == (
            "redrive",
            "s1",
            1,
            "alice",
        )
        await server.settle()
        assert stock.shipped == ["book", "pen"], "the lane moved on after the redrive"
        events = (await server.inspect.read_session_page("s1")).events
        assert [e.status.state for e in events] == ["processed", "processed"]
        assert events[0].actions == [action]
        assert events[0].status.failures == 0
        assert (await server.inspect.list_dead_letters()).dead_letters == []
        with pytest.raises(OperatorActionError, match="not dead-lettered") as refused:
            await server.inspect.redrive("s1", 1, by="alice")
        assert refused.value.reason == "not_dead_lettered"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_skipped_event_never_runs_and_hands_its_lane_on(backend: str) -> None:
    stock = _Stock()
    async with open_backend(backend) as store, _server(store, stock) as server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("poison")))
        await session.append(orders.event("ordered", Ordered("pen")))
        await server.settle()
        stock.arrived = True
        action = await server.inspect.skip("s1", 1, by="bob", reason="a bad order")
        await server.settle()
        assert stock.shipped == ["pen"]
        events = (await server.inspect.read_session_page("s1")).events
        assert [e.status.state for e in events] == ["skipped", "processed"]
        assert [(a.action, a.reason) for a in events[0].actions] == [("skip", "a bad order")]
        assert events[0].actions == [action]
        with pytest.raises(OperatorActionError) as refused:
            await server.inspect.skip("s1", 2, by="bob", reason="done already")
        assert refused.value.reason == "settled"
        with pytest.raises(OperatorActionError) as missing:
            await server.inspect.skip("s1", 3, by="bob", reason="no such event")
        assert (missing.value.reason, missing.value.index) == ("no_event", 3)


async def test_retry_now_runs_a_failed_event_without_waiting_for_its_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stock = _Stock()
    async with _server(a2trio.stores.memory(), stock, max_failures=10) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await server.settle()
        [failed] = (await server.inspect.read_session_page("s1")).events
        assert (failed.status.state, failed.status.failures) == ("failed", 1)
        stock.arrived = True
        started = trio.current_time()
        [action] = await server.inspect.retry_now("s1", by="carol", reason="restocked")
        await server.settle()
        assert trio.current_time() == started, "claimed at once, not after the 1 s backoff"
        assert stock.shipped == ["book"]
        [done] = (await server.inspect.read_session_page("s1")).events
        assert done.status.state == "processed"
        assert [(a.action, a.by) for a in done.actions] == [("retry_now", "carol")]
        assert action == done.actions[0]
        with pytest.raises(OperatorActionError) as refused:
            await server.inspect.retry_now("s1", by="carol")
        assert refused.value.reason == "nothing_to_retry"


async def test_a_live_claim_refuses_every_action() -> None:
    release = trio.Event()

    async def slow(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await release.wait()

    async with a2trio.Server(
        orders, store=a2trio.stores.memory(), handlers={"ordered": slow}, sweep=False
    ) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(OperatorActionError, match=r"is claimed by '.+' \(attempt 1\)") as skip:
            await server.inspect.skip("s1", 1, by="dave", reason="stuck?")
        assert skip.value.reason == "claimed"
        with pytest.raises(OperatorActionError) as retry:
            await server.inspect.retry_now("s1", by="dave")
        assert retry.value.reason == "claimed"
        release.set()
        await server.settle()
        [done] = (await server.inspect.read_session_page("s1")).events
        assert (done.status.state, done.actions) == ("processed", [])


async def test_dead_letters_page_across_sessions_with_a_cursor() -> None:
    stock = _Stock()
    async with _server(a2trio.stores.memory(), stock) as server:
        for sid in ("a", "b", "c"):
            await server.session(sid).append(orders.event("ordered", Ordered(sid)))
        await server.session("b").append(orders.event("note", Note("settled")))
        await server.settle()
        await server.inspect.redrive("b", 1, by="eve", reason="too soon")
        await server.settle()
        first = await server.inspect.list_dead_letters(limit=2)
        again = first.dead_letters[1]
        assert [(a.action, a.by, a.session_id) for a in again.actions] == [("redrive", "eve", "b")]
        assert (again.status.state, first.dead_letters[0].actions) == ("dead_lettered", [])
        assert [(d.event.session_id, d.event.index) for d in first.dead_letters] == [
            ("a", 1),
            ("b", 1),
        ]
        assert first.cursor == "1:b"
        rest = await server.inspect.list_dead_letters(limit=2, cursor=first.cursor)
        assert [d.event.session_id for d in rest.dead_letters] == ["c"]
        assert rest.cursor is None
        for cursor in ("b", "x:b", "1:", "١:b"):
            with pytest.raises(ValueError, match=r"cursor|session id"):
                await server.inspect.list_dead_letters(cursor=cursor)
        with pytest.raises(TypeError, match=r"^inspection limit"):
            await server.inspect.list_dead_letters(limit=0)


async def test_bad_arguments_write_nothing() -> None:
    stock = _Stock()
    async with _server(a2trio.stores.memory(), stock) as server:
        await server.session("s1").append(orders.event("ordered", Ordered("book")))
        await server.settle()
        bad: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"by": ""}, ValueError, "`by` must not be empty"),
            ({"by": 7}, TypeError, "`by` must be a string"),
            ({"by": "x" * 201}, ValueError, "`by` holds at most 200"),
            ({"by": "op", "reason": "r" * 2001}, ValueError, "`reason` holds at most 2000"),
        ]
        for kw, error, message in bad:
            with pytest.raises(error, match=message):
                await server.inspect.redrive("s1", 1, **kw)
        with pytest.raises(ValueError, match="`reason` must not be empty"):
            await server.inspect.skip("s1", 1, by="op", reason=" ")
        for index in (0, True, "1"):
            with pytest.raises(TypeError, match="index must be a positive integer"):
                await server.inspect.redrive("s1", index, by="op")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^session id"):
            await server.inspect.retry_now("a\x00b", by="op")
        [dead] = (await server.inspect.read_session_page("s1")).events
        assert (dead.status.state, dead.actions) == ("dead_lettered", [])


async def test_a_store_without_operator_actions_is_refused() -> None:
    store = a2trio.stores.memory()
    cast("Any", store).operator = None  # a store without the capability
    async with a2trio.Server(orders, store=store) as server:
        with pytest.raises(a2trio.InspectionUnsupportedError, match="no operator actions"):
            await server.inspect.list_dead_letters()
        with pytest.raises(a2trio.InspectionUnsupportedError):
            await server.inspect.redrive("s1", 1, by="op")
        with pytest.raises(a2trio.InspectionUnsupportedError):
            await server.inspect.retry_now("s1", by="op")
        await server.session("s1").append(orders.event("note", Note("n")))
        [shown] = (await server.inspect.read_session_page("s1")).events
        assert (shown.status.state, shown.actions) == ("settled", []), "pages still read"
