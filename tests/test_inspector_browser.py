"""The inspector page in a real browser (issue 18): headless Chromium opens
``/_a2/inspect`` of ``examples.payments``, sees the dead letter, presses
Redrive and sees the event settle."""

from __future__ import annotations

import os

import httpx
from playwright.sync_api import expect

from tests.browser_kit import chromium, serve

CHARGE = {"type": "charge", "payload": {"charge_id": "c1", "cents": 1250, "card": "flaky"}}


def test_a_dead_letter_is_redriven_from_the_page() -> None:
    with serve("examples.payments:app") as url, chromium() as browser:
        pushed = httpx.post(f"{url}/payments/acct-1", json={"events": [CHARGE]})
        assert pushed.status_code == 200, pushed.text
        page = browser.new_page()
        page.goto(f"{url}/_a2/inspect")
        dead = page.locator("#dead-letters tbody tr", has_text="acct-1")
        expect(dead).to_contain_text("ConnectionError: the gateway timed out collecting c1")
        expect(dead.locator("td").nth(1)).to_have_text("1")
        page.fill("#by", "browser-test")
        dead.get_by_role("button", name="Redrive").click()
        expect(page.locator("#dead-letters tbody")).to_have_text("no dead letters")
        expect(page.locator("#status")).to_have_text("")

        page.locator("#sessions a", has_text="acct-1").click()
        charge = page.locator("#events tbody tr[data-index='1']")
        expect(charge.locator("td.state")).to_have_text("processed")
        expect(charge).to_contain_text("redrive by browser-test")
        collected = page.locator("#events tbody tr[data-index='2']")
        expect(collected).to_contain_text("collected")
        shot = os.environ.get("A2_TEST_SCREENSHOT")
        if shot:
            page.screenshot(path=shot, full_page=True)


def test_a_refused_action_shows_the_reason() -> None:
    with serve("examples.payments:app") as url, chromium() as browser:
        pushed = httpx.post(f"{url}/payments/acct-2", json={"events": [CHARGE]})
        assert pushed.status_code == 200, pushed.text
        page = browser.new_page()
        page.goto(f"{url}/_a2/inspect")
        dead = page.locator("#dead-letters tbody tr", has_text="acct-2")
        dead.get_by_role("button", name="Skip").click()
        expect(page.locator("#status")).to_contain_text("400: `reason` must not be empty")
        page.fill("#reason", "refunded by hand")
        dead.get_by_role("button", name="Skip").click()
        expect(page.locator("#dead-letters tbody")).to_have_text("no dead letters")
        page.locator("#sessions a", has_text="acct-2").click()
        charge = page.locator("#events tbody tr[data-index='1']")
        expect(charge.locator("td.state")).to_have_text("skipped")
        expect(charge).to_contain_text("skip by operator: refunded by hand")
