"""Docs that are generated from code stay in sync with it; examples run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import a2trio
from a2trio.transport.wire import ERROR_STATUS

ROOT = Path(__file__).resolve().parent.parent


def test_errors_page_lists_every_code_with_its_status() -> None:
    text = (ROOT / "docs" / "errors.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|", text, re.MULTILINE))
    assert rows == {code.value: str(status) for code, status in ERROR_STATUS.items()}
    assert set(rows) == {code.value for code in a2trio.ErrorCode}


def test_quickstart_example_runs_on_the_default_sqlite_store(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(ROOT)
    script = str(ROOT / "examples" / "quickstart.py")
    first = subprocess.run(
        [sys.executable, script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "store: SqliteStore" in first.stdout
    assert "handler: shipping book (attempt 1)" in first.stdout
    assert "state: 2 events through index 2" in first.stdout
    assert (tmp_path / ".a2" / "dev.db").exists()
    again = subprocess.run(
        [sys.executable, script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Same client id: replayed, not duplicated, and no second handler run.
    assert "handler:" not in again.stdout
    assert "state: 2 events through index 2" in again.stdout
