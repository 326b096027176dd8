"""The SQLite store: the embedded default, on stdlib ``sqlite3``.

``store`` is the store itself; ``conn`` the thread-backed connection pool the
durable scheduler shares; ``schema`` the tables and their migrations.
"""

from .store import DEFAULT_PATH, SqliteStore, sqlite

__all__ = ["DEFAULT_PATH", "SqliteStore", "sqlite"]
