"""The server half of the transport: the ASGI app and its lanes.

:mod:`.app` builds the app (:func:`asgi`, :class:`App`) and its route tables
(:mod:`.routing`); the lanes answer behind them: a session's over HTTP
(:mod:`.sessions`) and sockets (:mod:`.sockets`), an actor's (:mod:`.actors`),
each SSE stream written by :mod:`.streams`; the app's own routes
(:mod:`.health`, :mod:`.scheduler`, :mod:`.inspector`, :mod:`.metrics`,
:mod:`.static`); and
what every lane asks of a request: :mod:`.auth` and :mod:`.tokens` (who may),
:mod:`.access` (access withdrawn while a stream is open), :mod:`.cors`,
:mod:`.limits` and the plumbing of :mod:`.http`. Frames and bodies are
:mod:`a2trio.transport.wire`'s and :mod:`a2trio.transport.sse`'s (sans-I/O).

The public names are :mod:`a2trio.transport`'s.
"""

from __future__ import annotations

from .app import App, asgi

__all__ = ["App", "asgi"]
