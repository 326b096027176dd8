"""``python -m a2trio.serve`` fails fast with one clear line (issue 18): a port
already taken, a database that does not exist."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "a2trio.serve", "examples.board:server", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_a_port_already_taken_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve("--port", str(port), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"a2trio: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert "Traceback" not in done.stderr


def test_a_database_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    url = "postgresql://root@127.0.0.1:5432/a2trio_no_such_database"
    done = serve("--port", "0", "--store", url, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("a2trio: the store for 'board' (PostgresStore(")
    assert line.endswith('database "a2trio_no_such_database" does not exist')
    assert "serving on" not in done.stdout
