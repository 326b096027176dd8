"""``python -m a2trio.serve``'s command line without serving: argument checks,
the store default, the reloader's configuration and its worker entry point.
(tests/test_serve.py runs the real command.)"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import hypercorn.config
import hypercorn.run
import msgspec
import pytest

import a2trio
import a2trio.cli.serve
from a2trio.serve import lanes, main
from a2trio.stores import memory
from a2trio.transport import App


class Note(msgspec.Struct, frozen=True):
    text: str


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` writes os.environ and sys.path: undo it after each test."""
    for name in ("A2_STORE", "A2_SERVE_TARGET", "A2_SERVE_GC_THRESHOLD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = ModuleType("cli_target")
    notes = a2trio.contract("notes", events={"note": Note})
    module.server = a2trio.Server(notes, store=memory())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cli_target", module)
    return module


@pytest.fixture
def reloader(monkeypatch: pytest.MonkeyPatch) -> list[hypercorn.config.Config]:
    """hypercorn's reloader, replaced by a recorder of the config it gets."""
    configs: list[hypercorn.config.Config] = []

    def run(config: hypercorn.config.Config) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(hypercorn.run, "run", run)
    return configs


def test_a_negative_gc_threshold_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["cli_target", "--gc-threshold", "-1"])
    assert exit.value.code == 2
    assert "--gc-threshold must be 0 or more, got -1" in capsys.readouterr().err


def test_reload_configures_hypercorns_reloader_and_the_store(
    target: ModuleType,
    reloader: list[hypercorn.config.Config],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Run as a console script would: the working directory is not on the path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    status = main(["cli_target", "--reload", "--port", "8123", "--gc-threshold", "0"])
    assert status == 0
    [config] = reloader
    assert config.application_path == "a2trio.cli.serve:_from_environ()"
    assert config.use_reloader
    assert config.bind == ["127.0.0.1:8123"]
    assert os.environ["A2_SERVE_TARGET"] == "cli_target"
    assert os.environ["A2_SERVE_GC_THRESHOLD"] == "0"
    # Development default: the embedded sqlite store, spelled as a URL.
    assert os.environ["A2_STORE"] == "sqlite:///.a2/dev.db"
    assert sys.path[0] == os.getcwd()
    assert "serving cli_target on http://127.0.0.1:8123 (reloading)" in capsys.readouterr().out


@pytest.mark.parametrize("env", ["test", "production"])
def test_test_and_production_keep_their_own_store_rules(
    env: str, target: ModuleType, reloader: list[hypercorn.config.Config], monkeypatch: Any
) -> None:
    monkeypatch.setenv("A2_ENV", env)
    assert main(["cli_target", "--reload"]) == 0
    assert "A2_STORE" not in os.environ


def test_the_reloaders_worker_loads_the_target_again(
    target: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuned: list[int] = []
    monkeypatch.setattr(a2trio.cli.serve, "tune_gc", tuned.append)
    monkeypatch.setenv("A2_SERVE_TARGET", "cli_target")
    app = a2trio.cli.serve._from_environ()
    assert isinstance(app, App)
    assert list(app.servers) == ["notes"]
    assert tuned == []  # no threshold given: Python's own settings
    monkeypatch.setenv("A2_SERVE_GC_THRESHOLD", "5000")
    a2trio.cli.serve._from_environ()
    assert tuned == [5000]


def test_the_banner_names_a_foreign_asgi_app() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    assert lanes(app, "http://127.0.0.1:1") == [f"  ASGI app {app!r} at http://127.0.0.1:1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_module_here:server"], "a2trio: cannot import 'no_such_module_here'"),
        (["cli_target:nothing"], "a2trio: module 'cli_target' has no attribute 'nothing'"),
    ],
)
def test_a_target_that_names_nothing_is_one_line(
    target: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(message)


def test_an_unknown_store_url_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = ModuleType("cli_target_default_store")
    # The module builds its server at import, from A2_STORE.
    module.__dict__["__getattr__"] = lambda name: a2trio.Server(
        a2trio.contract("notes", events={"note": Note})
    )
    monkeypatch.setitem(sys.modules, "cli_target_default_store", module)
    assert main(["cli_target_default_store:server", "--store", "bogus://x"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("a2trio: unknown store URL 'bogus://x'")


def test_an_import_error_inside_the_app_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    (tmp_path / "cli_broken_app.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        main(["cli_broken_app:server"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "argument --workers: must be 1 or more, got 0"),
        (["--workers", "-3"], "argument --workers: must be 1 or more, got -3"),
        (["--workers", "two"], "argument --workers: expected a whole number, got 'two'"),
        (["--workers", "1.5"], "argument --workers: expected a whole number, got '1.5'"),
        (["--workers", "2", "--reload"], "--reload runs one worker: drop --workers"),
    ],
)
def test_a_bad_worker_count_is_a_usage_error(
    target: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["cli_target", *argv])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_more_than_one_worker_on_a_memory_store_is_refused(
    target: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cli_target", "--workers", "2"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("a2trio: --workers 2: 'notes' uses MemoryStore(), which lives in one")


def test_the_help_says_what_workers_need(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--workers N" in capsys.readouterr().out
