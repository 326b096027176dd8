"""Real-browser tests: Debian's headless Chromium driven by Playwright, and a
served app in a subprocess.

::

    from tests.browser_kit import chromium, serve

    def test_page() -> None:
        with serve("examples.board:server") as url, chromium() as browser:
            page = browser.new_page()
            page.goto(url + "/")

Both are plain context managers for plain (non-trio) tests: Playwright's sync
API runs its own event loop, and the app runs in ``python -m a2trio.serve``
(measured by coverage like any subprocess). The browser is the system's
(``/usr/bin/chromium``, or ``A2_TEST_CHROMIUM``); no browser build is ever
downloaded. A missing browser fails the test loudly: it is never skipped.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from playwright.sync_api import Browser, expect, sync_playwright

__all__ = ["CHROMIUM", "ROOT", "chromium", "serve"]

ROOT = Path(__file__).resolve().parent.parent
#: The browser under test: Debian's package (``apt-get install chromium``).
CHROMIUM = os.environ.get("A2_TEST_CHROMIUM", "/usr/bin/chromium")
#: How long a served app may take to print its banner.
START_TIMEOUT_S = 30.0
#: How long ``expect(...)`` waits for a page to show what it asserts
#: (Playwright's default is 5 s): a hang guard, since the assertion retries
#: until it holds, and a headless Chromium beside other test suites on two
#: cores can take seconds to render.
EXPECT_TIMEOUT_MS = 30_000


@contextmanager
def chromium(*, hosts: Sequence[str] = ()) -> Iterator[Browser]:
    """A headless Chromium for the block; closed after it.

    ``hosts`` are names the browser resolves to 127.0.0.1 (``app.test``,
    ``evil.test``): pages of several origins, all served by one local app,
    for cross-origin tests.

    Fails (never skips) when the browser is not installed: ``scripts/services``
    installs it, and a browser test that silently does not run proves nothing.
    """
    path = shutil.which(CHROMIUM)
    if path is None:
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: run `bash scripts/services` "
            "(apt-get install -y chromium), or point A2_TEST_CHROMIUM at one",
            pytrace=False,
        )
    # Playwright's own browser downloads are never used.
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with _plain_asyncio(), sync_playwright() as playwright:
        rules = ", ".join(f"MAP {host} 127.0.0.1" for host in hosts)
        browser = playwright.chromium.launch(
            executable_path=path,
            headless=True,
            args=[f"--host-resolver-rules={rules}"] if rules else [],
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def _plain_asyncio() -> Iterator[None]:
    """Playwright's sync API runs a plain asyncio loop of its own; trio-asyncio
    (``Server(asyncio=True)`` in an earlier test) leaves its own event loop
    policy installed process-wide, whose loops cannot run that way."""
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(policy)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@contextmanager
def serve(
    target: str, *args: str, cwd: Path = ROOT, output: list[str] | None = None
) -> Iterator[str]:
    """``python -m a2trio.serve target --port 0 --store memory: *args`` for the
    block; yields its base URL (``http://127.0.0.1:PORT``) and stops it with
    Ctrl-C after. Extra ``args`` may override ``--store`` (the last one wins).
    ``output``, when given, receives every line the command printed (stdout
    and stderr), complete once the block has ended.

    Raises:
      AssertionError: the command exited or printed no banner within
        ``START_TIMEOUT_S``, with everything it printed.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "a2trio.serve", target, "--port", "0"]
    process = subprocess.Popen(
        [*command, "--store", "memory:", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
    pump.start()
    seen: list[str] = []
    try:
        url = None
        while url is None:
            try:
                line = lines.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError("no banner in time:\n" + "\n".join(seen)) from None
            assert line is not None, "the server exited:\n" + "\n".join(seen)
            seen.append(line)
            if line.startswith("a2trio serving on"):
                url = line.split()[3]
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        pump.join(timeout=10)
        process.stdout.close()
        while not lines.empty():
            line = lines.get_nowait()
            if line is not None:
                seen.append(line)
        if output is not None:
            output.extend(seen)
