"""The SQLite store as a conformance backend: a fresh file per check."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from a2trio.clock import Clock
from a2trio.ids import IdSource
from a2trio.stores.base import Store
from a2trio.stores.sqlite import sqlite


@asynccontextmanager
async def open_store(clock: Clock, ids: IdSource | None = None) -> AsyncIterator[Store]:
    """A new SQLite store in its own temporary folder on ``clock`` and
    ``ids``, closed and deleted on exit."""
    folder = await trio.to_thread.run_sync(tempfile.mkdtemp, None, "a2trio-sqlite-")
    try:
        async with sqlite(str(Path(folder) / "conformance.db"), clock=clock, ids=ids) as store:
            yield store
    finally:
        await trio.to_thread.run_sync(shutil.rmtree, folder)


@asynccontextmanager
async def open_unreachable_store(clock: Clock) -> AsyncIterator[Store]:
    """A SQLite store whose file cannot be opened (its folder's place is taken
    by a regular file), not entered; closed on exit."""
    folder = await trio.to_thread.run_sync(tempfile.mkdtemp, None, "a2trio-sqlite-")
    try:
        blocker = Path(folder) / "not-a-folder"
        await trio.to_thread.run_sync(blocker.write_text, "")
        store = sqlite(str(blocker / "conformance.db"), clock=clock)
        try:
            yield store
        finally:
            await store.aclose()
    finally:
        await trio.to_thread.run_sync(shutil.rmtree, folder)
