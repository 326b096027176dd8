"""``python -m a2trio.serve`` serves a module's ``static`` pages beside its servers."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import a2trio
from a2trio.serve import lanes, load_target
from a2trio.stores import memory
from a2trio.transport import App
from examples.board import board


def module_with(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> str:
    module = types.ModuleType("browser_serve_target")
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_the_example_board_serves_its_page() -> None:
    app = load_target("examples.board:server")
    assert isinstance(app, App)
    [(prefix, static)] = app.static.mounts
    assert prefix == []
    assert (static.root / "index.html").is_file()
    assert any(
        line.endswith("(open it in a browser)") and "http://h:1/  pages from" in line
        for line in lanes(app, "http://h:1")
    )


def test_a_list_of_servers_with_pages_under_a_prefix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    servers = [a2trio.Server(board, store=memory())]
    name = module_with(monkeypatch, servers=servers, static={"/web": tmp_path})
    app = load_target(f"{name}:servers")
    assert isinstance(app, App)
    assert f"  GET  http://h:1/web/  pages from {tmp_path} (open it in a browser)" in lanes(
        app, "http://h:1"
    )


def test_no_static_and_a_bad_static(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = a2trio.Server(board, store=memory())
    app = load_target(f"{module_with(monkeypatch, server=server)}:server")
    assert isinstance(app, App)
    assert not app.static
    assert not [line for line in lanes(app, "http://h:1") if "pages from" in line]
    bad = module_with(monkeypatch, server=server, static=str(tmp_path), app=app)
    with pytest.raises(ValueError, match=r"static is .*: expected \{prefix: directory\}"):
        load_target(f"{bad}:server")
    # An app of the module's own is served as it is: `static` is not asked.
    assert load_target(f"{bad}:app") is app
