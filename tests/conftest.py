"""Shared fixtures: a clean environment and a mock clock."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's A2_* variables (A2_TEST_* configure the
    suite itself: which Postgres, and whether it is required)."""
    for key in list(os.environ):
        if key.startswith("A2_") and not key.startswith("A2_TEST_"):
            monkeypatch.delenv(key)
