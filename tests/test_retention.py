"""``server.retention`` (issue 35): export, archive and erase a session from
the Python API; refused while a handler holds a claim on it, logged on
``a2trio.retention`` without the payloads, bad input refused before the
store is asked."""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

import a2trio
from a2trio import RetentionError
from a2trio.stores.base import AppendEvent
from examples import retention as retention_example

from .apps import Cursor, Note, Ordered, orders, rooms


async def test_an_erasure_waits_for_the_running_handler() -> None:
    started, release = trio.Event(), trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        started.set()
        await release.wait()

    server = a2trio.Server(
        orders,
        store=a2trio.stores.memory(),
        handlers={"ordered": a2trio.handler(ship)},
        sweep=False,
    )
    async with server:
        session = server.session("s1")
        await session.append(orders.event("ordered", Ordered("secret-payload")))
        await started.wait()
        with pytest.raises(RetentionError) as refused:
            await server.retention.erase("s1", by="ann", reason="gdpr request 7")
        assert refused.value.reason == "claimed"
        assert refused.value.session_id == "s1", "named without the namespace"
        assert str(refused.value).startswith("session 's1' has event 1 claimed by ")
        assert len(await session.history()) == 1, "nothing removed"
        release.set()
        await server.settle()
        erased = await server.retention.erase("s1", by="ann", reason="gdpr request 7")
        assert (erased.session_id, erased.events) == ("s1", 1)
        assert await session.history() == []


async def test_an_erasure_is_logged_without_what_it_removed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio.retention")
    async with a2trio.Server(rooms, store=a2trio.stores.memory()) as server:
        room = server.session("r1")
        await room.append(rooms.event("note", Note("secret-payload")))
        await room.set_presence("ann", {"typing": True, "cursor": Cursor(1, 2)})
        erased = await server.retention.erase("r1", by="ann", reason="asked to forget")
        assert (erased.events, erased.presence) == (1, 2)
        assert await room.presence() == {}
        assert await room.history() == []
    [record] = [r for r in caplog.records if r.name == "a2trio.retention"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "erased session 'r1' of 'rooms': 1 events, 0 snapshots, 0 operator actions, "
        "2 presence rows, by 'ann': asked to forget"
    )
    assert "secret-payload" not in caplog.text


async def test_an_archive_holds_the_session_and_erases_it(tmp_path: Path) -> None:
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        session = server.session("s1")
        await session.append(orders.event("note", Note("one")), orders.event("note", Note("two")))
        other = server.session("s2")
        await other.append(orders.event("note", Note("kept")))
        target = tmp_path / "s1.jsonl"
        erased = await server.retention.archive("s1", target, by="ann", reason="closed")
        assert erased.events == 2
        lines = [json.loads(line) for line in target.read_text().splitlines()]
        assert lines[0] == {
            "kind": "session",
            "format": 1,
            "contract": "orders",
            "sessionId": "s1",
            "index": 2,
        }
        assert [(line["index"], line["payload"]) for line in lines[1:]] == [
            (1, {"text": "one"}),
            (2, {"text": "two"}),
        ]
        assert await session.history() == []
        assert len(await other.history()) == 1
        with pytest.raises(FileExistsError):
            await server.retention.archive("s2", target, by="ann", reason="closed")
        assert len(await other.history()) == 1, "a file in the way removes nothing"


async def test_an_archive_refuses_a_session_with_work_left(tmp_path: Path) -> None:
    server = a2trio.Server(
        orders,
        store=a2trio.stores.memory(),
        handlers={"ordered": a2trio.handler(_never)},
        sweep=False,
    )
    async with server:
        session = server.session("s1")
        # Appended at the store, unclaimed: no drain of this server runs it.
        await server.store.append(server.key("s1"), [AppendEvent("ordered", {"item": "pen"})])
        target = tmp_path / "s1.jsonl"
        with pytest.raises(RetentionError, match=r"has event 1 still to run") as refused:
            await server.retention.archive("s1", target, by="ann", reason="closed")
        assert refused.value.reason == "unprocessed"
        assert not target.exists()
        assert len(await session.history()) == 1


async def _never(ctx: a2trio.HandlerContext[Ordered]) -> None:
    raise AssertionError("not run")


async def test_bad_input_is_refused_before_the_store_is_asked(tmp_path: Path) -> None:
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        await server.session("s1").append(orders.event("note", Note("n")))
        with pytest.raises(ValueError, match=r"^`reason` must not be empty"):
            await server.retention.erase("s1", by="ann", reason=" ")
        with pytest.raises(ValueError, match=r"^`by` must not be empty"):
            await server.retention.erase("s1", by="", reason="r")
        with pytest.raises(TypeError, match=r"^`reason` must be a string"):
            await server.retention.erase("s1", by="ann", reason=None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^session id"):
            await server.retention.erase("a\x00b", by="ann", reason="r")
        with pytest.raises(TypeError, match=r"^session id"):
            await server.retention.export("")
        with pytest.raises(ValueError, match=r"^`reason` must not be empty"):
            await server.retention.archive("s1", tmp_path / "f", by="ann", reason="")
        assert not (tmp_path / "f").exists()
        assert len(await server.session("s1").history()) == 1


async def test_a_store_without_retention_is_refused() -> None:
    store = a2trio.stores.memory()
    cast("Any", store).retention = None  # a store without the capability
    async with a2trio.Server(orders, store=store) as server:
        with pytest.raises(a2trio.InspectionUnsupportedError, match="has no retention"):
            await server.retention.erase("s1", by="ann", reason="r")
        with pytest.raises(a2trio.InspectionUnsupportedError):
            await server.retention.export("s1")


def _count(state: int, event: a2trio.Event[Any]) -> int:
    return state + 1


COUNT = a2trio.Reducer("count", 0, _count)


async def test_a_trim_keeps_the_state_and_refuses_reads_below_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="a2trio.retention")
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        session = server.session("s1")
        for n in range(5):
            await session.append(orders.event("note", Note(f"n{n}")))
        with pytest.raises(RetentionError, match=r"no snapshot of reducer 'count'") as refused:
            await server.retention.trim("s1", COUNT, by="ann", reason="compact")
        assert refused.value.reason == "no_snapshot"
        assert await session.state(COUNT) == (5, 5)
        await server.settle()  # the snapshot's write-back
        trimmed = await server.retention.trim("s1", COUNT, by="ann", reason="compact")
        assert (trimmed.session_id, trimmed.through_index, trimmed.events) == ("s1", 4, 4)
        assert await session.state(COUNT) == (5, 5), "the snapshot covers what went"
        await session.append(orders.event("note", Note("n5")))
        assert await session.state(COUNT) == (6, 6)
        with pytest.raises(a2trio.A2Error) as below:
            await session.history()
        assert below.value.code is a2trio.ErrorCode.TRIMMED
        assert below.value.details == {"trimmedThrough": 4}
        assert [e.payload.text for e in await session.history(gte=5)] == ["n4", "n5"]
        with pytest.raises(a2trio.A2Error, match="trimmed through index 4"):
            await session.state(a2trio.Reducer("other", 0, _count))
        with pytest.raises(a2trio.A2Error, match="trimmed through index 4"):
            async with session.stream(0) as feed:
                await feed.receive()
        async with session.stream(4) as feed:
            assert (await feed.receive()).index == 5
        page = await server.inspect.read_session_page("s1")
        assert [e.event.index for e in page.events] == [5, 6], "inspection shows what is left"
        again = await server.retention.trim("s1", "count", by="ann", reason="again")
        assert (again.through_index, again.events) == (5, 1)
    messages = [r.getMessage() for r in caplog.records if r.name == "a2trio.retention"]
    assert messages == [
        "trimmed session 's1' of 'orders' through index 4 (reducer 'count'): 4 events, "
        "by 'ann': compact",
        "trimmed session 's1' of 'orders' through index 5 (reducer 'count'): 1 events, "
        "by 'ann': again",
    ]


async def test_a_trim_checks_its_input() -> None:
    async with a2trio.Server(orders, store=a2trio.stores.memory()) as server:
        with pytest.raises(TypeError, match=r"^`reducer` is an a2trio.Reducer or its name"):
            await server.retention.trim("s1", "", by="ann", reason="r")
        with pytest.raises(ValueError, match=r"^`reason` must not be empty"):
            await server.retention.trim("s1", COUNT, by="ann", reason="")


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres", "redis"])
async def test_the_example_runs(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = importlib.import_module(f"tests.backends.{backend}").open_store
    async with factory(a2trio.clock.SYSTEM_CLOCK) as store:
        await retention_example.main(store, tmp_path)
    # The output examples/retention.py's docstring shows.
    assert capsys.readouterr().out.splitlines() == [
        "state: 100 points through index 100",
        "trimmed through index 99: 99 events removed",
        "state after the trim: 101 points through index 101",
        "history from the start: TRIMMED (trimmed through 99)",
        "history after the trim point: [100, 101]",
        "archived: 3 events; the file's first line has sessionId game-2, index 3",
        "erased: 2 events, 1 presence rows; history now: []",
    ]
