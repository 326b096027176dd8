"""Moved to :mod:`a2trio.engine` (the drain in ``engine/drain.py``, what a
failure stores in ``engine/attempt.py``, the mailbox in ``engine/mailbox.py``);
this path stays for the names the docs give it (``a2trio.drain.MAX_ERROR_CHARS``)."""

from .engine.attempt import MAX_ERROR_CHARS, stored_error
from .engine.drain import DrainOutcome, DrainResult, HandlerSlots, drain_session
from .engine.mailbox import DrainSignal

__all__ = [
    "MAX_ERROR_CHARS",
    "DrainOutcome",
    "DrainResult",
    "DrainSignal",
    "HandlerSlots",
    "drain_session",
    "stored_error",
]
