"""Browser-safe auth in headless Chromium: a signed token in the query string
(``EventSource`` and ``WebSocket`` cannot send ``Authorization``), the cookie
pattern, and the cross-site socket hijack that the Origin check prevents."""

from __future__ import annotations

import json
import urllib.request

from playwright.sync_api import Browser, Page

from a2trio.transport import issue_token
from tests.browser_apps import SECRET
from tests.test_browser_origins import origins, page_on

#: Follows a session; resolves with the first event's title, or "refused".
FOLLOW = """url => new Promise(resolve => {
    const source = new EventSource(url, {withCredentials: true});
    source.addEventListener("event", (frame) => {
        source.close();
        resolve("event:" + JSON.parse(frame.data).payload.title);
    });
    source.onerror = () => { source.close(); resolve("refused"); };
})"""

#: Opens a single-session socket; resolves with the first event's title, or "refused".
READ_SOCKET = """url => new Promise(resolve => {
    const ws = new WebSocket(url);
    ws.onmessage = (m) => {
        const frame = JSON.parse(m.data);
        if (frame.kind === "event") { ws.close(); resolve("event:" + frame.payload.title); }
    };
    ws.onerror = () => resolve("refused");
})"""

PUSH = """async url => {
    const response = await fetch(url, {
        method: "POST",
        headers: {"content-type": "application/json"},
        body: JSON.stringify({events: [{type: "task_added",
            payload: {task_id: "t1", title: "from the page"}}]}),
    });
    return response.status;
}"""


def token(session: str | None, *operations: str) -> str:
    return issue_token(
        SECRET, contract="board", session_id=session, operations=operations or ("stream",)
    )


def push_as_backend(url: str, session: str, title: str) -> None:
    body = json.dumps(
        {"events": [{"type": "task_added", "payload": {"task_id": title, "title": title}}]}
    ).encode()
    push = token(session, "push")
    request = urllib.request.Request(f"{url}/board/{session}?token={push}", data=body)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def with_cookie(browser: Browser, origin: str, value: str) -> Page:
    context = browser.new_context()
    context.add_cookies([{"name": "a2_token", "value": value, "url": origin, "sameSite": "Lax"}])
    page = context.new_page()
    page.goto(origin + "/")
    return page


def test_a_token_in_the_query_string() -> None:
    with origins("tests.browser_apps:token_app") as (browser, port, url):
        api = f"http://app.test:{port}/board"
        push_as_backend(url, "s1", "first")
        page = page_on(browser, f"http://app.test:{port}")
        assert page.evaluate(FOLLOW, f"{api}/s1?startAfter=0") == "refused"
        assert page.evaluate(FOLLOW, f"{api}/s1?startAfter=0&token={token('s1')}") == "event:first"
        # Scoped: another session or another operation is refused.
        assert page.evaluate(FOLLOW, f"{api}/s2?startAfter=0&token={token('s1')}") == "refused"
        assert page.evaluate(PUSH, f"{api}/s1?token={token('s1')}") == 403
        assert page.evaluate(PUSH, f"{api}/s1?token={token('s1', 'push')}") == 200
        forged = token("s1")[:-4] + "AAAA"
        assert page.evaluate(FOLLOW, f"{api}/s1?startAfter=0&token={forged}") == "refused"
        # Sockets take it the same way; a token for every session covers any.
        socket = f"ws://app.test:{port}/board/s1/ws?startAfter=0"
        assert page.evaluate(READ_SOCKET, socket) == "refused"
        assert page.evaluate(READ_SOCKET, f"{socket}&token={token(None)}") == "event:first"


def test_the_cookie_pattern_and_the_hijack_the_origin_check_stops() -> None:
    cookie = token("s1")
    with origins("tests.browser_apps:token_app") as (browser, port, url):
        own = f"http://app.test:{port}"
        push_as_backend(url, "s1", "secret plans")
        page = with_cookie(browser, own, cookie)
        # Same origin: the cookie rides along with EventSource and WebSocket.
        assert page.evaluate(FOLLOW, f"{own}/board/s1?startAfter=0") == "event:secret plans"
        socket = f"ws://app.test:{port}/board/s1/ws?startAfter=0"
        assert page.evaluate(READ_SOCKET, socket) == "event:secret plans"
        # Another origin of the same site: the browser sends the cookie with
        # the socket, but the Origin check refuses it before the upgrade.
        sibling = with_cookie(browser, own, cookie)
        sibling.goto(f"http://sub.app.test:{port}/")
        assert sibling.evaluate(READ_SOCKET, socket) == "refused"
    with origins("tests.browser_apps:unchecked_app") as (browser, port, url):
        own = f"http://app.test:{port}"
        push_as_backend(url, "s1", "secret plans")
        sibling = with_cookie(browser, own, cookie)
        sibling.goto(f"http://sub.app.test:{port}/")
        # Without the check the sibling page reads the session as the cookie's owner.
        socket = f"ws://app.test:{port}/board/s1/ws?startAfter=0"
        assert sibling.evaluate(READ_SOCKET, socket) == "event:secret plans"
