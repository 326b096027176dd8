"""Store factories for the conformance suite, one module per backend.

Each module exposes ``open_store(clock)``: an async context manager yielding a
fresh, entered store that stamps rows with ``clock`` (see
``a2trio.stores.conformance.StoreFactory``).
"""
