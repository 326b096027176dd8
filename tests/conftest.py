"""Shared fixtures: a clean environment, and the worker processes a test starts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's A2_* variables (A2_TEST_* configure the
    suite itself: which Postgres, and whether it is required)."""
    for key in list(os.environ):
        if key.startswith("A2_") and not key.startswith("A2_TEST_"):
            monkeypatch.delenv(key)


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The worker processes a multi-process test starts (it appends each):
    killed, if still running, and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
