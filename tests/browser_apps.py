"""Apps for the real-browser tests, served by ``python -m a2trio.serve
tests.browser_apps:NAME`` (``tests/browser_kit.py``), each with the same test
page at ``/`` so that a page of any origin can be opened on it.

The browser maps ``*.test`` names to 127.0.0.1, so one app is reached as
``http://app.test:PORT`` (its own origin), ``http://friend.test:PORT`` (an
origin the CORS option allows) and ``http://evil.test:PORT`` (any other site).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import a2trio
from a2trio.transport import Cors, asgi, token_authorize
from examples.board import board

__all__ = ["PAGES", "SECRET", "open_app", "token_app", "unchecked_app"]

PAGES = Path(__file__).with_name("browser_pages")
SECRET = "browser-tests-secret"


def friends(origin: str) -> bool:
    return urlsplit(origin).hostname == "friend.test"


#: No authorization; CORS (with credentials) for friend.test; the default Origin check.
open_app = asgi(a2trio.Server(board), static={"/": PAGES}, cors=Cors(friends, credentials=True))
#: Signed tokens, from the query string or the ``a2_token`` cookie.
token_app = asgi(
    a2trio.Server(board),
    static={"/": PAGES},
    cors=Cors(friends, credentials=True),
    authorize=token_authorize(SECRET, cookie="a2_token"),
)
#: ``token_app`` with the socket Origin check turned off: what it prevents.
unchecked_app = asgi(
    a2trio.Server(board),
    static={"/": PAGES},
    authorize=token_authorize(SECRET, cookie="a2_token"),
    socket_origins="*",
)
