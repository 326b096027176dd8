"""The browser kit itself: the system's Chromium reaches a served app."""

from __future__ import annotations

import asyncio
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


class _RefusingPolicy(asyncio.DefaultEventLoopPolicy):
    """Stands for trio-asyncio's policy, which a Server(asyncio=True) leaves installed."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        raise AssertionError("the kit must not use the installed policy's loops")


def test_another_event_loop_policy_does_not_get_in_the_way() -> None:
    before = asyncio.get_event_loop_policy()
    policy = _RefusingPolicy()
    asyncio.set_event_loop_policy(policy)
    try:
        with chromium() as browser:
            assert browser.new_page().evaluate("1 + 1") == 2
        assert asyncio.get_event_loop_policy() is policy
    finally:
        asyncio.set_event_loop_policy(before)
