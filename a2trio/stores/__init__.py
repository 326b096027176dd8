"""Store backends and the seam they implement.

``memory()`` and ``sqlite()`` need nothing beyond the core. ``postgres()``
needs the ``postgres`` extra (psycopg) and ``redis()`` the ``redis`` extra
(coredis); without it, calling it raises ``STORE_NOT_CONFIGURED`` naming the
extra.

Every store takes ``clock=`` (where stored timestamps come from) and ``ids=``
(an :class:`IdSource`: where the ids of events appended without one come
from; random UUIDs unless given).
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from ..errors import A2Error, ErrorCode
from ..ids import IdSource
from .base import Store
from .memory import MemoryStore, memory
from .sqlite import SqliteStore, sqlite

try:
    from .postgres import PostgresStore, postgres
except ImportError as _missing:  # pragma: no cover - the dev extra installs psycopg
    if not (_missing.name or "").startswith("psycopg"):
        raise
    _reason = str(_missing)

    def postgres(*args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[misc]
        """Stand-in when psycopg is not installed."""
        raise A2Error(
            ErrorCode.STORE_NOT_CONFIGURED,
            f"the Postgres store needs psycopg: pip install 'a2trio[postgres]' ({_reason})",
        )


try:
    from .redis import RedisStore, redis
except ImportError as _missing_redis:  # pragma: no cover - the dev extra installs coredis
    if not (_missing_redis.name or "").startswith("coredis"):
        raise
    _redis_reason = str(_missing_redis)

    def redis(*args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[misc]
        """Stand-in when coredis is not installed."""
        raise A2Error(
            ErrorCode.STORE_NOT_CONFIGURED,
            f"the Redis store needs coredis: pip install 'a2trio[redis]' ({_redis_reason})",
        )


__all__ = [
    "IdSource",
    "MemoryStore",
    "PostgresStore",
    "RedisStore",
    "SqliteStore",
    "Store",
    "StoreURLError",
    "default_store",
    "from_url",
    "memory",
    "postgres",
    "redis",
    "sqlite",
]


class StoreURLError(ValueError):
    """A store URL that names no backend (``A2_STORE``, ``--store``)."""


def from_url(url: str) -> Store:
    """Build a store from a URL: ``memory:``, ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``, ``sqlite:///:memory:``, ``postgresql://...``,
    ``redis://...`` / ``rediss://...`` (key prefix ``a2``).

    Raises:
      StoreURLError: an unknown scheme (a ``ValueError``).
    """
    if url.startswith("memory"):
        return memory()
    if url.startswith("sqlite:"):
        # SQLAlchemy's spelling: sqlite:///relative.db, sqlite:////abs/path.db.
        path = url.removeprefix("sqlite:").removeprefix("//").removeprefix("/")
        return sqlite(path or ".a2/dev.db")
    if url.startswith(("postgres://", "postgresql://")):
        return postgres(url)
    if url.startswith(("redis://", "rediss://")):
        return redis(url)
    raise StoreURLError(
        f"unknown store URL {url!r}: use 'memory:', 'sqlite:///path', 'postgresql://...'"
        " or 'redis://...'"
    )


def default_store(contract_name: str) -> Store:
    """The store a server gets when it is given none: ``A2_STORE`` if set (a
    URL for :func:`from_url`), else by ``A2_ENV``: ``production`` refuses,
    ``test`` is memory, anything else sqlite at ``.a2/dev.db``.

    Raises:
      A2Error: ``STORE_NOT_CONFIGURED`` under ``A2_ENV=production``.
      StoreURLError: an unknown ``A2_STORE`` URL (a ``ValueError``).
    """
    url = os.environ.get("A2_STORE")
    if url:
        return from_url(url)
    env = os.environ.get("A2_ENV", "development")
    if env == "production":
        raise A2Error(
            ErrorCode.STORE_NOT_CONFIGURED,
            f"the server for '{contract_name}' has no store and A2_ENV is 'production': "
            "pass store=a2trio.stores.postgres(...) or set A2_STORE",
        )
    if env == "test":
        return memory()
    return sqlite(".a2/dev.db")
