"""The Redis store (the ``redis`` extra: coredis).

``store`` is the store itself; ``scripts`` the Lua scripts and the key layout.
"""

from .store import RedisStore, SubscriberStatistics, redis

__all__ = ["RedisStore", "SubscriberStatistics", "redis"]
