"""Moved to :mod:`a2trio.engine.fanout`; this path stays for the names the
docs give it (``a2trio.fanout.RING``)."""

from .engine.fanout import (
    RING,
    RUN,
    FeedEntry,
    Lapped,
    SessionFanout,
    Subscription,
    open_store_subscription,
    open_subscription,
)

__all__ = [
    "RING",
    "RUN",
    "FeedEntry",
    "Lapped",
    "SessionFanout",
    "Subscription",
    "open_store_subscription",
    "open_subscription",
]
