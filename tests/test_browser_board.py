"""The example board's page in headless Chromium, served by the README's command.

Two pages (two browser contexts: two people) on one board see each other's
tasks, the handler's estimates, each other in the viewers list and each
other's cursor; a reload resumes from the last index. At a phone's size and a
desktop's the layout holds; screenshots of both are saved in the test's tmp
dir (and, with ``A2_TEST_SCREENSHOTS=DIR``, in ``DIR/board-phone.png`` and
``DIR/board-desktop.png``: the ones in ``docs/`` are made that way).
"""

from __future__ import annotations

import colorsys
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


#: Two names whose old hash-to-hue put them 5° apart (236° and 231°).
MOVER, VIEWER = "max", "sam"

#: What the test measures on the viewer's page, in CSS pixels.
LAYOUT = """([mover, viewer]) => {
    const box = (el) => el.getBoundingClientRect();
    const dot = (who) => getComputedStyle(
        document.querySelector(`#viewers li[data-participant="${who}"] .dot`)).backgroundColor;
    return {
        scrollWidth: document.documentElement.scrollWidth,
        innerWidth: innerWidth,
        innerHeight: innerHeight,
        board: box(document.querySelector('#board')).toJSON(),
        tasks: box(document.querySelector('#tasks')).toJSON(),
        aside: box(document.querySelector('aside')).toJSON(),
        parts: Array.from(document.querySelectorAll(
            '#new-task input, #new-task button, #tasks li'), (el) => box(el).toJSON()),
        label: box(document.querySelector('.cursor .name')).toJSON(),
        colours: [dot(mover), dot(viewer)],
    };
}"""

Box = dict[str, float]


def inside(inner: Box, outer: Box) -> bool:
    # Half a pixel of rounding either way.
    return (
        inner["left"] >= outer["left"] - 0.5
        and inner["right"] <= outer["right"] + 0.5
        and inner["top"] >= outer["top"] - 0.5
        and inner["bottom"] <= outer["bottom"] + 0.5
    )


def overlap(a: Box, b: Box) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


def hue(css: str) -> float:
    """The hue (degrees) of a computed ``rgb(r, g, b)``."""
    r, g, b = (int(part) / 255 for part in css[css.index("(") + 1 : css.index(")")].split(","))
    hue_of, _, _ = colorsys.rgb_to_hsv(r, g, b)
    return hue_of * 360


def test_the_board_fits_a_phone_and_a_desktop(tmp_path: Path) -> None:
    """At 390x844 and 1280x800: nothing scrolls sideways, the form and the
    tasks stay inside the board, the viewers do not cover the tasks, a cursor
    at the board's far corner keeps its label on the board, and two viewers
    whose names hash to nearly the same hue get clearly different colours."""
    shots = os.environ.get("A2_TEST_SCREENSHOTS")
    with serve("examples.board:server") as url, chromium() as browser:
        mover = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        open_board(mover, url, MOVER)
        add_task(mover, "Ship the board page")
        add_task(mover, "Check the layout on a phone, with a title long enough to wrap twice")
        expect(row(mover, "Ship the board page")).to_have_attribute(
            "data-estimated", "true", timeout=WAIT_MS
        )
        for width, height, name in ((390, 844, "phone"), (1280, 800, "desktop")):
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            open_board(page, url, VIEWER)
            expect(page.locator("#tasks li")).to_have_count(2, timeout=WAIT_MS)
            expect(page.locator(f"#viewers li[data-participant={MOVER}]")).to_be_visible(
                timeout=WAIT_MS
            )
            # The mover's pointer goes to the far bottom-right corner of the board.
            box = mover.locator("#board").bounding_box()
            assert box is not None
            mover.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
            mover.mouse.move(
                box["x"] + box["width"] * 0.99, box["y"] + box["height"] * 0.99, steps=4
            )
            page.wait_for_function(
                f"""() => {{
                    const c = document.querySelector('.cursor[data-participant={MOVER}]');
                    return c && parseFloat(c.style.left) > 95 && parseFloat(c.style.top) > 95;
                }}""",
                timeout=WAIT_MS,
            )
            # The cursor glides (a 0.1 s transition): measure where it rests.
            page.wait_for_timeout(300)
            seen = page.evaluate(LAYOUT, [MOVER, VIEWER])
            assert seen["scrollWidth"] <= seen["innerWidth"], (name, seen)
            for part in seen["parts"]:
                assert inside(part, seen["board"]), (name, part, seen["board"])
            assert not overlap(seen["aside"], seen["tasks"]), (name, seen)
            assert seen["aside"]["right"] <= seen["innerWidth"] + 0.5, (name, seen)
            viewport = {
                "left": 0,
                "top": 0,
                "right": seen["innerWidth"],
                "bottom": seen["innerHeight"],
            }
            assert inside(seen["label"], seen["board"]), (name, seen["label"], seen["board"])
            assert inside(seen["label"], viewport), (name, seen["label"])
            apart = abs(hue(seen["colours"][0]) - hue(seen["colours"][1]))
            assert min(apart, 360 - apart) >= 40, (name, seen["colours"])
            page.screenshot(path=str(tmp_path / f"board-{name}.png"))
            if shots:
                page.screenshot(path=str(Path(shots) / f"board-{name}.png"))
            context.close()
