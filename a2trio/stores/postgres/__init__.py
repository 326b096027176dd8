"""The Postgres store (the ``postgres`` extra: psycopg).

``store`` is the store itself (its theory of operation), composed of
``database`` (its settings, its share of the pool, its statements in one
round trip each, a group's members in lock order), ``writes`` (appends,
claims, renewals, completions, failures, group-committed through
:mod:`a2trio.stores.group`), ``listener`` (its side of the shared LISTEN
connection, and ``store.pending``), ``presence``, ``inspection`` and
``operator`` (its operator actions, ``store.operator``); ``codec`` encodes
parameters and decodes rows. ``conn`` is the Trio-native libpq driver the
durable scheduler shares, and the store's one translation of its failures;
``sql`` the statements; ``shared`` the pools and the LISTEN connection
shared per process.
"""

from .listener import ListenerStatistics
from .store import PostgresStore, postgres

__all__ = ["ListenerStatistics", "PostgresStore", "postgres"]
