"""The in-memory store: the verified fake of the Postgres backend (``store``),
its rows (``rows``), its operator actions (``operator``), its presence plane
(``presence``)."""

from .store import MemoryStore, memory

__all__ = ["MemoryStore", "memory"]
