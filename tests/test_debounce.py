"""``debounce=a2trio.Debounce(period, key=None)`` (issue 33), on the autojump
clock (the memory store) and on SQLite (jump mode).

Only the last event of a key runs, once ``period`` passed without a newer
one; the earlier ones settle as skipped (no attempt), which inspection, the
inspector's JSON and the harness show. The key is per session.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.inspect import main as inspect_main
from a2trio.stores.base import Store
from a2trio.stores.postgres import postgres
from a2trio.stores.sqlite import sqlite
from a2trio.testing import TrioClock, open_harness
from a2trio.transport.wire.inspection import session_events_page_to_wire

from .apps import Note, Ordered, orders
from .backends.postgres import database_dsn, run_sql
from .backends.sqlite import open_store


class Runs:
    """(item, attempt, Trio time) of every ``ordered`` attempt."""

    def __init__(self, *, sleep: float = 0) -> None:
        self.log: list[tuple[str, int, float]] = []
        self.sleep = sleep

    async def ordered(self, ctx: a2trio.HandlerContext[Ordered]) -> None:
        self.log.append((ctx.event.payload.item, ctx.attempt, trio.current_time()))
        if self.sleep:
            await trio.sleep(self.sleep)


def _by_item(event: a2trio.AppendInput) -> str:
    payload = event.payload
    assert isinstance(payload, Ordered)
    return payload.item[0]


async def test_only_the_last_event_of_a_key_runs_once_the_period_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    debounce = a2trio.Debounce(5, key=_by_item)
    handlers = {"ordered": a2trio.handler(runs.ordered, debounce=debounce)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        start = trio.current_time()
        for item in ("a1", "b1", "a2"):
            await session.append(orders.event("ordered", Ordered(item)))
            await app.advance(2)
        await session.append(orders.event("ordered", Ordered("a3")))
        await app.advance(4.9)
        assert [item for item, _, _ in runs.log] == ["b1"], "a3 ran before its period passed"
        await app.advance(0.1)
        assert [(item, round(at - start, 6)) for item, _, at in runs.log] == [
            ("b1", 7.0),
            ("a3", 11.0),
        ]
        for index in (1, 3):
            await app.assert_outcome(session, index, "skipped", attempts=0)
        await app.assert_outcome(session, 2, "processed", attempts=1)
        await app.assert_outcome(session, 4, "processed", attempts=1)
        page = await app.server.inspect.read_session_page("s1")
        states = [(e.status.state, e.status.debounced_by) for e in page.events]
        assert states == [("skipped", 3), ("processed", None), ("skipped", 4), ("processed", None)]
        wire = msgspec.to_builtins(session_events_page_to_wire(page))
        assert [e["status"]["state"] for e in wire["events"]] == [
            "skipped",
            "processed",
            "skipped",
            "processed",
        ]
        assert wire["events"][0]["status"]["debouncedBy"] == 3


async def test_a_handlers_returned_events_are_debounced_in_its_completion(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()

    async def noted(ctx: a2trio.HandlerContext[Note]) -> list[a2trio.AppendInput]:
        return [orders.event("ordered", Ordered(item)) for item in ("a2", "a3", "b1")]

    handlers = {
        "ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(5, key=_by_item)),
        "note": a2trio.handler(noted),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        start = trio.current_time()
        await session.append(orders.event("ordered", Ordered("a1")))
        await app.advance(1)
        await session.append(orders.event("note", Note("import")))
        await app.advance(4.9)
        assert runs.log == [], "a returned event ran before its period passed"
        await app.advance(10)
        # a1 skipped by a2 (returned), a2 by a3 (in the same completion).
        assert sorted((item, round(at - start, 6)) for item, _, at in runs.log) == [
            ("a3", 6.0),
            ("b1", 6.0),
        ]
        await app.assert_outcome(session, 1, "skipped", attempts=0)
        await app.assert_outcome(session, 2, "processed", attempts=1)
        await app.assert_outcome(session, 3, "skipped", attempts=0)
        page = await app.server.inspect.read_session_page("s1")
        assert [e.status.debounced_by for e in page.events] == [3, None, 4, None, None]


async def test_without_a_key_the_handler_has_one_and_the_session_scopes_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(3))}
    async with open_harness(orders, handlers=handlers) as app:
        for item in ("x", "y"):
            await app.session("s1").append(orders.event("ordered", Ordered(item)))
        # Another session's event of the same key debounces nothing here.
        await app.session("s2").append(orders.event("ordered", Ordered("z")))
        await app.advance(10)
    assert sorted(item for item, _, _ in runs.log) == ["y", "z"]


async def test_a_running_event_is_left_alone(autojump_clock: trio.testing.MockClock) -> None:
    runs = Runs(sleep=10)
    handlers = {"ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(1))}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(2)
        await session.append(orders.event("ordered", Ordered("b")))
        await app.advance(30)
        await app.assert_outcome(session, 1, "processed", attempts=1)
        await app.assert_outcome(session, 2, "processed", attempts=1)
    assert [item for item, _, _ in runs.log] == ["a", "b"]


async def test_a_skipped_lane_head_hands_its_lane_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = Runs()
    notes: list[str] = []

    async def note(ctx: a2trio.HandlerContext[Note]) -> None:
        notes.append(ctx.event.payload.text)

    handlers = {
        "ordered": a2trio.handler(runs.ordered, lane="l", debounce=a2trio.Debounce(5)),
        "note": a2trio.handler(note, lane="l"),
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await session.append(orders.event("note", Note("n")))
        await session.append(orders.event("ordered", Ordered("b")))
        # The note no longer waits for the skipped head's period.
        await app.advance(0.5)
        assert notes == ["n"]
        await app.advance(5)
        await app.assert_outcome(session, 1, "skipped")
    assert [item for item, _, _ in runs.log] == ["b"]


@pytest.mark.parametrize("bad", ["raises", "not a string"])
async def test_a_key_that_fails_dead_letters_its_event_with_the_error(
    autojump_clock: trio.testing.MockClock, bad: str
) -> None:
    def key(event: a2trio.AppendInput) -> Any:
        if bad == "raises":
            raise LookupError("no key here")
        return 7

    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(1, key=key))}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        found = await app.assert_outcome(session, 1, "dead_lettered", attempts=1, failures=1)
    assert runs.log == []
    assert "DebounceKeyError: Debounce(key=...)" in (found.last_error or "")
    assert ("no key here" if bad == "raises" else "got 7") in (found.last_error or "")


async def test_a_debounced_dead_letter_stays_and_redrives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[tuple[str, int]] = []

    async def flaky(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.event.payload.item, ctx.attempt))
        if ctx.attempt == 1 and ctx.event.payload.item == "a":
            raise RuntimeError("first")

    handlers = {
        "ordered": a2trio.handler(flaky, debounce=a2trio.Debounce(2), retry=a2trio.Retry(1))
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(3)
        await app.assert_outcome(session, 1, "dead_lettered")
        # A dead letter is not skipped by a newer event: it blocks nothing here
        # (no lane) and waits for its redrive.
        await session.append(orders.event("ordered", Ordered("b")))
        await app.advance(3)
        await app.assert_outcome(session, 1, "dead_lettered")
        await app.assert_outcome(session, 2, "processed")
        await app.server.inspect.redrive("s1", 1, by="ops", reason="fixed")
        await app.advance(1)
        await app.assert_outcome(session, 1, "processed", attempts=2)
    assert attempts == [("a", 1), ("b", 1), ("a", 2)]


async def test_debounce_on_sqlite(mock_clock: trio.testing.MockClock) -> None:
    runs = Runs()
    handlers = {"ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(4, key=_by_item))}
    async with open_store(TrioClock()) as store:
        async with open_harness(orders, handlers=handlers, store=store) as app:
            session = app.session("s1")
            await session.append(orders.event("ordered", Ordered("a1")))
            await session.append(orders.event("ordered", Ordered("a2")))
            await app.settle()
            await app.assert_outcome(session, 1, "skipped", attempts=0)
            mock_clock.jump(3.9)
            await app.drain(session)
            await app.assert_outcome(session, 2, "pending", attempts=0)
            mock_clock.jump(0.1)
            await app.drain(session)
            await app.assert_outcome(session, 2, "processed", attempts=1)
    assert [item for item, _, _ in runs.log] == ["a2"]


# -- bad options ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((-1,), ValueError, r"Debounce\(period=\.\.\.\) must be a positive"),
        ((0,), ValueError, r"Debounce\(period=\.\.\.\) must be a positive"),
        ((float("inf"),), ValueError, r"Debounce\(period=\.\.\.\) must be a positive"),
        (("5s",), TypeError, r"Debounce\(period=\.\.\.\) must be a number"),
        ((1, "item"), TypeError, r"Debounce\(key=\.\.\.\) must be a function"),
    ],
)
def test_bad_debounce_options_fail_at_construction(
    args: tuple[Any, ...], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        a2trio.Debounce(*args)


def test_debounce_must_be_a_debounce() -> None:
    async def fn(ctx: a2trio.HandlerContext[Ordered]) -> None:
        return None

    with pytest.raises(TypeError, match=r"debounce must be an a2trio.Debounce"):
        a2trio.handler(fn, debounce=5)  # type: ignore[arg-type]
    placed = a2trio.event_type("ordered", Ordered)
    with pytest.raises(TypeError, match=r"debounce must be an a2trio.Debounce"):
        a2trio.on(placed, fn, debounce={"period": 1})  # type: ignore[arg-type]
    assert repr(a2trio.Debounce(2, key=_by_item)) == "Debounce(2.0, key=_by_item)"


_CLI_APP = """
import msgspec, a2trio

class Note(msgspec.Struct, frozen=True):
    text: str

notes = a2trio.contract("notes", events={"note": Note})
server = a2trio.Server(notes)
"""


class _CliNote(msgspec.Struct, frozen=True):
    text: str


def test_the_cli_shows_a_debounced_event_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"debounce_cli_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(_CLI_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "notes.db"
    notes = a2trio.contract("notes", events={"note": _CliNote})

    async def noted(ctx: a2trio.HandlerContext[_CliNote]) -> None:
        return None

    async def write() -> None:
        handlers = {"note": a2trio.handler(noted, debounce=a2trio.Debounce(3_600))}
        store = a2trio.stores.sqlite(str(db))
        async with a2trio.Server(notes, store=store, handlers=handlers) as server:
            for text in ("a", "b"):
                await server.session("s1").append(notes.event("note", _CliNote(text)))

    trio.run(write)
    url = f"sqlite:///{db}"
    assert inspect_main(["--app", name, "--store", url, "events", "s1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[:3] for row in rows] == [["1", "note", "skipped"], ["2", "note", "pending"]]
    assert inspect_main(["--app", name, "--store", url, "--json", "events", "s1"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [e["status"]["debouncedBy"] for e in page["events"]] == [2, None]


@pytest.fixture(params=["postgres", "sqlite"])
async def durable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a fresh Postgres schema or SQLite file (the app's own
    transaction needs one)."""
    if request.param == "postgres":
        dsn = await database_dsn()
        schema = f"s_{secrets.token_hex(6)}"
        store: Store = postgres(dsn, schema=schema)
        try:
            async with store:
                yield store
        finally:
            await store.aclose()
            await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
    else:
        async with sqlite(str(tmp_path / "debounce.db")) as store:
            yield store


async def test_debounced_appends_in_the_apps_transaction_skip_at_its_commit_only(
    durable: Store,
) -> None:
    handlers = {"ordered": a2trio.handler(Runs().ordered, debounce=a2trio.Debounce(3_600))}
    async with a2trio.Server(orders, store=durable, handlers=handlers) as server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        with pytest.raises(LookupError):
            async with server.transaction() as tx:
                await session.append(orders.event("ordered", Ordered("b")), transaction=tx)
                raise LookupError("rolled back")
        async with server.transaction() as tx:
            await session.append(orders.event("ordered", Ordered("c")), transaction=tx)
        page = await server.inspect.read_session_page("s1")
    assert [(e.event.index, e.status.state, e.status.debounced_by) for e in page.events] == [
        (1, "skipped", 2),
        (2, "pending", None),
    ]
    assert [e.event.payload.item for e in page.events] == ["a", "c"]


async def test_abort_on_cancels_the_running_event_a_newer_one_replaces(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``abort_on`` its own type composes with a debounce: the running
    attempt is aborted when the newer event lands, which runs after its period."""
    runs = Runs(sleep=10)
    handlers = {
        "ordered": a2trio.handler(runs.ordered, debounce=a2trio.Debounce(1), abort_on=["ordered"])
    }
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(2)
        await session.append(orders.event("ordered", Ordered("b")))
        await app.advance(30)
        await app.assert_outcome(session, 1, "aborted", attempts=1)
        await app.assert_outcome(session, 2, "processed", attempts=1)
    assert [item for item, _, _ in runs.log] == ["a", "b"]


async def test_a_newer_event_skips_one_waiting_for_its_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[tuple[str, int]] = []

    async def flaky(ctx: a2trio.HandlerContext[Ordered]) -> None:
        attempts.append((ctx.event.payload.item, ctx.attempt))
        if ctx.event.payload.item == "a":
            raise RuntimeError("a fails")

    retry = a2trio.Retry(5, backoff=lambda n: 60.0)
    handlers = {"ordered": a2trio.handler(flaky, debounce=a2trio.Debounce(1), retry=retry)}
    async with open_harness(orders, handlers=handlers) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("a")))
        await app.advance(5)
        await app.assert_outcome(session, 1, "failed", attempts=1, failures=1)
        await session.append(orders.event("ordered", Ordered("b")))
        await app.advance(120)
        await app.assert_outcome(session, 1, "skipped", attempts=1, failures=1)
        await app.assert_outcome(session, 2, "processed", attempts=1)
    assert attempts == [("a", 1), ("b", 1)]
