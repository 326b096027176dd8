"""The Durable Streams lane: ElectricSQL's protocol for resumable HTTP
streams, over any a2trio store.

::

    python -m a2trio.serve a2trio.transport.durable_streams:app --store sqlite:///streams.db

``durable_streams(store)`` builds the lane (an ASGI app); :func:`mount` puts
it under a prefix beside a session app. Each stream is a session of the
built-in contract :data:`CONTRACT` (:mod:`.model` maps the protocol's
operations to its events); offsets are derived from the session's indexes
(:class:`~.protocol.Offset`). See ``docs/durable-streams.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from ... import Server
from ...stores import Store
from .. import Authorize, Cors, Limits
from .context import StreamOperation
from .lane import (
    CHUNK_BYTES,
    DEFAULT_LIMITS,
    LONG_POLL_S,
    SSE_RECONNECT_S,
    DurableStreams,
)
from .model import CONTRACT
from .subscription_routes import SubscriptionOperation
from .subscriptions import WEBHOOK_TIMEOUT_S

__all__ = [
    "CHUNK_BYTES",
    "CONTRACT",
    "DEFAULT_LIMITS",
    "LONG_POLL_S",
    "SSE_RECONNECT_S",
    "WEBHOOK_TIMEOUT_S",
    "DurableStreams",
    "Mounted",
    "StreamOperation",
    "SubscriptionOperation",
    "durable_streams",
    "mount",
]


def durable_streams(
    store: Store | None = None,
    *,
    sessions: Sequence[Server] = (),
    authorize: Authorize | None = None,
    limits: Limits = DEFAULT_LIMITS,
    cors: Cors | None = None,
    long_poll_s: float = LONG_POLL_S,
    sse_reconnect_s: float = SSE_RECONNECT_S,
    chunk_bytes: int = CHUNK_BYTES,
    signing_key: bytes | None = None,
    local_webhooks: bool = False,
    webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
) -> DurableStreams:
    """The Durable Streams lane over ``store`` (default: by ``A2_STORE`` /
    ``A2_ENV``, as a server's). Construction does no I/O.

    Args:
      store: where the streams live: any a2trio store.
      sessions: servers whose sessions are readable at
        ``/{contract}/{session}`` (JSON mode, read-only).
      authorize: ``authorize(request, operation)``, the hook of the other
        lanes: a :class:`StreamOperation` for streams; a
        ``HistoryOperation`` or ``StreamOperation`` of ``a2trio.transport``
        for mounted sessions. Anything but ``True`` answers 403.
      limits: the body cap (413) and body timeout (408); ``heartbeat_s`` is
        the interval of an idle SSE stream's control events.
      cors: the origins whose pages may use the lane (off by default).
      long_poll_s: how long a long-poll waits before answering 204.
      sse_reconnect_s: how long one SSE response lasts before the client
        is asked to reconnect (by ending it).
      chunk_bytes: about how many bytes one catch-up read answers.
      signing_key: the 32-byte Ed25519 seed webhooks are signed with (and
        callback tokens derived from); by default one is made and kept in
        the store, shared by every lane process on it.
      local_webhooks: allow ``http://localhost`` and ``http://127.0.0.x``
        webhook URLs (development: Section 6.2's exception); otherwise only
        ``https`` URLs of public hosts.
      webhook_timeout_s: how long one webhook call may take.
    """
    server = Server(CONTRACT, store=store, run_handlers=False, sweep=False)
    return DurableStreams(
        server,
        sessions=sessions,
        authorize=authorize,
        limits=limits,
        cors=cors,
        long_poll_s=long_poll_s,
        sse_reconnect_s=sse_reconnect_s,
        chunk_bytes=chunk_bytes,
        signing_key=signing_key,
        local_webhooks=local_webhooks,
        webhook_timeout_s=webhook_timeout_s,
    )


class Mounted:
    """An ASGI app serving lanes under path prefixes beside another app
    (:func:`mount`). Its lifespan opens each lane's server, then runs the
    app's own lifespan inside."""

    def __init__(self, app: Any, lanes: Mapping[str, DurableStreams]) -> None:
        prefixes: list[tuple[str, DurableStreams]] = []
        for prefix, lane in lanes.items():
            if not prefix.startswith("/") or prefix == "/" or prefix.endswith("/"):
                raise ValueError(f"a mount prefix is /name (no trailing slash), got {prefix!r}")
            if not isinstance(lane, DurableStreams):
                raise TypeError(f"mount() takes DurableStreams lanes, got {lane!r}")
            prefixes.append((prefix, lane))
        self.app = app
        self.lanes = sorted(prefixes, key=lambda pair: -len(pair[0]))

    def __repr__(self) -> str:
        return f"Mounted({self.app!r}, {dict(self.lanes)!r})"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with AsyncExitStack() as stack:
                try:
                    for _, lane in self.lanes:
                        await stack.enter_async_context(lane.opened(sessions=False))
                except Exception as exc:
                    await receive()
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        for prefix, lane in self.lanes:
            if path == prefix or path.startswith(prefix + "/"):
                inner = dict(scope, root_path=scope.get("root_path", "") + prefix)
                await lane.handle(inner, receive, send, path[len(prefix) :] or "/")
                return
        await self.app(scope, receive, send)


def mount(app: Any, lanes: Mapping[str, DurableStreams]) -> Mounted:
    """Serve ``lanes`` (prefix -> lane, e.g. ``{"/streams": lane}``) beside
    the ASGI ``app`` (say, :func:`a2trio.transport.asgi`'s): requests under a
    prefix go to its lane, with the path below the prefix as the stream
    path; the rest to ``app``. The lanes' mounted ``sessions`` are the app's
    to open.

    Raises:
      ValueError: a prefix that is not ``/name``.
      TypeError: a lane that is not a :class:`DurableStreams`.
    """
    return Mounted(app, lanes)


def __getattr__(name: str) -> Any:
    """``app``: the lane over ``A2_STORE``, open to pages of any origin and
    to local webhooks (a development server), built on first use
    (``python -m a2trio.serve`` sets ``A2_STORE`` first)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    app = durable_streams(cors=Cors("*"), local_webhooks=True)
    globals()["app"] = app
    return app
