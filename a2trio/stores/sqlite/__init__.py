"""The SQLite store: the embedded default, on stdlib ``sqlite3``.

``store`` is the store itself and its event, claim, outcome and state
transactions; ``presence`` its presence plane (the degraded tier);
``inspection`` its read-only views; ``operator`` its operator actions (dead
letters, redrive, skip, retry now); ``sql`` every statement and the decoding
of its rows; ``conn`` the thread-backed connection pool the durable scheduler
shares, and the store's one translation of sqlite3 failures; ``schema`` the
tables and their migrations.
"""

from .store import DEFAULT_PATH, SqliteStore, sqlite

__all__ = ["DEFAULT_PATH", "SqliteStore", "sqlite"]
