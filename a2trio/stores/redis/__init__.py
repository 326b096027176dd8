"""The Redis store (the ``redis`` extra: coredis): the seed's Redis Streams
backend (``experimental-a2/store-redis``).

``store`` is the store itself (:class:`RedisStore`, :func:`redis`); ``conn``
the command client every call runs its script on, and the one error point;
``scripts`` the Lua scripts and the key layout; ``codec`` the keys' names and
the records as the scripts store them; ``subscriber`` the shared subscriber
connection and the live feeds on it (and ``store.pending``); ``claims``
claiming, renewing, failing and the sweep (``store.sweep``); ``operator`` the
operator actions (``store.operator``); ``presence`` the presence plane;
``inspection`` ``store.inspect``.

Theory of operation
-------------------

**Driver.** coredis (6.x, built on anyio, so it runs on Trio natively)
multiplexes commands over its connections; ``bench/redis_driver.py`` measured
it against redis-py (through a thread, and its asyncio client through
trio-asyncio), see ``docs/performance.md``. ``async with store:`` opens the
store's nursery, where one task holds the coredis client (its connection pool
lives there) and, once a feed, a presence subscriber or a pending watcher
needs it, one task holds the **shared subscriber connection**. Connections
scale with processes (the subscriber, plus the command connections coredis
multiplexes calls over: it opens another only for calls that send at the
same instant), not with viewers. Calls that arrive while others are in
flight share one pipeline (``conn``): coredis' cost is mostly per round
trip, and under load it is most of the client's CPU. Outside ``async with
store:`` each operation opens a short-lived client of its own: correct,
slower, and without push delivery.

**One script per step.** Each store operation that reads and writes is one
Lua script (``scripts``; the key layout is documented there): Redis
runs it to completion before any other command, so a script is a
transaction and nothing can interleave between its checks and its writes.
That gives contiguous indexes, store-wide unique ids (the ``P:ids`` hash),
idempotent replay, partial-batch refusal, the attempt-currency fence, claims
that never share an attempt, and completion with its returned events and
the lane hand-off, each atomically. The rules are the seed's, through
``rules`` (the scripts return what the rules read; the failure verdict is
``rules.fail_verdict`` itself, written back by a compare-and-set script).

**Cancellation.** A call's round trip is shielded (coredis loses a pool slot
to a connection cancelled mid-connect, and outside ``async with store`` its
own client's connection tasks would be cancelled under it): a cancellation
lands at the checkpoint after the reply, so a cancelled call either ran whole
or never started, and waits at most the connect and command timeouts. Ids
are generated before the script runs, so a retry with the same events
replays instead of duplicating. The client never retries on its own:
a lost connection is ``STORE_UNAVAILABLE`` and the caller retries.

**Live feeds**, as the seed does them, follow the shared subscriber's
wake-ups and re-read on their own every ``notify_safety_s`` (``subscriber``).
**Presence** is the push tier (``presence``).

**Faults.** While Redis is down every operation raises ``STORE_UNAVAILABLE``
(the cause in ``__cause__``), translated at one point (``conn.errors``). The
subscriber reconnects with backoff by itself. ``aclose()`` severs every feed
with ``STORE_UNAVAILABLE`` and closes both connections. Cluster mode is out:
the scripts span a session's keys and the store-wide ones.
"""

from .store import RedisStore, redis
from .subscriber import SubscriberStatistics

__all__ = ["RedisStore", "SubscriberStatistics", "redis"]
