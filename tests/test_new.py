"""``a2trio new NAME`` (issue 36, item 8): the app it writes passes its own
test, type-checks under mypy --strict and serves its page; an existing folder
is never written over, and NAME must be a free Python identifier."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import cast

import httpx
import msgspec
import pytest
import trio

from a2trio.__main__ import main as a2trio_main
from a2trio.new import main
from tests.serve_kit import ROOT, start_serve

NAME = "jot"
FILES = ["README.md", "__init__.py", "app.py", "test_app.py", "web/app.js", "web/index.html"]


def environment() -> dict[str, str]:
    """This one, without A2_* settings, and the checkout's a2trio first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    return env | {"PYTHONPATH": str(ROOT), "MYPYPATH": str(ROOT)}


@pytest.fixture
def generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder holding a freshly written ``jot/``."""
    monkeypatch.chdir(tmp_path)
    assert main([NAME]) == 0
    return tmp_path


def test_it_writes_the_app_and_says_how_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert a2trio_main(["new", NAME]) == 0
    generated = tmp_path
    written = sorted(p.relative_to(generated / NAME).as_posix() for p in generated.rglob("*.*"))
    assert written == FILES
    out = capsys.readouterr().out
    assert f"a2trio serve {NAME}.app:server" in out
    assert f"pytest {NAME}" in out
    readme = (generated / NAME / "README.md").read_text()
    assert readme.startswith(f"# {NAME}\n")
    assert f"a2trio serve {NAME}.app:server\npytest {NAME}\n" in readme
    assert "{{" not in "".join(p.read_text() for p in generated.rglob("*.*"))


def test_an_existing_folder_is_not_written_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "app.py").write_text("mine")
    assert a2trio_main(["new", NAME]) == 1
    assert capsys.readouterr().err == f"a2trio new: ./{NAME} exists: not writing over it\n"
    assert [p.name for p in (tmp_path / NAME).iterdir()] == ["app.py"]
    assert (tmp_path / NAME / "app.py").read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("my-app", "'my-app' is not a Python identifier"),
        ("class", "'class' is not a Python identifier"),
        ("json", "'json' is already a module (the standard library)"),
        ("trio", "'trio' is already a module ("),
    ],
)
def test_a_name_that_is_no_free_identifier_is_a_usage_error(
    name: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([name])
    assert exit.value.code == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


async def test_the_python_m_forms_write_it_too(tmp_path: Path) -> None:
    for name, command in (("one", ["a2trio", "new"]), ("two", ["a2trio.new"])):
        await trio.run_process(
            [sys.executable, "-m", *command, name],
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
        )
        assert (tmp_path / name / "app.py").is_file()


async def test_the_app_passes_its_own_test_and_type_checks(generated: Path) -> None:
    async with trio.open_nursery() as nursery:

        async def run(name: str, *command: str) -> None:
            done = await trio.run_process(
                [sys.executable, "-m", *command],
                cwd=generated,
                env=environment(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            results[name] = (done.returncode, done.stdout.decode() + done.stderr.decode())

        results: dict[str, tuple[int, str]] = {}
        # As its README says (`pytest NAME`), warnings as errors.
        nursery.start_soon(
            run, "pytest", "pytest", NAME, "-q", "-p", "no:cacheprovider", "-W", "error"
        )
        nursery.start_soon(run, "mypy", "mypy", "--strict", "--no-incremental", NAME)
    status, output = results["pytest"]
    assert status == 0, output
    assert "1 passed" in output, output
    status, output = results["mypy"]
    assert status == 0, output
    assert "Success: no issues found in 3 source files" in output, output


@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
# httpx's inner stream generators, left mid-stream when the test stops reading.
@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
async def test_the_app_serves_its_page_and_counts_a_note(generated: Path) -> None:
    started = await start_serve(
        f"{NAME}.app:server", "--port", "0", "--store", "memory:", cwd=generated
    )
    try:
        async with httpx.AsyncClient(base_url=started.url, timeout=30) as http:
            page = await http.get("/")
            assert page.status_code == 200
            assert "text/html" in page.headers["content-type"]
            assert '<script src="app.js"' in page.text
            script = await http.get("/app.js")
            assert script.status_code == 200
            assert "new EventSource" in script.text
            health = await http.get("/_a2/health")
            assert health.status_code == 200, health.text
            note = {"note_id": "n1", "text": "three small words"}
            pushed = await http.post(
                "/notes/nb", json={"events": [{"type": "note_added", "payload": note}]}
            )
            assert pushed.status_code == 200, pushed.text
            # Followed as the page follows it; the handler takes its COUNT_S
            # (one real second here).
            frames = []
            sse = {"Accept": "text/event-stream"}
            with trio.fail_after(30):
                async with (
                    http.stream("GET", "/notes/nb?startAfter=0", headers=sse) as stream,
                    aclosing(cast("AsyncGenerator[str]", stream.aiter_lines())) as lines,
                ):
                    async for line in lines:
                        if line.startswith("data: "):
                            frames.append(msgspec.json.decode(line.removeprefix("data: ")))
                        if len(frames) == 2:
                            break
            assert [(f["type"], f["payload"]) for f in frames] == [
                ("note_added", note),
                ("note_counted", {"note_id": "n1", "words": 3}),
            ]
    finally:
        started.process.kill()
        await started.process.wait()
