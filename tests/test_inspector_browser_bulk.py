"""The inspector page's bulk control in a real browser (issue 35): preview
what a filter matches, redrive every match, and skip the rest once confirmed
(an empty filter), each refusal and count shown."""

from __future__ import annotations

import httpx
from playwright.sync_api import Dialog, expect

from tests.browser_kit import chromium, serve
from tests.test_inspector_browser import charge


def test_a_filter_is_previewed_redriven_and_the_rest_skipped_from_the_page() -> None:
    with serve("examples.payments:app") as url, chromium() as browser:
        for session, charge_id in (("acct-1", "c1"), ("acct-2", "c2"), ("team-7", "c7")):
            body = {"events": [charge(charge_id, "flaky")]}
            pushed = httpx.post(f"{url}/payments/{session}", json=body)
            assert pushed.status_code == 200, pushed.text
        page = browser.new_page()
        page.goto(f"{url}/_a2/inspect")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(3)
        page.fill("#by", "browser-bulk")
        page.fill("#b-error", "timed out")
        page.fill("#b-prefix", "acct-")
        page.click("#b-preview")
        result = page.locator("#bulk-result")
        expect(result).to_have_text("would touch 2: acct-1 #1, acct-2 #1")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(3)

        page.click("#b-redrive")
        expect(result).to_have_text("redrive: matched 2, acted 2, refused 0")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(1)
        expect(page.locator("#dead-letters tbody tr")).to_contain_text("team-7")

        page.fill("#b-error", "")
        page.fill("#b-prefix", "")
        asked: list[str] = []

        def confirm(dialog: Dialog) -> None:
            asked.append(dialog.message)
            dialog.accept()

        page.on("dialog", confirm)
        page.click("#b-skip")
        expect(page.locator("#status")).to_contain_text("400: `reason` must not be empty")
        page.fill("#reason", "written off")
        page.click("#b-skip")
        expect(result).to_have_text("skip: matched 1, acted 1, refused 0")
        assert asked == ["skip every dead letter of payments?"] * 2, "an empty filter asks"
        expect(page.locator("#dead-letters tbody")).to_have_text("no dead letters")
        page.locator("#sessions a", has_text="team-7").click()
        first = page.locator("#events tbody tr[data-index='1']")
        expect(first.locator("td.state")).to_have_text("skipped")
        expect(first).to_contain_text("skip by browser-bulk: written off")
        page.locator("#sessions a", has_text="acct-1").click()
        redriven = page.locator("#events tbody tr[data-index='1']")
        expect(redriven).to_contain_text("redrive by browser-bulk")
