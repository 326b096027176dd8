"""Every limit and interval of the network lanes, in one record.

Each limit bounds memory per connection (trio-websocket's backpressure
discipline): a request body is read into memory only up to
``max_body_bytes``; a socket message up to ``max_frame_bytes`` (hypercorn
buffers a message before the app sees it, so ``python -m a2trio.serve`` sets
its ``websocket_max_message_size`` to the same value); a multiplexed socket
holds at most ``max_socket_sessions`` lanes, each a store feed buffering at
most ``a2trio.stores._feed.FEED_BUFFER`` rows.
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
      heartbeat_s: idle time after which an SSE stream writes a comment, so
        proxies keep it open and clients' watchdogs stay fed.
      ping_s: interval of ``{"kind": "ping"}`` frames on sockets.
    """

    max_body_bytes: int = 1024 * 1024
    max_push_events: int = 100
    max_frame_bytes: int = 1024 * 1024
    max_socket_sessions: int = 1000
    heartbeat_s: float = 15.0
    ping_s: float = 15.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_push_events", "max_frame_bytes", "max_socket_sessions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        for name in ("heartbeat_s", "ping_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"`{name}` must be positive seconds, got {value!r}")


DEFAULT_LIMITS: Final = Limits()
