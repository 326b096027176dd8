"""The clients' connection states and reconnect policy, kept at their first
path (``docs/client.md``): :mod:`a2trio.transport.client.connection`."""

from __future__ import annotations

from .client.connection import (
    DEFAULT_PUSH_BACKOFF,
    DEFAULT_RECONNECT,
    PUSH_ATTEMPTS,
    Backoff,
    Closed,
    Connecting,
    ConnectionState,
    ConnectionWatch,
    Idle,
    Live,
    Paused,
    ReconnectPolicy,
    retryable,
    retrying,
    trace_headers,
)

__all__ = [
    "DEFAULT_PUSH_BACKOFF",
    "DEFAULT_RECONNECT",
    "PUSH_ATTEMPTS",
    "Backoff",
    "Closed",
    "Connecting",
    "ConnectionState",
    "ConnectionWatch",
    "Idle",
    "Live",
    "Paused",
    "ReconnectPolicy",
    "retryable",
    "retrying",
    "trace_headers",
]
