"""The browser kit itself: the system's Chromium reaches a served app."""

from __future__ import annotations

import json

import pytest

from tests import browser_kit
from tests.browser_kit import chromium, serve


def test_chromium_reads_a_served_app() -> None:
    with serve("examples.board:server") as url, chromium() as browser:
        page = browser.new_page()
        response = page.goto(url + "/_a2/health")
        assert response is not None
        assert response.status == 200
        assert json.loads(page.inner_text("body"))["status"] == "ok"
        assert browser.version.split(".")[0].isdigit()


def test_a_missing_chromium_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser_kit, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="Chromium is not installed"), chromium():
        pass
