"""``a2trio.transport.asgi``: the ASGI app, kept at its first path.

The app is :mod:`a2trio.transport.server.app`; :mod:`a2trio.transport`
re-exports :func:`asgi` and :class:`App` from here.
"""

from __future__ import annotations

from .server.app import App, asgi

__all__ = ["App", "asgi"]
