"""Static pages (``asgi(..., static=...)``), driven in-process with raw ASGI scopes:
the path reaches the app exactly as a client sent it (no URL normalization
on the way), so traversal attempts are what the test says."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

import a2trio
from a2trio.stores import memory
from a2trio.transport import App, Static, asgi
from a2trio.transport.server import static as static_module
from a2trio.transport.server.static import StaticMounts, content_type, static_mounts
from examples.board import board

Message = dict[str, Any]


class Answer:
    def __init__(self, messages: list[Message]) -> None:
        start = messages[0]
        self.status: int = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.header_names = [k.decode() for k, _ in start["headers"]]
        self.body = b"".join(m.get("body", b"") for m in messages[1:])


async def call(
    app: App, method: str, raw_path: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> Answer:
    """One HTTP request through the app, as an ASGI server would make it."""
    path, _, query = raw_path.partition(b"?")
    scope = {
        "type": "http",
        "method": method,
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": query,
        "headers": headers or [],
    }
    sent: list[Message] = []
    received = False

    async def receive() -> Message:
        nonlocal received
        if received:
            return {"type": "http.disconnect"}
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return Answer(sent)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "js").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>home</title>")
    (root / "js" / "app.js").write_text("console.log('hi')")
    (root / "js" / "index.html").write_text("js index")
    (root / "style.css").write_text("body {}")
    (root / "data.bin").write_bytes(b"\x00\x01")
    (root / ".env").write_text("SECRET=1")
    (tmp_path / "secret.txt").write_text("outside the root")
    (root / "escape.txt").symlink_to(tmp_path / "secret.txt")
    return root


def app_with(static: Any) -> App:
    return asgi(a2trio.Server(board, store=memory()), static=static)


async def test_files_are_served_with_types_etags_and_no_sniffing(site: Path) -> None:
    app = app_with({"/": site})
    home = await call(app, "GET", b"/")
    assert home.status == 200
    assert home.body == b"<!doctype html><title>home</title>"
    assert home.headers["content-type"] == "text/html; charset=utf-8"
    assert home.headers["content-length"] == str(len(home.body))
    assert home.headers["cache-control"] == "no-cache"
    assert home.headers["x-content-type-options"] == "nosniff"
    assert home.headers["etag"].startswith('W/"')
    script = await call(app, "GET", b"/js/app.js")
    assert script.status == 200
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    style = await call(app, "GET", b"/style.css")
    assert style.headers["content-type"] == "text/css; charset=utf-8"
    data = await call(app, "GET", b"/data.bin")
    assert data.headers["content-type"] == "application/octet-stream"
    # A directory serves its index, with or without the slash.
    assert (await call(app, "GET", b"/js/")).body == b"js index"
    assert (await call(app, "GET", b"/js")).body == b"js index"


async def test_head_and_conditional_gets(site: Path) -> None:
    app = app_with({"/": site})
    get = await call(app, "GET", b"/index.html")
    head = await call(app, "HEAD", b"/index.html")
    assert head.status == 200
    assert head.body == b""
    assert head.headers == get.headers
    etag = get.headers["etag"]
    again = await call(app, "GET", b"/index.html", [(b"if-none-match", f'"x", {etag}'.encode())])
    assert again.status == 304
    assert again.body == b""
    assert "content-length" not in again.headers
    assert again.headers["etag"] == etag
    other = await call(app, "GET", b"/index.html", [(b"if-none-match", b'W/"stale"')])
    assert other.status == 200
    # An edit changes the tag, so the next load gets the new file.
    (site / "index.html").write_text("edited, and longer than before")
    os.utime(site / "index.html", ns=(1, 2))
    edited = await call(app, "GET", b"/index.html", [(b"if-none-match", etag.encode())])
    assert (edited.status, edited.body) == (200, b"edited, and longer than before")


@pytest.mark.parametrize(
    "path",
    [
        b"/../secret.txt",
        b"/js/../../secret.txt",
        b"/%2e%2e/secret.txt",
        b"/js%2F..%2F..%2Fsecret.txt",
        b"/..%5Csecret.txt",
        b"/.env",
        b"/%2eenv",
        b"/escape.txt",
        b"/nope.html",
        b"//index.html",
        b"/index.html%00.js",
        b"/js/./app.js",
    ],
)
async def test_paths_that_leave_the_root_or_hide_are_404(site: Path, path: bytes) -> None:
    answer = await call(app_with({"/": site}), "GET", path)
    assert answer.status == 404, path
    assert b"outside the root" not in answer.body
    assert b"SECRET" not in answer.body


async def test_a_path_that_is_not_utf8_is_400(site: Path) -> None:
    assert (await call(app_with({"/": site}), "GET", b"/%FF.html")).status == 400


async def test_the_lanes_own_their_paths_before_the_files(site: Path) -> None:
    (site / "board").mkdir()
    (site / "board" / "s1").write_text("shadowed")
    (site / "_a2").mkdir()
    (site / "_a2" / "health").write_text("shadowed")
    app = app_with({"/": site})
    server = app.servers["board"]
    async with server:
        history = await call(app, "GET", b"/board/s1")
        assert history.status == 200
        assert history.body == b'{"events":[]}'
        assert (await call(app, "GET", b"/_a2/health")).body.startswith(b'{"status":"ok"')
    assert (await call(app, "GET", b"/board")).status == 404
    # Only GET and HEAD read files.
    refused = await call(app, "POST", b"/index.html")
    assert refused.status == 405
    assert b"INVALID_PAYLOAD" in refused.body


async def test_mounts_under_a_prefix_and_longest_prefix_first(site: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.html").write_text("docs home")
    app = app_with({"/web": Static(site, cache_control="max-age=60"), "/web/docs": docs})
    web = await call(app, "GET", b"/web/")
    assert web.body.startswith(b"<!doctype html>")
    assert web.headers["cache-control"] == "max-age=60"
    assert (await call(app, "GET", b"/web")).status == 200
    assert (await call(app, "GET", b"/web/docs/")).body == b"docs home"
    assert (await call(app, "GET", b"/webby")).status == 404
    assert (await call(app, "GET", b"/index.html")).status == 404


async def test_without_static_nothing_is_served(site: Path) -> None:
    app = app_with(None)
    assert not app.static
    assert (await call(app, "GET", b"/index.html")).status == 404


async def test_large_unreadable_and_looping_files_are_404(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = app_with({"/": site})
    (site / "loop").symlink_to(site / "loop")
    assert (await call(app, "GET", b"/loop")).status == 404
    with monkeypatch.context() as patch:
        patch.setattr(static_module, "MAX_STATIC_FILE_BYTES", 4)
        assert (await call(app, "GET", b"/index.html")).status == 404

    def unreadable(path: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    assert (await call(app, "GET", b"/index.html")).status == 404


def test_bad_mounts_are_refused(site: Path) -> None:
    with pytest.raises(ValueError, match="starts with '/'"):
        static_mounts({"web": site})
    with pytest.raises(ValueError, match="is not a directory"):
        Static(site / "index.html")
    assert repr(Static(site)) == f"Static({str(site)!r})"
    assert isinstance(static_mounts(None), StaticMounts)


def test_content_types() -> None:
    assert content_type(Path("a.MJS")) == "text/javascript; charset=utf-8"
    assert content_type(Path("a.svg")) == "image/svg+xml"
    assert content_type(Path("a.pdf")) == "application/pdf"
    assert content_type(Path("Makefile")) == "application/octet-stream"
