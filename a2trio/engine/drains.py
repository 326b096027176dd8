"""The drain registry: one background drain per session per process.

The write path (``writes.py``) hands what an append left pending to the
session's drain: the running one is woken (or given the events the append
claimed for it), never duplicated; if none runs, one starts in the server's
nursery. The sweep and other processes' wake-ups wake drains the same way.
Leaving ``async with server`` cancels background drains: their claims lapse
and a later drain retries, exactly as after a crash. :class:`DrainRegistry`
is the only owner of that map and of the
:class:`~a2trio.engine.mailbox.DrainSignal` it keeps per running drain.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import trio

from ..errors import A2Error
from ..stores.base import StoredEvent, SweepsClaimable
from .context import Appends, Engine
from .drain import DrainResult, HandlerSlots, drain_session
from .handlers import HandlerSpec
from .mailbox import DrainSignal

__all__ = ["OUTAGE_LOG_EVERY_S", "SWEEP_LIMIT", "DrainRegistry", "StoreHealth"]

#: Sessions one sweep pass wakes at most; the rest wait for the next pass.
SWEEP_LIMIT = 1_000
#: While the store stays unreachable, repeat the ERROR at most this often.
OUTAGE_LOG_EVERY_S = 60.0

logger = logging.getLogger("a2trio.store")


class StoreHealth:
    """Logs a store that became unreachable (ERROR, once, then at most every
    :data:`OUTAGE_LOG_EVERY_S` while it stays so) and its recovery (INFO), so
    an outage does not flood the log with one line per failed call."""

    def __init__(self, contract: str) -> None:
        self.contract = contract
        self._down_since: float | None = None
        self._logged_at = -math.inf

    @property
    def down(self) -> bool:
        """Whether the last call this saw failed."""
        return self._down_since is not None

    def failed(self, what: str, error: BaseException) -> None:
        """A call (``what``: "drain", "sweep") failed with ``error``."""
        now = trio.current_time()
        extra = {"a2_contract": self.contract}
        cause = error.__cause__ or error
        if self._down_since is None:
            self._down_since = now
            self._logged_at = now
            logger.error(
                "the store is unavailable (%s: %s); work waits and is retried",
                what,
                cause,
                extra=extra,
            )
        elif now - self._logged_at >= OUTAGE_LOG_EVERY_S:
            self._logged_at = now
            logger.error(
                "the store is still unavailable after %.0f s (%s: %s)",
                now - self._down_since,
                what,
                cause,
                extra=extra,
            )

    def ok(self) -> None:
        """A call succeeded: log the recovery if the store was down."""
        if self._down_since is None:
            return
        logger.info(
            "the store is available again after %.1f s",
            trio.current_time() - self._down_since,
            extra={"a2_contract": self.contract},
        )
        self._down_since = None


class DrainRegistry:
    """The drains of one server (see the module docstring).

    Args:
      handlers: event type -> handler spec.
      max_handlers: handlers running at once across the server's drains
        (:attr:`slots`).
      appends: the write path the handlers' sessions append through.
    """

    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, HandlerSpec],
        max_handlers: int,
        appends: Appends,
    ) -> None:
        self.engine = engine
        self.handlers = handlers
        self.appends = appends
        self.slots = HandlerSlots(max_handlers)
        self.health = StoreHealth(engine.contract.name)
        self._drains: dict[str, DrainSignal] = {}
        engine.waiters.on_free = self._flow_freed

    @property
    def running(self) -> int:
        """Background drains running now."""
        return len(self._drains)

    def mailbox(self, session_id: str) -> DrainSignal | None:
        """The mailbox of the session's running background drain, if one runs."""
        signal = self._drains.get(session_id)
        return None if signal is None or signal.closed else signal

    def adopt(
        self,
        session_id: str,
        holder: str,
        events: list[StoredEvent],
        expires_at: float,
        drain_watchdog_ms: int,
        watchdog_at_ms: int | None,
    ) -> None:
        """Hand events an append claimed (for ``holder``, lease estimate
        ``expires_at``) to the session's drain, starting one. The caller took
        a slot (``slots.take``) for each event; its attempt gives it back."""
        signal = self._drains.get(session_id)
        if signal is None or signal.closed:
            signal = DrainSignal(holder)
            self._drains[session_id] = signal
            self.engine.background.spawn(self._background_drain, session_id, signal, watchdog_at_ms)
        signal.adopt(holder, events, expires_at, drain_watchdog_ms)

    def wake(self, session_id: str, watchdog_at_ms: int | None = None) -> None:
        """Wake the session's drain to claim, starting one if none runs."""
        signal = self._drains.get(session_id)
        if signal is not None and not signal.closed:
            signal.notify()
            return
        signal = DrainSignal()
        # Marked woken, so the new drain claims first even if an append hands
        # it events before it starts (it would otherwise take those as all).
        signal.notify()
        self._drains[session_id] = signal
        self.engine.background.spawn(self._background_drain, session_id, signal, watchdog_at_ms)

    def _flow_freed(self, session_id: str) -> None:
        # A slot of a key this session waits on freed here.
        if self.engine.background.is_open:
            self.wake(session_id)

    def wake_key(self, key: str) -> None:
        """Another process appended to store key ``key``: wake its drain if the
        key is this contract's and the server is open."""
        session_id = self.engine.session_of(key)
        if session_id is not None and self.engine.background.is_open:
            self.wake(session_id)

    async def sweep(self, store: SweepsClaimable) -> None:
        """Run forever: at once and every ``sweep_s``, wake the drain of each
        session of this contract that the store says holds claimable work (a
        crashed process's expired claims, work appended while no worker ran,
        failures due for a retry). One index-bounded query per pass; a store
        that fails is asked again at the next pass."""
        engine = self.engine
        prefix = engine.key("")
        while True:
            try:
                keys = await store.claimable_sessions(prefix, limit=SWEEP_LIMIT)
            except Exception as exc:
                # Unreachable: the drains it would wake could not claim.
                self.health.failed("sweep", exc)
                keys = []
            else:
                self.health.ok()
            for key in keys:
                session_id = engine.session_of(key)
                signal = self._drains.get(session_id) if session_id is not None else None
                # A running drain claims again by itself before it ends.
                if session_id is not None and (signal is None or signal.closed):
                    self.wake(session_id)
            await trio.sleep(engine.timings.sweep_s)

    async def _background_drain(
        self, session_id: str, signal: DrainSignal, watchdog_at_ms: int | None
    ) -> None:
        try:
            await self.drain(session_id, signal=signal, watchdog_due_at_ms=watchdog_at_ms)
        except A2Error as exc:
            # The store is unreachable: claims lapse; the sweep, the next
            # append or a watchdog retries.
            self.health.failed("drain", exc)
        else:
            self.health.ok()
        finally:
            signal.close()
            if self._drains.get(session_id) is signal:
                del self._drains[session_id]

    async def drain(
        self,
        session_id: str,
        *,
        signal: DrainSignal | None = None,
        watchdog_due_at_ms: int | None = None,
    ) -> DrainResult:
        """Run one drain of ``session_id`` in this task (see ``drain.py``).

        Cancellation: cancelling cancels the handlers; their claims lapse and
        a later drain retries them.
        """
        return await drain_session(
            self.engine,
            self.handlers,
            self.appends,
            self.slots,
            session_id,
            signal=signal,
            watchdog_due_at_ms=watchdog_due_at_ms,
        )
