"""The memory store as a conformance backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from a2trio.clock import Clock
from a2trio.ids import IdSource
from a2trio.stores.base import Store
from a2trio.stores.memory import MemoryStore


@asynccontextmanager
async def open_store(clock: Clock, ids: IdSource | None = None) -> AsyncIterator[Store]:
    """A new, empty memory store on ``clock`` and ``ids``, closed on exit."""
    async with MemoryStore(clock=clock, ids=ids) as store:
        try:
            yield store
        finally:
            await store.aclose()
