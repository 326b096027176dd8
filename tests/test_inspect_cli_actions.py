"""``python -m a2trio.inspect`` dead-letters, redrive, skip and retry-now (issue
18): an operator finds a dead letter and puts it back in line from the
command line while the serving process takes it up by itself."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import msgspec
import pytest
import trio

import a2trio
from a2trio.inspect import main

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


def _worker(
    db: Path, ran: list[str] | None = None, done: trio.Event | None = None
) -> a2trio.Server:
    """The serving process: its handler fails without ``ran``; with it, it
    records each job and sets ``done`` after two. It sweeps as it opens."""

    async def run(ctx: a2trio.HandlerContext[Job]) -> None:
        if ran is None:
            raise RuntimeError(f"cannot run {ctx.event.payload.name}")
        ran.append(ctx.event.payload.name)
        if done is not None and len(ran) == 2:
            done.set()

    return a2trio.Server(
        JOBS,
        store=a2trio.stores.sqlite(str(db)),
        handlers={"job": a2trio.handler(run, lane="jobs")},
        timings=a2trio.Timings(max_failures=1),
    )


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    """An app module, and a sqlite file where session s1 holds a dead letter
    (index 1) blocking its lane (index 2), and s2 another dead letter."""
    name = f"inspect_actions_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "jobs.db"

    async def write() -> None:
        async with _worker(db) as server:
            await server.session("s1").append(JOBS.event("job", Job("a")))
            await server.session("s1").append(JOBS.event("job", Job("b")))
            await server.session("s2").append(JOBS.event("job", Job("c")))
            await server.settle()

    trio.run(write)
    return name, f"sqlite:///{db}", db


def test_dead_letters_as_a_table_and_as_json(
    app: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, _ = app
    assert main(["--app", name, "--store", url, "dead-letters", "--limit", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["session", "index", "type", "failures", "last", "error"]
    assert table[1].split()[:4] == ["s1", "1", "job", "1"]
    assert table[1].endswith("RuntimeError: cannot run a"), "the exception, not the traceback"
    assert table[2] == "(more: --cursor 1:s1)"
    assert main(["--app", name, "--store", url, "--json", "dead-letters", "--cursor", "1:s1"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [(d["event"]["sessionId"], d["status"]["state"]) for d in page["deadLetters"]] == [
        ("s2", "dead_lettered")
    ]


def test_a_redrive_from_the_cli_is_taken_up_by_the_serving_process(
    app: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, db = app
    argv = ["--app", name, "--store", url, "redrive", "s1", "1", "--reason", "fixed", "--by", "ann"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["action", "session", "index", "by", "reason"]
    assert lines[1].split() == ["redrive", "s1", "1", "ann", "fixed"]
    assert main(["--app", name, "--store", url, "redrive", "s1", "1"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "a2trio.inspect: event 1 of session 's1' is not dead-lettered: "
        "only a dead letter can be redriven"
    )

    ran: list[str] = []

    async def serve() -> None:
        done = trio.Event()
        async with _worker(db, ran, done) as server:
            with trio.fail_after(10):
                await done.wait()
            await server.settle()

    trio.run(serve)
    assert ran == ["a", "b"], "the sweep found it: redriven, then its lane"
    assert main(["--app", name, "--store", url, "--json", "events", "s1"]) == 0
    page = json.loads(capsys.readouterr().out)
    [first, second] = page["events"]
    assert first["status"]["state"] == "processed"
    assert [(a["action"], a["by"], a["reason"]) for a in first["actions"]] == [
        ("redrive", "ann", "fixed")
    ]
    assert second["actions"] == []


def test_skip_needs_a_reason_and_retry_now_names_what_it_woke(
    app: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, _ = app
    with pytest.raises(SystemExit) as usage:
        main(["--app", name, "--store", url, "skip", "s2", "1"])
    assert usage.value.code == 2
    assert "--reason" in capsys.readouterr().err
    argv = ["--app", name, "--store", url, "--json", "skip", "s2", "1", "--reason", "obsolete"]
    assert main(argv) == 0
    [action] = json.loads(capsys.readouterr().out)
    assert (action["action"], action["sessionId"], action["reason"]) == ("skip", "s2", "obsolete")
    assert main(["--app", name, "--store", url, "retry-now", "s2"]) == 1
    assert "has no event to retry" in capsys.readouterr().err
    assert main(["--app", name, "--store", url, "redrive", "s1", "1", "--by", "bo"]) == 0
    capsys.readouterr()
    assert main(["--app", name, "--store", url, "retry-now", "s1", "--reason", "now"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["retry_now", "s1", "1", lines[1].split()[3], "now"]
    assert main(["--app", name, "--store", url, "skip", "s1", "9", "--reason", "x"]) == 1
    assert "event 9 of session 's1' does not exist" in capsys.readouterr().err
