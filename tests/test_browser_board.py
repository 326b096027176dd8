"""The example board's page in headless Chromium, served by the README's command.

Two pages (two browser contexts: two people) on one board see each other's
tasks, the handler's estimates, each other in the viewers list and each
other's cursor; a reload resumes from the last index. A screenshot of the
board is saved in the test's tmp dir (and, with ``A2_TEST_SCREENSHOTS=DIR``,
in ``DIR/board.png``: ``docs/board.png`` is made that way).
"""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Locator, Page, Request, expect

from tests.browser_kit import chromium, serve

#: The estimator sleeps 2 s (examples/board.py); generous for a loaded machine.
WAIT_MS = 15_000


def open_board(page: Page, url: str, who: str) -> None:
    page.goto(f"{url}/?board=demo&as={who}")
    expect(page.locator("#status")).to_have_attribute("data-state", "live", timeout=WAIT_MS)


def add_task(page: Page, title: str) -> None:
    page.fill("#new-task input[name=title]", title)
    page.click("#new-task button")


def row(page: Page, title: str) -> Locator:
    return page.locator("#tasks li", has_text=title)


def test_two_pages_see_each_others_tasks_presence_and_cursors(tmp_path: Path) -> None:
    with serve("examples.board:server") as url, chromium() as browser:
        ann = browser.new_context(viewport={"width": 1100, "height": 640}).new_page()
        bob = browser.new_context(viewport={"width": 1100, "height": 640}).new_page()
        errors: list[str] = []
        for page in (ann, bob):
            page.on("pageerror", lambda error: errors.append(str(error)))
        open_board(ann, url, "ann")
        open_board(bob, url, "bob")

        # Presence: each sees the other in the viewers list.
        expect(ann.locator("#viewers li[data-participant=bob]")).to_be_visible(timeout=WAIT_MS)
        expect(bob.locator("#viewers li[data-participant=ann]")).to_be_visible(timeout=WAIT_MS)

        # A task pushed on one page arrives on the other, then its estimate on both.
        add_task(ann, "Ship the board page")
        expect(row(bob, "Ship the board page")).to_be_visible(timeout=WAIT_MS)
        for page in (ann, bob):
            expect(row(page, "Ship the board page")).to_have_attribute(
                "data-estimated", "true", timeout=WAIT_MS
            )
            expect(row(page, "Ship the board page")).to_contain_text("4 pts")
        add_task(bob, "Write the docs")
        expect(row(ann, "Write the docs")).to_be_visible(timeout=WAIT_MS)

        # The cursor: ann's pointer on the board shows on bob's page, where she is.
        box = ann.locator("#board").bounding_box()
        assert box is not None
        ann.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.8)
        ann.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.75, steps=4)
        cursor = bob.locator("#board .cursor[data-participant=ann]")
        expect(cursor).to_be_visible(timeout=WAIT_MS)
        # It follows her last position (60 % across), not only the first.
        bob.wait_for_function(
            """() => {
                const left = parseFloat(
                    document.querySelector('.cursor[data-participant=ann]').style.left);
                return left > 55 && left < 65;
            }""",
            timeout=WAIT_MS,
        )
        item = row(ann, "Ship the board page").bounding_box()
        assert item is not None
        ann.mouse.move(item["x"] + item["width"] * 0.5, item["y"] + item["height"] / 2)
        ann.mouse.move(item["x"] + item["width"] * 0.55, item["y"] + item["height"] / 2, steps=3)
        expect(bob.locator("#viewers li[data-participant=ann] .where")).to_contain_text(
            "Ship the board page", timeout=WAIT_MS
        )
        bob.screenshot(path=str(tmp_path / "board.png"))
        if os.environ.get("A2_TEST_SCREENSHOTS"):
            bob.screenshot(path=str(Path(os.environ["A2_TEST_SCREENSHOTS"]) / "board.png"))

        # Removing on one page removes on the other.
        row(bob, "Write the docs").locator(".remove").click()
        expect(row(ann, "Write the docs")).to_have_count(0, timeout=WAIT_MS)

        # A reload paints from localStorage and resumes after the last index.
        last = int(ann.evaluate("JSON.parse(localStorage.getItem('a2-board:demo')).last"))
        assert last >= 4
        streams: list[str] = []

        def note_stream(request: Request) -> None:
            if "presence=1" in request.url:
                streams.append(request.url)

        ann.on("request", note_stream)
        ann.reload()
        expect(ann.locator("#status")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
        expect(ann.locator("#resume")).to_have_text(f"resumed after event #{last}")
        assert streams, "the reload opened no stream"
        assert streams[-1].endswith(f"startAfter={last}"), streams
        expect(ann.locator("#tasks li")).to_have_count(1)
        expect(row(ann, "Ship the board page")).to_contain_text("4 pts")
        # ...and still sees what happens after.
        add_task(bob, "After the reload")
        expect(row(ann, "After the reload")).to_be_visible(timeout=WAIT_MS)
        assert errors == []
        assert (tmp_path / "board.png").stat().st_size > 10_000


def test_a_cache_from_another_log_is_dropped() -> None:
    with serve("examples.board:server") as url, chromium() as browser:
        page = browser.new_page()
        page.goto(f"{url}/?board=stale&as=cy")
        # A cache that claims 7 events the (fresh, in-memory) log never had.
        page.evaluate(
            """localStorage.setItem('a2-board:stale', JSON.stringify(
                 {last: 7, lastId: 'gone', tasks: {x: {title: 'Ghost', points: 1, index: 3}}}))"""
        )
        page.reload()
        expect(page.locator("#status")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
        expect(row(page, "Ghost")).to_have_count(0)
        expect(page.locator("#resume")).to_have_text("read from the start")
        add_task(page, "Real")
        expect(row(page, "Real")).to_be_visible(timeout=WAIT_MS)
