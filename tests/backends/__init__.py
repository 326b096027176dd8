"""Store factories for the conformance suite, one module per backend.

Each module exposes ``open_store(clock, ids=None)``: an async context manager
yielding a fresh, entered store that stamps rows with ``clock`` and generates
event ids from ``ids`` (see ``a2trio.stores.conformance.StoreFactory``).
Postgres and Redis pass ``ids`` on with their other ``**options``.

A module whose store has a backend to lose also exposes
``open_unreachable_store(clock)``: a store pointed where nothing answers, for
``a2trio.stores.conformance.UNREACHABLE_CHECKS``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["unreachable_port"]


@contextmanager
def unreachable_port() -> Iterator[int]:
    """A loopback port held bound but never listening: connecting to it is
    refused at once, and no other process can take it meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])
