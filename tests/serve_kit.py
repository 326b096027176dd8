"""Starting ``python -m a2trio.serve`` in a subprocess, as the tests that need
a real server process do."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "Started", "start_serve"]


class Started:
    """A started server: its process, its base URL, and what it printed up to
    and including its banner (``a2trio serving on ...`` through ``Ctrl-C``)."""

    def __init__(self, process: trio.Process, url: str, banner: str) -> None:
        self.process = process
        self.url = url
        self.banner = banner


async def start_serve(
    target: str,
    *args: str,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60,
    python: str | None = None,
    command: Sequence[str] | None = None,
) -> Started:
    """Run ``python -m a2trio.serve TARGET ARGS`` in ``cwd`` (``command`` in
    place of ``python -m a2trio.serve``: say, the ``a2trio serve`` console
    script) and return once its banner is out. The environment is this one
    without ``A2_*`` settings, plus ``PYTHONPATH`` (the checkout) and ``env``.
    Output goes to a pipe the caller may read on (the server logs little, far
    below a pipe's buffer).

    With ``python`` (another environment's interpreter) that one runs the
    a2trio installed in it: no ``PYTHONPATH`` to the checkout.
    """
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("A2_") and k != "PYTHONPATH"
    }
    if python is None:
        environment["PYTHONPATH"] = str(ROOT)
    environment |= env or {}
    process = await trio.lowlevel.open_process(
        [*(command or [python or sys.executable, "-m", "a2trio.serve"]), target, *args],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    output = b""
    try:
        with trio.fail_after(timeout_s):
            while b"Ctrl-C" not in output:
                chunk = await process.stdout.receive_some()
                assert chunk, output.decode()
                output += chunk
    except BaseException:
        process.kill()
        await process.wait()
        raise
    banner = output.decode()
    line = next(x for x in banner.splitlines() if x.startswith("a2trio serving on"))
    return Started(process, line.split()[3], banner)
