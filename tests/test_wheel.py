"""The wheel alone: built from the checkout and installed with nothing but its
core dependencies in a fresh venv, it serves the example board (issue 36).
And an editable install type-checks: mypy --strict in an app's own folder
finds the a2trio that ``pip install -e`` installed.

The checkout's ``a2trio`` is never on the server's path: the wheel is built
from a copy of the sources, and the server runs from a folder that holds only
a copy of ``examples/``, with the venv's interpreter and no ``PYTHONPATH``.
pip needs its index (or its cache) to fetch the core dependencies. To leave
this test out of a local run, ``pytest -m "not wheel"``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.serve_kit import ROOT, start_serve

pytestmark = pytest.mark.wheel

#: Modules of the extras, none of which the core install may bring.
EXTRAS = (
    "httpx",
    "psycopg",
    "coredis",
    "trio_asyncio",
    "opentelemetry",
    "prometheus_client",
    "cryptography",
    "pytest",
)


async def run(*command: str | Path, cwd: Path | None = None) -> str:
    """Run ``command`` to its end; its stdout, or a failure showing its output."""
    done = await trio.run_process(
        [str(part) for part in command],
        cwd=cwd,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    output = done.stdout.decode()
    assert done.returncode == 0, f"{command}:\n{output[-2000:]}\n{done.stderr.decode()[-4000:]}"
    return output


def copy_project(scratch: Path) -> Path:
    """The project's packaging files and package, copied into ``scratch``:
    building or installing in the checkout would write build/ and egg-info
    into it, under any other run of the suite."""
    project = scratch / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "a2trio", project / "a2trio", ignore=shutil.ignore_patterns("__pycache__")
    )
    return project


async def build_wheel(into: Path, scratch: Path) -> None:
    project = copy_project(scratch)
    await run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", into, project)


@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
async def test_the_wheel_alone_serves_the_example_board(tmp_path: Path) -> None:
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(build_wheel, dist, tmp_path)
        # No pip of its own: this environment's pip installs into it (faster).
        nursery.start_soon(run, sys.executable, "-m", "venv", "--without-pip", venv)
    [wheel] = dist.glob("a2trio-*.whl")
    python = venv / "bin" / "python"
    # The wheel with its core dependencies, resolved by pip (no --no-deps).
    await run(sys.executable, "-m", "pip", "-q", "--python", python, "install", wheel)
    # Where the server runs: a copy of examples/ and nothing else.
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "examples", site / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    installed = await run(python, "-c", "import a2trio; print(a2trio.__file__)", cwd=site)
    assert installed.startswith(str(venv)), installed
    present = await run(
        python,
        "-c",
        "import importlib.util, sys; "
        "print(*[m for m in sys.argv[1:] if importlib.util.find_spec(m)])",
        *EXTRAS,
        cwd=site,
    )
    assert present.split() == [], "the core install brought an extra's module"
    # A client that needs httpx says which extra brings it.
    needs = "from a2trio.transport import open_http_client"
    refused = await trio.run_process(
        [str(python), "-c", needs], cwd=site, capture_stderr=True, check=False
    )
    assert refused.returncode != 0
    assert "pip install 'a2trio[client]'" in refused.stderr.decode()
    # What `a2trio new` writes is package data the wheel holds.
    await run(python, "-m", "a2trio.new", "starter", cwd=site)
    assert (site / "starter" / "web" / "app.js").is_file()
    # So is the inspector's page (a2trio/transport/server/inspector.html).
    shown = "from a2trio.transport.server.inspector import page; print(b'<html' in page([]))"
    assert await run(python, "-c", shown, cwd=site) == "True\n"
    started = await start_serve(
        "examples.board:server",
        "--port",
        "0",
        cwd=site,
        env={"A2_STORE": f"sqlite:///{tmp_path / 'board.db'}"},
        python=str(python),
    )
    try:
        async with httpx.AsyncClient(base_url=started.url, timeout=30) as http:
            page = await http.get("/")
            assert page.status_code == 200, page.text
            assert "text/html" in page.headers["content-type"]
            health = await http.get("/_a2/health")
            assert health.status_code == 200, health.text
            added = {"type": "task_added", "payload": {"task_id": "t1", "title": "ship"}}
            pushed = await http.post("/board/b1", json={"events": [added]})
            assert pushed.status_code == 200, pushed.text
            history = await http.get("/board/b1", params={"gte": 1, "lte": 1})
            assert [e["type"] for e in history.json()["events"]] == ["task_added"]
    finally:
        started.process.kill()
        await started.process.wait()


async def test_an_editable_install_type_checks_from_an_apps_own_folder(tmp_path: Path) -> None:
    project, venv = copy_project(tmp_path), tmp_path / "venv"
    await run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    await run(sys.executable, "-m", "pip", "-q", "--python", python, "install", "-e", project)
    app = tmp_path / "shop"
    app.mkdir()
    (app / "shop.py").write_text(
        "import msgspec\n"
        "import a2trio\n\n\n"
        "class Ordered(msgspec.Struct, frozen=True):\n"
        "    item: str\n\n\n"
        'orders = a2trio.contract("orders", events={"ordered": Ordered})\n'
        "server = a2trio.Server(orders, store=a2trio.stores.memory())\n"
        "count: int = server.contract\n"  # a mistake mypy must see through a2trio's types
    )
    # This environment's mypy, reading the fresh venv's site-packages only
    # (no MYPYPATH, no PYTHONPATH): what `mypy --strict` in the app's folder sees.
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    checked = await trio.run_process(
        [*mypy, "--python-executable", str(python), "shop.py"],
        cwd=app,
        capture_stdout=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")},
    )
    report = checked.stdout.decode()
    assert "Cannot find implementation or library stub" not in report, report
    assert 'Incompatible types in assignment (expression has type "Contract' in report, report
    assert report.strip().endswith("Found 1 error in 1 file (checked 1 source file)"), report
