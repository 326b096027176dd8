"""``python -m a2trio.inspect`` (issue 18): sessions and a session's events
with their status, as a table or JSON, with clear errors."""

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

class Note(msgspec.Struct, frozen=True):
    text: str

notes = a2trio.contract("notes", events={"note": Note})
other = a2trio.contract("other", events={"note": Note})
server = a2trio.Server(notes)
both = [server, a2trio.Server(other)]
not_a_server = 42
app = a2trio.transport.asgi(server)
both_app = a2trio.transport.asgi(*both)

async def foreign_app(scope, receive, send):
    pass
"""


class Note(msgspec.Struct, frozen=True):
    text: str


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A fresh app module (its servers are built at import, from A2_STORE)
    and the URL of a sqlite file holding two sessions of ``notes``."""
    name = f"inspect_app_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "notes.db"
    notes = a2trio.contract("notes", events={"note": Note})

    async def write() -> None:
        async with a2trio.Server(notes, store=a2trio.stores.sqlite(str(db))) as server:
            await server.session("s1").append(notes.event("note", Note("a")))
            await server.session("s1").append(notes.event("note", Note("b")))
            await server.session("s2").append(notes.event("note", Note("c")))

    trio.run(write)
    return name, f"sqlite:///{db}"


def test_sessions_as_a_table_and_as_json(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", name, "--store", url, "sessions", "--limit", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["session", "events", "pending", "dead", "attempts", "failures"]
    assert table[1].split() == ["s1", "2", "0", "0", "0", "0"]
    assert table[2] == "(more: --cursor s1)"


def test_events_with_their_status(
    tmp_path: Path, app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", name, "--store", url, "--json", "events", "s1"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [(e["event"]["index"], e["status"]["state"]) for e in page["events"]] == [
        (1, "settled"),
        (2, "settled"),
    ]
    assert (page["throughIndex"], page["nextIndex"]) == (2, None)


def test_a_table_of_events_and_the_next_page(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", name, "--store", url, "events", "s1", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["index", "type", "state", "attempts", "failures", "id", "trace"]
    assert lines[1].split()[:3] == ["1", "note", "settled"]
    assert lines[1].split()[-1] == "-"  # appended without a trace
    assert lines[2] == "(more: --after 1; through index 2)"


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        (":not_a_server", [], "is 42: expected an a2trio.Server, a list of them, or an ASGI app"),
        (":both", [], "holds servers for notes, other: pick one with --contract"),
        (":server", ["events", "a\x00b"], "session id 'a\\x00b' contains U+0000"),
        (":server", ["events", "s1", "--limit", "5000"], "at most 1000 items"),
    ],
)
def test_bad_input_is_one_line_and_status_1(
    app: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
    target: str,
    extra: list[str],
    message: str,
) -> None:
    name, url = app
    argv = ["--app", name + target, "--store", url, *(extra or ["sessions"])]
    assert main(argv) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("a2trio.inspect: ")
    assert message in line


def test_a_list_of_servers_takes_a_contract(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", f"{name}:both", "--contract", "notes", "--store", url, "sessions"]) == 0
    assert "s2" in capsys.readouterr().out


def test_an_app_that_serve_accepts_is_inspected(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = app
    assert main(["--app", f"{name}:app", "--store", url, "sessions"]) == 0
    assert "s2" in capsys.readouterr().out
    assert (
        main(["--app", f"{name}:both_app", "--contract", "notes", "--store", url, "sessions"]) == 0
    )
    assert "s2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--app", "{name}:foreign_app", "sessions"],
            "is an ASGI app that a2trio.transport.asgi did not build: name the Server",
        ),
        (["--app", "no_such_module_here", "sessions"], "cannot import 'no_such_module_here'"),
        (["--store", "bogus://", "--app", "{name}", "sessions"], "unknown store URL 'bogus://'"),
        (["--app", "{name}", "events", "nobody"], "no session 'nobody' in 'notes'"),
        (
            ["--store", "postgresql://root@127.0.0.1:1/none", "--app", "{name}", "sessions"],
            "STORE_UNAVAILABLE: list sessions failed: the store is unavailable (",
        ),
    ],
)
def test_usage_and_store_errors_are_one_line_naming_the_cause(
    app: tuple[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    name, url = app
    argv = [a.format(name=name) for a in argv]
    if "--store" not in argv:
        argv = ["--store", url, *argv]
    assert main(argv) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("a2trio.inspect: ")
    assert message in line


CRON_APP = """
import msgspec, a2trio

class Note(msgspec.Struct, frozen=True):
    text: str

notes = a2trio.contract("notes", events={"note": Note})
nightly = a2trio.cron(
    "nightly", "0 3 * * *", session="journal", timezone="Europe/Paris",
    events=lambda slot: [notes.event("note", Note(slot.isoformat()))],
)
hourly = a2trio.cron(
    "hourly", "0 * * * *", session="journal", catch_up="all",
    events=lambda slot: [notes.event("note", Note(slot.isoformat()))],
)
server = a2trio.Server(notes, crons=[nightly, hourly])
"""


def test_crons_with_their_last_and_next_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import datetime

    from a2trio.clock import SYSTEM_CLOCK
    from a2trio.ids import cron_event_id

    name = f"cron_app_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(CRON_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "notes.db"
    notes = a2trio.contract("notes", events={"note": Note})
    nightly = a2trio.cron(
        "nightly", "0 3 * * *", session="journal", timezone="Europe/Paris", events=lambda slot: []
    )
    now = SYSTEM_CLOCK.now_ms()
    last: datetime = nightly.at_or_before(now)
    slot_ms = int(last.timestamp()) * 1000

    async def fired() -> None:
        # The nightly cron's last slot, as a serving process appended it.
        async with a2trio.Server(notes, store=a2trio.stores.sqlite(str(db))) as server:
            event_id = cron_event_id("notes", "journal", "nightly", slot_ms, 0)
            await server.session("journal").append(notes.event("note", Note("x"), id=event_id))

    trio.run(fired)
    url = f"sqlite:///{db}"
    assert main(["--app", name, "--store", url, "crons"]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert table[0] == [
        "cron",
        "spec",
        "timezone",
        "session",
        "catch",
        "up",
        "last",
        "slot",
        "next",
        "slot",
    ]
    assert table[1][0] == "nightly"
    assert " ".join(table[1][1:6]) == "0 3 * * *"
    assert table[1][6:10] == ["Europe/Paris", "journal", "latest", last.isoformat()]
    assert table[1][10] == nightly.after(now).isoformat()
    assert table[2][:1] + table[2][6:10] == ["hourly", "UTC", "journal", "all", "-"]
    assert main(["--app", name, "--store", url, "--json", "crons"]) == 0
    crons = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["lastSlot"]) for c in crons] == [
        ("nightly", last.isoformat()),
        ("hourly", None),
    ]
