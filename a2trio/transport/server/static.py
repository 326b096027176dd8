"""Static files for an app's own pages: ``asgi(server, static={"/": directory})``.

A small option, not a web framework: ``GET``/``HEAD`` of the files under a
directory, for the few pages and scripts that sit in front of a session (the
example board's ``index.html``). Every path the sessions' lanes own
(``/{contract}/...`` of a mounted contract, ``/_a2/...``) is routed to them
first; only what is left reaches the static mounts.

Safety. A request path is split and percent-decoded segment by segment; a
segment that is empty, ``.``, ``..``, hidden (``.env``), or holds a ``/``,
``\\`` or NUL answers 404, and so does a file whose resolved path (symlinks
followed) leaves the directory. Content types come from a fixed table for web
files (``text/html; charset=utf-8``, ``text/javascript``...), then
:mod:`mimetypes`, then ``application/octet-stream``; every answer carries
``X-Content-Type-Options: nosniff``, so a browser never guesses a script from
a text file. Answers carry a weak ``ETag`` (size and modification time) and
``Cache-Control: no-cache`` by default: browsers revalidate each load and get
a body-less 304 while the file is unchanged, so an edited page shows at once.
"""

from __future__ import annotations

import mimetypes
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import trio

from .auth import Request
from .http import Refusal, Send

__all__ = [
    "MAX_STATIC_FILE_BYTES",
    "Static",
    "StaticFile",
    "StaticMounts",
    "content_type",
    "serve_static",
    "static_mounts",
]

#: A static file is read whole per request: pages and scripts, not downloads.
MAX_STATIC_FILE_BYTES: Final = 8 * 1024 * 1024

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".ico": "image/vnd.microsoft.icon",
    ".wasm": "application/wasm",
    ".woff2": "font/woff2",
}


def content_type(path: Path) -> str:
    """The ``Content-Type`` of a served file, by its suffix."""
    suffix = path.suffix.lower()
    if suffix in _TYPES:
        return _TYPES[suffix]
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


class StaticFile:
    """One file found for a request: its bytes (``None`` for a 304) and headers."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


class Static:
    """A directory served under a URL prefix.

    Args:
      directory: the files' root; it must exist.
      index: the file a directory's URL serves (``/`` serves ``index.html``).
      cache_control: the ``Cache-Control`` of every answer (``no-cache``:
        revalidate with the ``ETag`` on every load).

    Raises:
      ValueError: ``directory`` is not a directory.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        index: str = "index.html",
        cache_control: str = "no-cache",
    ) -> None:
        root = Path(directory).resolve()
        if not root.is_dir():
            raise ValueError(f"static directory {str(directory)!r} is not a directory")
        self.root = root
        self.index = index
        self.cache_control = cache_control

    def __repr__(self) -> str:
        return f"Static({str(self.root)!r})"

    def locate(self, segments: list[str]) -> Path | None:
        """The file for decoded path segments below the mount, or ``None``
        when there is none or the path is refused (see the module's "Safety")."""
        parts = segments[:-1] if segments and segments[-1] == "" else segments
        for part in parts:
            if not part or part.startswith(".") or any(c in part for c in "/\\\x00"):
                return None
        candidate = self.root.joinpath(*parts)
        try:
            resolved = candidate.resolve()
            if resolved.is_dir():
                resolved = (resolved / self.index).resolve()
            if not resolved.is_relative_to(self.root) or not resolved.is_file():
                return None
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
            return None
        return resolved

    async def answer(self, segments: list[str], if_none_match: str | None) -> StaticFile | None:
        """The answer to ``GET`` of ``segments`` (below the mount), or ``None``
        for a 404. Blocking file calls run in a thread."""
        return await trio.to_thread.run_sync(self._answer, segments, if_none_match)

    def _answer(self, segments: list[str], if_none_match: str | None) -> StaticFile | None:
        path = self.locate(segments)
        if path is None:
            return None
        try:
            stat = path.stat()
            if stat.st_size > MAX_STATIC_FILE_BYTES:
                return None
            etag = f'W/"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
            headers = [
                (b"etag", etag.encode()),
                (b"cache-control", self.cache_control.encode()),
                (b"x-content-type-options", b"nosniff"),
            ]
            if if_none_match is not None and etag in (t.strip() for t in if_none_match.split(",")):
                return StaticFile(304, b"", headers)
            body = path.read_bytes()
        except OSError:
            return None
        headers.append((b"content-type", content_type(path).encode()))
        return StaticFile(200, body, headers)


class StaticMounts:
    """The app's static mounts, longest prefix first."""

    def __init__(self, mounts: Mapping[str, Static]) -> None:
        self.mounts = sorted(
            ((_prefix_segments(prefix), static) for prefix, static in mounts.items()),
            key=lambda item: -len(item[0]),
        )

    def __bool__(self) -> bool:
        return bool(self.mounts)

    def find(self, segments: list[str]) -> tuple[Static, list[str]] | None:
        """The mount that owns a request's path segments and the segments below it."""
        for prefix, static in self.mounts:
            if segments[: len(prefix)] == prefix:
                return static, segments[len(prefix) :]
        return None


def _prefix_segments(prefix: str) -> list[str]:
    if not prefix.startswith("/"):
        raise ValueError(f"a static mount's prefix starts with '/', got {prefix!r}")
    return [part for part in prefix.split("/") if part]


def static_mounts(static: Mapping[str, Static | str | os.PathLike[str]] | None) -> StaticMounts:
    """``asgi``'s ``static`` argument as mounts: each value a :class:`Static`
    or a directory (served with the defaults).

    Raises:
      ValueError: a prefix not starting with ``/``; a directory that is not one.
    """
    return StaticMounts(
        {
            prefix: value if isinstance(value, Static) else Static(value)
            for prefix, value in (static or {}).items()
        }
    )


async def serve_static(
    mounts: StaticMounts, segments: list[str], request: Request, send: Send
) -> None:
    """Answer ``GET``/``HEAD`` from the mount that owns the path (``HEAD``:
    the same headers, no body).

    Raises:
      Refusal: 404 when no mount owns the path or the file is not there (or
        is refused), 405 for a method other than ``GET``/``HEAD``.
    """
    found = mounts.find(segments)
    answer = None
    if found is not None:
        if request.method not in ("GET", "HEAD"):
            raise Refusal(405, f"{request.method} is not allowed on a static file: use GET")
        static, below = found
        answer = await static.answer(below, request.headers.get("if-none-match"))
    if answer is None:
        raise Refusal(404, "no such file")
    headers = answer.headers
    if answer.status == 200:
        headers = [*headers, (b"content-length", str(len(answer.body)).encode())]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    body = b"" if request.method == "HEAD" else answer.body
    await send({"type": "http.response.body", "body": body})
