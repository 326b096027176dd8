"""The Postgres store (the ``postgres`` extra: psycopg).

``store`` is the store itself; ``conn`` the Trio-native libpq driver the
durable scheduler shares; ``sql`` the statements; ``group`` the group commit;
``shared`` the pools and the LISTEN connection shared per process.
"""

from .store import ListenerStatistics, PostgresStore, postgres

__all__ = ["ListenerStatistics", "PostgresStore", "postgres"]
