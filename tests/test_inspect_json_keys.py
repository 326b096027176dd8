"""Every JSON an operator reads is in the wire's camelCase (issue 36):
``a2trio inspect --json`` and ``/_a2/inspect`` answer through one set of
records (``a2trio.transport.wire``), so no key holds an ``_``. Payloads are
the application's own and keep their keys."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

import a2trio
from a2trio.inspect import main
from a2trio.transport import Operation, Request, asgi
from a2trio.transport.wire import inspection
from tests.test_transport import collect_client_garbage, pytestmark, serving

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

APP = """
import msgspec, a2trio

class Job(msgspec.Struct, frozen=True):
    job_name: str

jobs = a2trio.contract("jobs", events={"job": Job})
nightly = a2trio.cron(
    "nightly_run", "0 3 * * *", session="journal", events=lambda slot: [],
)
server = a2trio.Server(jobs, crons=[nightly])
"""


class Job(msgspec.Struct, frozen=True):
    job_name: str


JOBS = a2trio.contract("jobs", events={"job": Job})


def _dead_letters(db: Path) -> None:
    """s1 holds a dead letter blocking its lane, s2 and s3 one each."""

    async def run(ctx: a2trio.HandlerContext[Job]) -> None:
        raise RuntimeError(f"cannot run {ctx.event.payload.job_name}")

    async def write() -> None:
        async with a2trio.Server(
            JOBS,
            store=a2trio.stores.sqlite(str(db)),
            handlers={"job": a2trio.handler(run, lane="jobs")},
            timings=a2trio.Timings(max_failures=1),
        ) as server:
            for session in ("s1", "s1", "s2", "s3"):
                await server.session(session).append(JOBS.event("job", Job("a")))
            await server.settle()

    trio.run(write)


def _keys(value: Any, where: str = "") -> list[str]:
    """Every key in ``value``'s JSON, by path (a payload's keys are its own)."""
    if isinstance(value, list):
        return [key for n, item in enumerate(value) for key in _keys(item, f"{where}[{n}]")]
    if not isinstance(value, dict):
        return []
    found = [f"{where}.{key}" for key in value]
    for key, item in value.items():
        if key != "payload":
            found += _keys(item, f"{where}.{key}")
    return found


def _allowed(request: Request, op: Operation) -> bool:
    return True


def test_every_key_the_cli_and_the_inspector_answer_is_camel_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"inspect_keys_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "jobs.db"
    _dead_letters(db)
    answers: dict[str, Any] = {}

    async def over_http() -> None:
        # No handlers, as the CLI's app: nothing runs what the actions wake.
        server = a2trio.Server(JOBS, store=a2trio.stores.sqlite(str(db)))
        app = asgi(server, inspect=True, authorize=_allowed)
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=5) as c:
            for path in ("", "?view=dead-letters", "/s1"):
                answer = await c.get(f"/_a2/inspect/jobs{path}")
                assert answer.status_code == 200, answer.text
                answers[f"GET{path}"] = answer.json()
            bulk = {"action": "skip", "by": "ann", "reason": "x", "dryRun": True}
            answer = await c.post("/_a2/inspect/jobs", json=bulk)
            assert answer.status_code == 200, answer.text
            answers["POST bulk"] = answer.json()
            body = {"by": "ann", "reason": "on_purpose"}
            # retry-now answers the same {"actions": [...]} (the CLI runs it below).
            for path in ("/s1/1/redrive", "/s2/1/skip"):
                answer = await c.post(f"/_a2/inspect/jobs{path}", json=body)
                assert answer.status_code == 200, answer.text
                answers[f"POST{path}"] = answer.json()

    trio.run(over_http)
    url = f"sqlite:///{db}"
    for argv in (
        ["sessions"],
        ["events", "s1"],
        ["dead-letters"],
        ["crons"],
        ["bulk", "redrive", "--prefix", "s3", "--dry-run"],
        ["redrive", "s3", "1"],
        ["retry-now", "s3"],
        ["skip", "s3", "1", "--reason", "on_purpose"],
        ["erase", "s3", "--reason", "on_purpose"],
    ):
        assert main(["--app", name, "--store", url, "--json", *argv]) == 0, argv
        answers[" ".join(argv)] = json.loads(capsys.readouterr().out)

    # Each shape holds each kind of record, so every key is seen.
    assert answers["GET?view=dead-letters"]["deadLetters"][0]["actions"] == []
    assert answers["GET/s1"]["events"][0]["status"]["lastError"]
    assert answers["GET/s1"]["events"][0]["failedAttempts"][0]["failedAtMs"]
    assert answers["events s1"]["events"][0]["actions"][0]["atMs"]
    assert answers["crons"][0]["sessionId"] == "journal"
    assert answers["POST bulk"]["items"][0]["sessionId"] == "s1"
    assert answers["bulk redrive --prefix s3 --dry-run"]["dryRun"] is True
    assert answers["erase s3 --reason on_purpose"]["actions"] == 3
    # An export's JSON lines too (an archive's file holds the same).
    assert main(["--app", name, "--store", url, "export", "s1"]) == 0
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in exported] == ["session", "event", "event", "action"]
    answers["export s1"] = exported
    assert answers["GET/s1"]["events"][0]["event"]["payload"] == {"job_name": "a"}
    keys = [key for asked, answer in answers.items() for key in _keys(answer, asked)]
    assert len(keys) > 100
    assert [key for key in keys if "_" in key.rpartition(".")[2]] == []
    # And the records' names, a snapshot's too (no app here keeps one).
    records = [getattr(inspection, name) for name in inspection.__all__ if name.startswith("Wire")]
    assert len(records) == 16
    for record in records:
        for field in msgspec.structs.fields(record):
            assert "_" not in field.encode_name, (record, field)
