"""Store backends and the seam they implement.

``memory()`` ships with the core; ``sqlite()`` and ``postgres()`` are imported
on first use so that their drivers stay optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Store
from .memory import MemoryStore, memory

if TYPE_CHECKING:
    from .postgres import postgres
    from .sqlite import sqlite

__all__ = ["MemoryStore", "Store", "from_url", "memory", "postgres", "sqlite"]


def __getattr__(name: str) -> Any:
    if name == "sqlite":
        from .sqlite import sqlite

        return sqlite
    if name == "postgres":
        from .postgres import postgres

        return postgres
    raise AttributeError(f"module 'a2trio.stores' has no attribute {name!r}")


def from_url(url: str) -> Store:
    """Build a store from a URL: ``memory:``, ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``, ``sqlite:///:memory:``, ``postgresql://...``.

    Raises:
      ValueError: an unknown scheme.
    """
    if url in ("memory", "memory:") or url.startswith("memory:"):
        return memory()
    if url.startswith("sqlite:"):
        from .sqlite import sqlite

        # SQLAlchemy's spelling: sqlite:///relative.db, sqlite:////abs/path.db.
        path = url.removeprefix("sqlite:").removeprefix("//").removeprefix("/")
        return sqlite(path or ".a2/dev.db")
    if url.startswith(("postgres://", "postgresql://")):
        from .postgres import postgres

        return postgres(url)
    raise ValueError(
        f"unknown store URL {url!r}: use 'memory:', 'sqlite:///path' or 'postgresql://...'"
    )
