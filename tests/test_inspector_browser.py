"""The inspector page in a real browser (issues 18 and 36): headless Chromium
opens ``/_a2/inspect`` of ``examples.payments``, sees the dead letter, presses
Redrive and sees the event settle; reads payloads, errors and timings,
filters, follows a session live over its SSE lane, and fits a phone.
Screenshots land in the test's tmp dir (and, with ``A2_TEST_SCREENSHOTS=DIR``,
in ``DIR/inspector-desktop.png`` and ``DIR/inspector-phone.png``: the ones in
``docs/`` are made that way)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
from playwright.sync_api import Request, expect

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


def charge(charge_id: str, card: str) -> dict[str, object]:
    return {"type": "charge", "payload": {"charge_id": charge_id, "cents": 990, "card": card}}


CLOCK = re.compile(r"\d\d:\d\d:\d\d")


def test_the_dashboard_shows_payloads_errors_timings_filters_and_follows_live(
    tmp_path: Path,
) -> None:
    shots = os.environ.get("A2_TEST_SCREENSHOTS")
    with serve("examples.payments:app") as url, chromium() as browser:
        for session, body in (("acct-1", CHARGE), ("acct-2", charge("c2", "ok"))):
            pushed = httpx.post(f"{url}/payments/{session}", json={"events": [body]})
            assert pushed.status_code == 200, pushed.text
        pushed = httpx.post(f"{url}/payments/team-7", json={"events": [charge("c7", "ok")]})
        assert pushed.status_code == 200, pushed.text
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        requests: list[str] = []

        def note(request: Request) -> None:
            requests.append(request.url)

        page.on("request", note)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{url}/_a2/inspect")

        # A favicon of its own, inline: the browser asks for no /favicon.ico.
        icon = page.locator("link[rel=icon]").get_attribute("href")
        assert icon is not None
        assert icon.startswith("data:image/svg+xml,"), icon

        # The dead letter: which attempt failed when, its traceback, its payload.
        dead = page.locator("#dead-letters tbody tr", has_text="acct-1")
        error = dead.locator("td.error summary")
        expect(error).to_have_text(
            re.compile(r"attempt 1 at \d\d:\d\d:\d\d: ConnectionError: the gateway timed out")
        )
        expect(dead.locator("td.when")).to_have_text(CLOCK)
        error.click()
        expect(dead.locator("td.error pre")).to_contain_text(
            re.compile(r"attempt 1 failed \d{4}-\d\d-\d\dT[\d:.]+Z on \S+, after [\d.]+ s:")
        )
        expect(dead.locator("td.error pre")).to_contain_text("Traceback (most recent call last)")
        dead.locator("td.payload summary").click()
        expect(dead.locator("td.payload pre")).to_contain_text('"cents": 1250')

        # Filters: a session prefix, a status; the view is kept in the address.
        sessions = page.locator("#sessions tbody tr")
        expect(sessions).to_have_count(3)
        page.fill("#f-session", "acct")
        expect(sessions).to_have_count(2)
        expect(page.locator("#sessions-count")).to_have_text("(2 of 3)")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(1)
        page.fill("#f-session", "team")
        expect(page.locator("#dead-letters tbody")).to_have_text("none of 1 match the filters")
        page.fill("#f-session", "")
        page.select_option("#f-status", "dead_lettered")
        expect(sessions).to_have_count(1)
        expect(sessions).to_contain_text("acct-1")
        assert "status=dead_lettered" in page.url
        page.click("#filters button[type=reset]")
        expect(sessions).to_have_count(3)

        # A session's events: the state, timings and payload of each.
        page.locator("#sessions a", has_text="acct-2").click()
        first = page.locator("#events tbody tr[data-index='1']")
        expect(first.locator("td.state")).to_have_text("processed")
        expect(first.locator("td.timing")).to_contain_text("lane payments")
        expect(first.locator("td.timing")).to_contain_text(
            re.compile(r"processed \d\d:\d\d:\d\d by attempt 1, [\d.]+ (s|min) after")
        )
        expect(page.locator("#events tbody tr[data-index='2'] td.state")).to_have_text("settled")
        page.fill("#f-type", "collected")
        expect(page.locator("#events tbody tr")).to_have_count(1)
        expect(page.locator("#events-count")).to_have_text("(1 of 2)")
        page.fill("#f-type", "")

        # Live: the session's own SSE lane, from its last index.
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        lane = f"{url}/payments/acct-2?startAfter=2"
        assert lane in requests, requests
        pushed = httpx.post(f"{url}/payments/acct-2", json={"events": [charge("c3", "ok")]})
        assert pushed.status_code == 200, pushed.text
        expect(page.locator("#events tbody tr[data-index='4']")).to_contain_text("collected")
        page.locator("#events tbody tr[data-index='3'] td.payload summary").click()
        expect(page.locator("#events tbody tr[data-index='3'] td.payload pre")).to_contain_text(
            '"charge_id": "c3"'
        )

        # Each attempt's error: an expired card fails, is redriven, fails
        # again; both attempts are listed under it, oldest first.
        error.click()
        expect(dead.locator("td.error pre")).to_be_hidden()
        pushed = httpx.post(f"{url}/payments/acct-9", json={"events": [charge("c9", "expired")]})
        assert pushed.status_code == 200, pushed.text
        expired = page.locator("#dead-letters tbody tr", has_text="acct-9")
        expect(expired.locator("td.error li")).to_have_count(1)
        redrive = {"by": "browser-test", "reason": "card renewed?"}
        redriven = httpx.post(f"{url}/_a2/inspect/payments/acct-9/1/redrive", json=redrive)
        assert redriven.status_code == 200, redriven.text
        tries = expired.locator("td.error li summary")
        expect(tries).to_have_count(2)
        for n in (1, 2):
            expect(tries.nth(n - 1)).to_have_text(
                re.compile(
                    rf"attempt {n} at \d\d:\d\d:\d\d: ValueError: card expired: c9 "
                    rf"declined \(attempt {n}\)"
                )
            )
        page.locator("#dead-letters a", has_text="acct-9").click()
        row = page.locator("#events tbody tr[data-index='1']")
        expect(row.locator("td.state")).to_have_text("dead_lettered")
        expect(row.locator("td.error li")).to_have_count(2)
        expect(row).to_contain_text("redrive by browser-test: card renewed?")
        row.locator("td.error li summary").nth(1).click()
        expect(row.locator("td.error li pre").nth(1)).to_contain_text("Traceback")
        # The bulk control's preview, for the picture; then a phone's width,
        # scrolled to the dead letters (the bulk control, each attempt's error).
        dead.locator("td.payload summary").click()
        expect(dead.locator("td.payload pre")).to_be_hidden()
        page.fill("#b-error", "expired")
        page.click("#b-preview")
        expect(page.locator("#bulk-result")).to_have_text("would touch 1: acct-9 #1")

        def desktop(path: Path) -> None:
            page.set_viewport_size({"width": 1280, "height": 800})
            page.screenshot(path=str(path), full_page=True)

        def phone(path: Path) -> None:
            page.set_viewport_size({"width": 390, "height": 844})
            page.evaluate("document.getElementById('dead-count').parentElement.scrollIntoView()")
            page.screenshot(path=str(path))

        desktop(tmp_path / "inspector-desktop.png")
        page.set_viewport_size({"width": 390, "height": 844})
        width = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
        assert width[0] <= width[1], width
        # Each row is a card there: no table scrolls sideways either.
        wide = page.evaluate(
            """Array.from(document.querySelectorAll('.scroll'))
                 .filter((box) => box.scrollWidth > box.clientWidth + 1)
                 .map((box) => box.firstElementChild.id)"""
        )
        assert wide == [], wide
        expect(dead.locator("td.error")).to_have_attribute("data-label", "errors")
        phone(tmp_path / "inspector-phone.png")
        if shots:
            desktop(Path(shots) / "inspector-desktop.png")
            phone(Path(shots) / "inspector-phone.png")
        assert not [seen for seen in requests if seen.endswith("/favicon.ico")], requests
        assert errors == []


def test_a_quiet_repaint_keeps_the_rows_and_retry_now_answers() -> None:
    """A re-read that finds nothing new leaves the rows in place (an open
    traceback, a selection and the button under the pointer survive it);
    Retry now on a session with nothing to retry says why."""
    with serve("examples.payments:app") as url, chromium() as browser:
        pushed = httpx.post(f"{url}/payments/acct-3", json={"events": [CHARGE]})
        assert pushed.status_code == 200, pushed.text
        page = browser.new_page()
        page.goto(f"{url}/_a2/inspect")
        dead = page.locator("#dead-letters tbody tr", has_text="acct-3")
        expect(dead.locator("td.error summary")).to_contain_text("ConnectionError")
        dead.evaluate("(row) => { row.dataset.marked = 'yes'; }")
        # Two more re-reads of the dead letters, with nothing new in them.
        reads = """() => performance.getEntriesByType('resource')
                     .filter((r) => r.name.includes('view=dead-letters')).length"""
        seen = int(page.evaluate(reads))
        page.wait_for_function(f"() => ({reads})() >= {seen + 2}", timeout=15_000)
        expect(page.locator("#dead-letters tbody tr[data-marked=yes]")).to_have_count(1)

        page.locator("#sessions a", has_text="acct-3").click()
        page.click("#retry-now")
        expect(page.locator("#status")).to_contain_text(
            "409: session 'acct-3' has no event to retry"
        )
