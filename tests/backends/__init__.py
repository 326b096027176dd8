"""Store factories for the conformance suite, one module per backend.

Each module exposes ``open_store(clock, ids=None)``: an async context manager
yielding a fresh, entered store that stamps rows with ``clock`` and generates
event ids from ``ids`` (see ``a2trio.stores.conformance.StoreFactory``).
Postgres and Redis pass ``ids`` on with their other ``**options``.
"""
