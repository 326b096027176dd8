"""Every limit and interval of the network lanes, in one record.

Each limit bounds memory per connection (trio-websocket's backpressure
discipline): a request body is read into memory only up to
``max_body_bytes``; a socket message up to ``max_frame_bytes`` (hypercorn
buffers a message before the app sees it, so ``python -m a2trio.serve`` sets
its ``websocket_max_message_size`` to the same value); a multiplexed socket
holds at most ``max_socket_sessions`` lanes, each a store feed buffering at
most ``a2trio.stores.feed.FEED_BUFFER`` rows, and one subscribe frame names at
most ``max_frame_sessions`` distinct sessions.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["DEFAULT_LIMITS", "Limits"]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits and intervals of :func:`a2trio.transport.asgi`.

    Attributes:
      max_body_bytes: largest push or scheduler body (413 past it). 1 MiB:
        ten times a generous batch of chat-sized events.
      max_push_events: most events in one push (HTTP or socket); 413 / an error
        ack past it. 100 matches a reasonable optimistic-UI batch and keeps one
        append's transaction short.
      max_frame_bytes: largest socket message; the socket closes with 1009
        past it. Same as the body limit: a push frame is a push body.
      max_socket_sessions: most lanes on one multiplexed socket; further
        subscriptions are refused with an ``unsubscribed`` notice. 1,000 bounds
        one socket to 1,000 feeds (each at most 256 buffered rows).
      max_frame_sessions: most distinct sessions one subscribe frame may name
        (duplicates collapse first, the last entry winning); a
        frame naming more closes the socket (1008). Bounds the work one frame
        can ask for: a frame naming one session 30,000 times used to restart
        its lane 30,000 times.
      heartbeat_s: idle time after which an SSE stream writes a comment, so
        proxies keep it open and clients' watchdogs stay fed.
      ping_s: interval of ``{"kind": "ping"}`` frames on sockets.
      body_timeout_s: how long a request body may take to arrive, from the
        request's start (408 past it): a client that never finishes its body
        holds a connection and a task, so 1,000 of them are 1,000 of each until
        this ends them. 30 s is a megabyte at 35 KB/s. Headers are bounded by
        the server (hypercorn), idle keep-alive connections by its
        ``keep_alive_timeout`` (``python -m a2trio.serve --keep-alive-timeout``).
      reauthorize_s: how often an open SSE stream or socket lane asks
        ``authorize`` again, ending it when refused (``None``: only at open;
        see ``transport/server/access.py``). A minute bounds how long withdrawn access
        keeps reading; ``App.revoke`` ends lanes at once.
    """

    max_body_bytes: int = 1024 * 1024
    max_push_events: int = 100
    max_frame_bytes: int = 1024 * 1024
    max_socket_sessions: int = 1000
    max_frame_sessions: int = 1000
    heartbeat_s: float = 15.0
    ping_s: float = 15.0
    body_timeout_s: float = 30.0
    reauthorize_s: float | None = 60.0

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_push_events",
            "max_frame_bytes",
            "max_socket_sessions",
            "max_frame_sessions",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        for name in ("heartbeat_s", "ping_s", "body_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"`{name}` must be positive seconds, got {value!r}")
        value = self.reauthorize_s
        if value is not None and (not isinstance(value, int | float) or not value > 0):
            raise ValueError(f"`reauthorize_s` must be positive seconds or None, got {value!r}")


DEFAULT_LIMITS: Final = Limits()
