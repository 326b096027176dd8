"""CORS and the sockets' Origin check, from real pages of other origins in headless
Chromium (``tests/browser_apps.py``: one app reached as ``app.test``,
``friend.test`` (allowed by its CORS option) and ``evil.test``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from playwright.sync_api import Browser, Page

from tests.browser_kit import chromium, serve

HOSTS = ("app.test", "friend.test", "evil.test", "sub.app.test")

#: Opens a socket; resolves "open" or "refused".
OPEN_SOCKET = """url => new Promise(resolve => {
    const ws = new WebSocket(url);
    ws.onopen = () => { ws.close(); resolve("open"); };
    ws.onerror = () => resolve("refused");
})"""

#: A push with a JSON body: a non-simple request, so the browser preflights it.
PUSH = """async ([url, headers]) => {
    try {
        const response = await fetch(url, {
            method: "POST",
            credentials: "include",
            headers: {"content-type": "application/json", ...headers},
            body: JSON.stringify({events: [{type: "task_added",
                payload: {task_id: "t-" + location.hostname, title: location.hostname}}]}),
        });
        return response.status + ":" + (await response.json()).events.length;
    } catch (error) {
        return "blocked";
    }
}"""

#: Follows a session with EventSource; resolves with the first event's title.
FOLLOW = """url => new Promise(resolve => {
    const source = new EventSource(url, {withCredentials: true});
    source.addEventListener("event", (frame) => {
        source.close();
        resolve("event:" + JSON.parse(frame.data).payload.title);
    });
    source.onerror = () => { source.close(); resolve("blocked"); };
})"""


@contextmanager
def origins(target: str, output: list[str] | None = None) -> Iterator[tuple[Browser, int, str]]:
    with serve(target, output=output) as url, chromium(hosts=HOSTS) as browser:
        port = urlsplit(url).port
        assert port is not None
        yield browser, port, url


def page_on(browser: Browser, origin: str) -> Page:
    page = browser.new_context().new_page()
    page.goto(origin + "/")
    assert page.title() == "a test page"
    return page


def titles(url: str, session: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/board/{session}", timeout=10) as response:
        events = json.load(response)["events"]
    return [event["payload"]["title"] for event in events]


def test_a_cross_origin_page_gets_no_socket_unless_allowed() -> None:
    output: list[str] = []
    with origins("tests.browser_apps:open_app", output) as (browser, port, _):
        socket = f"ws://app.test:{port}/board/s1/ws?startAfter=0"
        own = page_on(browser, f"http://app.test:{port}")
        assert own.evaluate(OPEN_SOCKET, socket) == "open"
        friend = page_on(browser, f"http://friend.test:{port}")
        assert friend.evaluate(OPEN_SOCKET, socket) == "open"
        evil = page_on(browser, f"http://evil.test:{port}")
        assert evil.evaluate(OPEN_SOCKET, socket) == "refused"
        assert evil.evaluate(OPEN_SOCKET, f"ws://app.test:{port}/board/ws") == "refused"
        # Same site, another origin: refused too (cookies would ride along).
        sibling = page_on(browser, f"http://sub.app.test:{port}")
        assert sibling.evaluate(OPEN_SOCKET, socket) == "refused"
    refusals = [line for line in output if "socket refused" in line]
    assert any(f"'http://evil.test:{port}'" in line for line in refusals), output
    assert any(f"'http://sub.app.test:{port}'" in line for line in refusals), output
    assert not any("friend.test" in line for line in refusals)


def test_real_preflights_let_allowed_origins_push_and_follow() -> None:
    with origins("tests.browser_apps:open_app") as (browser, port, url):
        api = f"http://app.test:{port}/board"
        friend = page_on(browser, f"http://friend.test:{port}")
        assert friend.evaluate(PUSH, [f"{api}/s1", {}]) == "200:1"
        # A header the CORS option does not allow: the preflight's answer
        # lacks it, so the browser never sends the push.
        assert friend.evaluate(PUSH, [f"{api}/s1", {"x-custom": "1"}]) == "blocked"
        assert friend.evaluate(FOLLOW, f"{api}/s1?startAfter=0") == "event:friend.test"

        evil = page_on(browser, f"http://evil.test:{port}")
        assert evil.evaluate(PUSH, [f"{api}/s1", {}]) == "blocked"
        assert evil.evaluate(FOLLOW, f"{api}/s1?startAfter=0") == "blocked"
        read = "u => fetch(u).then(r => r.json()).then(b => b.events.length, () => 'blocked')"
        assert evil.evaluate(read, f"{api}/s1") == "blocked"
        assert friend.evaluate(read, f"{api}/s1") == 1
        # The refused preflight stopped the push before it was sent.
        assert titles(url, "s1") == ["friend.test"]
