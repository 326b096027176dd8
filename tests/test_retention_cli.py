"""``a2trio inspect export / archive / erase`` (issue 35): an operator exports
a session as JSON lines, archives a finished one to a file and erases one,
from the command line, against the app's SQLite file."""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import msgspec
import pytest
import trio

import a2trio
from a2trio.inspect import main
from a2trio.stores.base import AppendEvent

APP = """
import msgspec, a2trio

class Job(msgspec.Struct, frozen=True):
    name: str

jobs = a2trio.contract("jobs", events={"job": Job})

async def run(ctx):
    raise RuntimeError("the CLI never runs handlers")

server = a2trio.Server(jobs, handlers={"job": a2trio.handler(run, lane="jobs")})
"""


class Job(msgspec.Struct, frozen=True):
    name: str


JOBS = a2trio.contract("jobs", events={"job": Job})


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """An app module and a sqlite file: session s1 holds a dead letter
    (index 1) and an event still to run behind it in its lane (index 2);
    s2 one dead letter, a snapshot and a redrive's record, dead again; s3
    three processed events and a snapshot at 2."""
    name = f"retention_cli_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "jobs.db"

    async def fail(ctx: a2trio.HandlerContext[Job]) -> None:
        raise RuntimeError(f"cannot run {ctx.event.payload.name}")

    async def write() -> None:
        server = a2trio.Server(
            JOBS,
            store=a2trio.stores.sqlite(str(db)),
            handlers={"job": a2trio.handler(fail, lane="jobs")},
            timings=a2trio.Timings(max_failures=1),
        )
        async with server:
            await server.session("s1").append(JOBS.event("job", Job("a")))
            await server.session("s1").append(JOBS.event("job", Job("b")))
            await server.session("s2").append(JOBS.event("job", Job("c")))
            await server.settle()
            await server.store.put_snapshot(server.key("s2"), "count", 1, {"n": 1})
            await server.inspect.redrive("s2", 1, by="ann", reason="try again")
            await server.settle()
            done = [AppendEvent("job", {"name": f"d{n}"}, settled=True) for n in range(3)]
            await server.store.append(server.key("s3"), done)
            await server.store.put_snapshot(server.key("s3"), "count", 2, {"n": 2})

    trio.run(write)
    return name, f"sqlite:///{db}"


def test_export_prints_the_session_as_json_lines(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", name, "--store", url, "export", "s2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in lines] == ["session", "event", "snapshot", "action"]
    head, event, snapshot, action = lines
    assert head == {
        "kind": "session",
        "format": 1,
        "contract": "jobs",
        "sessionId": "s2",
        "index": 1,
    }
    assert (event["sessionId"], event["index"], event["payload"]) == ("s2", 1, {"name": "c"})
    assert event["failedAtMs"] is not None, "the bookkeeping travels with the event"
    assert event["attemptCount"] == 2
    assert (snapshot["reducerName"], snapshot["index"], snapshot["state"]) == (
        "count",
        1,
        {"n": 1},
    )
    assert (action["action"], action["by"], action["reason"]) == ("redrive", "ann", "try again")
    assert main(["--app", name, "--store", url, "--json", "events", "s2"]) == 0, "nothing removed"


def test_archive_writes_the_file_then_erases(
    app: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name, url = app
    assert main(["--app", name, "--store", url, "export", "s2"]) == 0
    exported = capsys.readouterr().out
    target = tmp_path / "s2.jsonl"
    caplog.set_level(logging.INFO, logger="a2trio.retention")
    argv = ["--app", name, "--store", url, "archive", "s2", "--to", str(target)]
    assert main([*argv, "--reason", "closed ticket", "--by", "ann"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "removed session 's2': 1 events, 1 snapshots, 1 operator actions, 0 presence rows"
    ]
    assert target.read_text() == exported
    [record] = [r for r in caplog.records if r.name == "a2trio.retention"]
    assert record.getMessage() == (
        f"archived to {str(target)!r} and erased session 's2' of 'jobs': 1 events, "
        "1 snapshots, 1 operator actions, 0 presence rows, by 'ann': closed ticket"
    )
    assert main(["--app", name, "--store", url, "events", "s2"]) == 1
    assert "no session 's2'" in capsys.readouterr().err
    assert main([*argv, "--reason", "again"]) == 1
    assert "File exists" in capsys.readouterr().err
    assert target.read_text() == exported, "an existing file is never overwritten"


def test_archive_refuses_a_session_with_work_left(
    app: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    target = tmp_path / "s1.jsonl"
    argv = ["--app", name, "--store", url, "archive", "s1", "--to", str(target), "--reason", "r"]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "a2trio.inspect: session 's1' has event 2 still to run: archive a finished session "
        "(let it run, or skip it, first)"
    ]
    assert not target.exists()
    assert main(["--app", name, "--store", url, "--json", "events", "s1"]) == 0
    assert len(json.loads(capsys.readouterr().out)["events"]) == 2


def test_erase_needs_a_reason_and_removes_everything(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    with pytest.raises(SystemExit) as usage:
        main(["--app", name, "--store", url, "erase", "s1"])
    assert usage.value.code == 2
    assert "--reason" in capsys.readouterr().err
    assert main(["--app", name, "--store", url, "--json", "erase", "s1", "--reason", "gdpr"]) == 0
    erased = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in erased.items() if k != "atMs"} == {
        "sessionId": "s1",
        "events": 2,
        "snapshots": 0,
        "actions": 0,
        "presence": 0,
    }
    assert main(["--app", name, "--store", url, "--json", "erase", "s1", "--reason", "gdpr"]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 0, "a repeat removes nothing"
    assert main(["--app", name, "--store", url, "--json", "dead-letters"]) == 0
    dead = json.loads(capsys.readouterr().out)["deadLetters"]
    assert [d["event"]["sessionId"] for d in dead] == ["s2"]
    assert main(["--app", name, "--store", url, "erase", "a\x00b", "--reason", "x"]) == 1
    assert "contains U+0000" in capsys.readouterr().err


def test_msgspec_payloads_in_an_archive_read_back(app: tuple[str, str], tmp_path: Path) -> None:
    name, url = app
    target = tmp_path / "s2.jsonl"
    assert (
        main(["--app", name, "--store", url, "archive", "s2", "--to", str(target), "--reason", "r"])
        == 0
    )
    [_, event, _, _] = target.read_text().splitlines()
    assert msgspec.convert(json.loads(event)["payload"], Job) == Job("c")


def test_trim_removes_the_events_below_a_snapshot(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    base = ["--app", name, "--store", url]
    with pytest.raises(SystemExit) as usage:
        main([*base, "trim", "s3", "--reason", "compact"])
    assert usage.value.code == 2
    assert "--reducer" in capsys.readouterr().err
    assert main([*base, "trim", "s3", "--reducer", "other", "--reason", "compact"]) == 1
    assert "has no snapshot of reducer 'other'" in capsys.readouterr().err
    assert main([*base, "trim", "s2", "--reducer", "count", "--reason", "compact"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "trimmed session 's2' through index 0: 0 events removed"
    ], "its one event is its last: it stays"
    assert main([*base, "trim", "s3", "--reducer", "count", "--reason", "compact"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "trimmed session 's3' through index 2: 2 events removed"
    ]
    assert main([*base, "--json", "events", "s3"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [e["event"]["index"] for e in page["events"]] == [3]
    argv = [*base, "--json", "trim", "s3", "--reducer", "count", "--reason", "again"]
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in again.items() if k != "atMs"} == {
        "sessionId": "s3",
        "reducerName": "count",
        "throughIndex": 2,
        "events": 0,
    }
