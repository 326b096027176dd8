"""Each attempt's error (issue 36): ``server.inspect`` answers every failed
attempt of an event (its error, when, the holder, its claim time), on the
event pages and the dead letters, and reads them only for events that
failed; ``a2trio inspect`` lists them under its tables and shows them whole
for one event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.inspect import main
from a2trio.stores.base import FailedAttempt
from a2trio.testing import TrioClock, open_harness

from .apps import Ordered, orders


async def test_every_failed_attempt_is_answered_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tries: list[int] = []

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        tries.append(ctx.attempt)
        await trio.sleep(0.25)
        if ctx.event.payload.item == "broken" or ctx.attempt < 3:
            raise RuntimeError(f"{ctx.event.payload.item}: try {ctx.attempt} failed")

    store = a2trio.stores.memory(clock=TrioClock())
    timings = a2trio.Timings(max_failures=3)
    async with open_harness(
        orders, handlers={"ordered": ship}, store=store, timings=timings
    ) as app:
        session = app.session("s1")
        await session.append(orders.event("ordered", Ordered("book")))
        await session.append(orders.event("ordered", Ordered("broken")))
        for _ in range(20):
            await app.advance(5)
        page = await app.server.inspect.read_session_page("s1")
        book, broken = page.events
        assert book.status.state == "processed"
        assert [(f.attempt, f.index) for f in book.failed_attempts] == [(1, 1), (2, 1)]
        for failure in book.failed_attempts:
            assert f"RuntimeError: book: try {failure.attempt} failed" in failure.error
            assert failure.holder, "the holder whose claim ran it"
            assert failure.claimed_at_ms is not None
            assert failure.failed_at_ms - failure.claimed_at_ms == 250, "it ran 0.25 s"
        assert broken.status.state == "dead_lettered"
        assert [f.attempt for f in broken.failed_attempts] == [1, 2, 3]
        assert broken.status.last_error == broken.failed_attempts[-1].error

        dead = await app.server.inspect.list_dead_letters()
        [letter] = dead.dead_letters
        assert letter.failed_attempts == broken.failed_attempts


async def test_a_page_without_failures_reads_no_history() -> None:
    store = a2trio.stores.memory()
    asked: list[tuple[str, list[int]]] = []
    read_failures = store.inspect.read_failures

    async def counted(session_id: str, indexes: Any) -> list[FailedAttempt]:
        asked.append((session_id, list(indexes)))
        return await read_failures(session_id, indexes)

    store.inspect.read_failures = counted  # type: ignore[method-assign]

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        if ctx.event.payload.item == "broken":
            raise RuntimeError("no stock")

    timings = a2trio.Timings(max_failures=1)
    async with a2trio.Server(orders, store=store, handlers={"ordered": ship}, timings=timings) as s:
        await s.session("ok").append(*(orders.event("ordered", Ordered(f"{n}")) for n in range(3)))
        await s.session("bad").append(
            orders.event("ordered", Ordered("fine")), orders.event("ordered", Ordered("broken"))
        )
        await s.settle()
        quiet = await s.inspect.read_session_page("ok")
        assert [e.failed_attempts for e in quiet.events] == [[], [], []]
        assert asked == [], "no event failed: no read"
        noisy = await s.inspect.read_session_page("bad")
        assert asked == [(s.key("bad"), [2])], "only the event that failed is read"
        assert [len(e.failed_attempts) for e in noisy.events] == [0, 1]


APP = """
import msgspec, a2trio

class Job(msgspec.Struct, frozen=True):
    name: str

jobs = a2trio.contract("jobs", events={"job": Job})
server = a2trio.Server(jobs)
"""


class Job(msgspec.Struct, frozen=True):
    name: str


JOBS = a2trio.contract("jobs", events={"job": Job})


@pytest.fixture
def failed_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """An app module and its SQLite store, where session s1's event 1 failed
    twice (dead-lettered; retried at once by ``retry_now``) and event 2 ran."""
    (tmp_path / "failed_jobs.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))

    async def run(ctx: a2trio.HandlerContext[Job]) -> None:
        if ctx.event.payload.name == "bad":
            raise ValueError(f"bad job, attempt {ctx.attempt}")

    async def write() -> None:
        server = a2trio.Server(
            JOBS,
            store=a2trio.stores.sqlite(str(tmp_path / "jobs.db")),
            handlers={"job": run},
            timings=a2trio.Timings(max_failures=2),
        )
        async with server:
            await server.session("s1").append(JOBS.event("job", Job("bad")))
            await server.settle()
            assert await server.inspect.retry_now("s1", by="test")
            await server.settle()
            assert (await server.inspect.list_dead_letters()).dead_letters, "failed twice"
            await server.session("s1").append(JOBS.event("job", Job("good")))
            await server.settle()

    trio.run(write)
    return "failed_jobs", f"sqlite:///{tmp_path / 'jobs.db'}"


def test_the_cli_lists_each_failed_attempt_and_shows_one_event_whole(
    failed_app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = failed_app
    assert main(["--app", name, "--store", url, "events", "s1"]) == 0
    table = capsys.readouterr().out
    assert "failed attempts:" in table
    [first, second] = [line for line in table.splitlines() if line.startswith("  #1 ")]
    assert "attempt 1" in first
    assert "ValueError: bad job, attempt 1" in first
    assert "attempt 2" in second
    assert "ValueError: bad job, attempt 2" in second
    assert "#2 " not in table.split("failed attempts:")[1], "event 2 never failed"

    assert main(["--app", name, "--store", url, "dead-letters"]) == 0
    dead = capsys.readouterr().out
    assert "  s1 #1  attempt 2" in dead

    assert main(["--app", name, "--store", url, "event", "s1", "1"]) == 0
    detail = capsys.readouterr().out
    assert detail.startswith("event s1 #1: job (")
    assert "state      dead_lettered, 2 attempts, 2 failures" in detail
    assert '"name": "bad"' in detail
    assert detail.count("Traceback (most recent call last)") == 2, "each error whole"
    assert "retry_now by test" in detail

    assert main(["--app", name, "--store", url, "--json", "event", "s1", "1"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [f["attempt"] for f in answer["failedAttempts"]] == [1, 2]
    assert set(answer["failedAttempts"][0]) == {
        "index",
        "attempt",
        "error",
        "failedAtMs",
        "holder",
        "claimedAtMs",
    }

    assert main(["--app", name, "--store", url, "event", "s1", "3"]) == 1
    assert "no event 3 in session 's1' of 'jobs' (it has 2)" in capsys.readouterr().err
