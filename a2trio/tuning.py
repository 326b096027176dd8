"""Process-wide tuning for processes that run a2trio servers.

Every event in flight is a task, a few coroutines, a lease scope and its rows,
and under load thousands are in flight at once. With Python's collector
settings they outlive the young collections (every 700 allocations), get
promoted, and keep triggering full collections that traverse them all: over
half of the client's CPU per event in ``bench/vs_queues.py``
(``docs/performance.md``, "Garbage collection").
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_THRESHOLD", "tune_gc"]

#: The young-generation threshold :func:`tune_gc` sets (Python's is 700).
GC_THRESHOLD: Final = 20_000


def tune_gc(threshold: int = GC_THRESHOLD) -> None:
    """Tune Python's garbage collector for a process that runs a2trio servers.

    Freezes what exists now (imports, the app: never garbage) out of every
    later collection, and collects the young generation every ``threshold``
    allocations instead of 700, so most of an event's objects die before a
    collection sees them. Call it once, after building the app. It changes
    the whole process, which is why a2trio never calls it on its own;
    ``python -m a2trio.serve`` owns its process and calls it for you.

    Raises:
      ValueError: ``threshold`` is not a positive int.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a positive int, got {threshold!r}")
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
