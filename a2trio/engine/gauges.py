"""A server's gauges: live feeds, and its contract's backlog read from the store.

The backlog (:class:`~a2trio.telemetry.Depth`) is read when metrics are read
(a Prometheus scrape), never on the hot path, and its cost is bounded twice:
a read younger than :data:`DEPTH_MAX_AGE_S` is answered from memory, so
scrapes from several Prometheus replicas (or a tight interval) cost one read;
and a read lists at most :data:`DEPTH_MAX_SESSIONS` sessions (pages of the
inspection's ``list_sessions``) and asks the sweep for at most that many
claimable sessions, so a contract with millions of sessions costs a bounded
read (and says ``complete=False``). Concurrent scrapes share one read.
While a server with metrics is open it also reads every
:data:`DEPTH_POLL_S` (:meth:`ServerGauges.poll`), for readers that cannot
await a read (an OpenTelemetry reader's callbacks run in its own thread):
with a scrape every 15 s that adds no read at all (the scrape's is fresh).
"""

from __future__ import annotations

import logging

import trio

from ..telemetry import Depth
from .context import Engine

__all__ = ["DEPTH_MAX_AGE_S", "DEPTH_MAX_SESSIONS", "DEPTH_POLL_S", "ServerGauges"]

#: A backlog read is reused for this long (Prometheus scrapes every 15 s by default).
DEPTH_MAX_AGE_S = 5.0
#: The most sessions one backlog read lists (10 inspection pages).
DEPTH_MAX_SESSIONS = 10_000
#: How often an open server reads its backlog on its own.
DEPTH_POLL_S = 30.0
_PAGE = 1_000

#: A failed background read of the backlog (WARNING).
logger = logging.getLogger("a2trio.metrics")


class ServerGauges:
    """The :class:`~a2trio.telemetry.Gauges` of one server (see the module
    docstring)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._depth: Depth | None = None
        self._read_at: float | None = None
        self._reading: trio.Event | None = None

    @property
    def contract(self) -> str:
        return self._engine.contract.name

    def live_feeds(self) -> int:
        return self._engine.feeds.readers()

    def depth(self) -> Depth | None:
        return self._depth

    async def read_depth(self) -> Depth | None:
        now = trio.current_time()
        if self._read_at is not None and now - self._read_at < DEPTH_MAX_AGE_S:
            return self._depth
        if self._reading is not None:
            await self._reading.wait()
            return self._depth
        self._reading = trio.Event()
        try:
            self._depth = await self._read()
            self._read_at = trio.current_time()
        finally:
            self._reading.set()
            self._reading = None
        return self._depth

    async def poll(self) -> None:
        """Read the backlog every :data:`DEPTH_POLL_S` until cancelled (a
        background task of the server); a failed read is retried at the next
        poll, the last good one kept meanwhile.

        Cancellation: a read; nothing to undo.
        """
        while True:
            try:
                await self.read_depth()
            except Exception:
                logger.warning(
                    "reading the backlog of %r for metrics failed", self.contract, exc_info=True
                )
            await trio.sleep(DEPTH_POLL_S)

    async def _read(self) -> Depth | None:
        engine = self._engine
        store = engine.store
        api = store.inspect
        if api is None:
            return None
        prefix = engine.key("")
        pending = dead = sessions_pending = listed = 0
        oldest_ms: int | None = None
        cursor: str | None = None
        complete = False
        while listed < DEPTH_MAX_SESSIONS:
            page = await api.list_sessions(prefix=prefix, limit=_PAGE, cursor=cursor)
            for summary in page.sessions:
                pending += summary.pending_count
                dead += summary.failed_count
                if summary.pending_count:
                    sessions_pending += 1
                    if oldest_ms is None or summary.updated_at_ms < oldest_ms:
                        oldest_ms = summary.updated_at_ms
            listed += len(page.sessions)
            cursor = page.cursor
            if cursor is None:
                complete = True
                break
        claimable: int | None = None
        if store.sweep is not None:
            claimable = len(await store.sweep.claimable_sessions(prefix, limit=DEPTH_MAX_SESSIONS))
        age_s = 0.0 if oldest_ms is None else max(0, engine.clock.now_ms() - oldest_ms) / 1000
        return Depth(pending, dead, sessions_pending, claimable, age_s, complete)
