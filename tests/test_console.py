"""The ``a2trio`` console command (issue 32): ``a2trio serve`` and ``a2trio
inspect`` run what ``python -m a2trio.serve`` / ``.inspect`` run, with the
same exit statuses; ``a2trio --help`` lists the commands and an unknown one
is a usage error. The dispatcher runs in-process; the installed console
script (``pyproject.toml``'s ``[project.scripts]``) runs from this venv's bin.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import httpx
import msgspec
import pytest
import trio

import a2trio
from a2trio.__main__ import main
from a2trio.stores import memory
from tests.serve_kit import ROOT, start_serve

#: The console script pip wrote for this environment.
SCRIPT = Path(sys.executable).parent / "a2trio"


class Note(msgspec.Struct, frozen=True):
    text: str


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools write os.environ and sys.path: undo it after each test."""
    monkeypatch.setenv("A2_STORE", "")
    monkeypatch.delenv("A2_STORE")
    monkeypatch.setattr(sys, "path", list(sys.path))


def script() -> str:
    assert SCRIPT.exists(), f"no {SCRIPT}: install again (bash scripts/install)"
    return str(SCRIPT)


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: a2trio")
    assert "\n  serve " in out
    assert "\n  inspect " in out
    assert "\n  new " in out


@pytest.mark.parametrize(
    ("argv", "said"),
    [([], "name a command: serve, inspect, new"), (["bogus"], "invalid choice: 'bogus'")],
)
def test_no_command_or_an_unknown_one_is_a_usage_error(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: a2trio")
    assert said in err


def test_a_commands_help_is_its_own_under_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: a2trio serve [-h] [--store STORE]")


def test_inspect_runs_the_inspector_with_its_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = ModuleType("console_target")
    notes = a2trio.contract("notes", events={"note": Note})
    module.server = a2trio.Server(notes, store=memory())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "console_target", module)
    assert main(["inspect", "--app", "console_target", "--json", "sessions"]) == 0
    assert msgspec.json.decode(capsys.readouterr().out)["sessions"] == []
    # A usage error of the tool itself: its own usage line and status.
    with pytest.raises(SystemExit) as exit:
        main(["inspect", "sessions"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.startswith("usage: a2trio inspect")


async def test_the_console_script_exits_as_python_m_does() -> None:
    """Same status and line for a target that names nothing, both ways."""
    argv = ["--app", "no_such_module:server", "sessions"]
    commands = [[script(), "inspect", *argv], [sys.executable, "-m", "a2trio.inspect", *argv]]
    done = [
        await trio.run_process(command, cwd=ROOT, capture_stderr=True, check=False)
        for command in commands
    ]
    assert [d.returncode for d in done] == [1, 1]
    assert done[0].stderr == done[1].stderr
    assert done[0].stderr.decode().startswith("a2trio.inspect: cannot import 'no_such_module'")


@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
async def test_the_console_script_serves_the_example_board_from_the_checkout() -> None:
    started = await start_serve(
        "examples.board:server", "--port", "0", "--store", "memory:", command=[script(), "serve"]
    )
    try:
        async with httpx.AsyncClient(base_url=started.url, timeout=30) as http:
            page = await http.get("/")
            assert page.status_code == 200
            assert "text/html" in page.headers["content-type"]
            health = await http.get("/_a2/health")
            assert health.status_code == 200, health.text
    finally:
        started.process.kill()
        await started.process.wait()
