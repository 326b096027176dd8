"""The write path and the drain registry: one background drain per session per
process.

An append validates its events (``Engine.validate``), writes them, and hands
what it left pending to the session's drain: the running one is woken (or
given the events the append claimed for it), never duplicated; if none runs,
one starts in the server's nursery. Leaving ``async with server`` cancels
background drains: their claims lapse and a later drain retries, exactly as
after a crash. :class:`DrainRegistry` is the only owner of that map and of
the :class:`~a2trio.drain.DrainSignal` it keeps per running drain.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import trio

from ..contract import AppendInput, Event
from ..errors import A2Error
from ..push import PushedEvent
from ..stores.base import (
    AppendEvent,
    AppendResult,
    ClaimRequest,
    EventCause,
    Store,
    StoredEvent,
    SweepsClaimable,
)
from .context import Engine, Source, WriteMode
from .drain import DrainResult, DrainSignal, HandlerSlots, drain_session
from .handlers import HandlerSpec

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
        if self._down_since is None:
            return
        logger.info(
            "the store is available again after %.1f s",
            trio.current_time() - self._down_since,
            extra={"a2_contract": self.contract},
        )
        self._down_since = None


class DrainRegistry:
    """The drains of one server and the appends that feed them (an
    :class:`~a2trio.core.Appends`)."""

    def __init__(
        self, engine: Engine, handlers: Mapping[str, HandlerSpec], max_handlers: int
    ) -> None:
        self.engine = engine
        self.handlers = handlers
        self.slots = HandlerSlots(max_handlers)
        self.health = StoreHealth(engine.contract.name)
        self._drains: dict[str, DrainSignal] = {}

    @property
    def running(self) -> int:
        """Background drains running now."""
        return len(self._drains)

    # -- append ------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendInput | PushedEvent],
        *,
        source: Source,
        mode: WriteMode,
        causes: Sequence[EventCause] | None = None,
        require_arm: bool = False,
        expected_index: int | None = None,
        trace_parent: str | None = None,
    ) -> list[Event[Any]]:
        """Validate and append ``events``, then get their reaction going.

        ``mode="inline"`` wakes this process's drain (and arms a watchdog for
        an external append); ``"dispatch"`` arms a scheduler drain instead.
        ``require_arm`` (a scheduler-delivered append) raises if that arm fails.
        ``expected_index`` makes the commit conditional (``Store.append``).
        ``trace_parent`` (an HTTP push's trace headers) is the ``a2.append``
        span's remote parent; each event stores that span's trace context.

        Raises:
          RuntimeError: the server is not open (checked before writing).
          TypeError: dispatch without a scheduler; bad inputs.
          A2Error: validation and store errors (nothing written).
        """
        engine = self.engine
        attributes: dict[str, str | int] = {
            "a2.contract": engine.contract.name,
            "a2.session_id": session_id,
            "a2.append.source": source,
            "a2.append.mode": mode,
            "a2.append.types": ",".join(str(getattr(e, "type", "?")) for e in events),
            "a2.append.count": len(events),
        }
        telemetry = engine.telemetry
        with telemetry.span("a2.append", attributes, parent=trace_parent) as span:
            # Checked before writing: an append's drain needs the nursery.
            engine.require_open()
            if mode == "dispatch" and engine.scheduler is None:
                raise TypeError("dispatch requires a scheduler: pass Server(scheduler=...)")
            validated = engine.validate(session_id, events, trace_context=telemetry.trace_context())
            if causes is not None:
                validated = [
                    msgspec.structs.replace(event, cause=cause)
                    for event, cause in zip(validated, causes, strict=True)
                ]
            watchdog_at: int | None = None
            if engine.scheduler is not None and source == "external" and mode == "inline":
                ttl_ms = int(engine.timings.claim_ttl_s * 1000)
                grace_ms = int(engine.timings.watchdog_grace_s * 1000)
                watchdog_at = engine.slot(engine.clock.now_ms() + ttl_ms + grace_ms)
            result = await self._store_append(
                session_id, validated, mode, watchdog_at, expected_index
            )
            appended = [engine.to_public(row) for row in result.events]
            if not result.has_pending:
                return appended
            if mode == "dispatch":
                await engine.arm_now(session_id, engine.slot_floor(engine.clock.now_ms()))
                return appended
            # One arm per slot (the seed's startSchedulerArm), except that a
            # scheduler-delivered append must see its own arm succeed.
            if watchdog_at is not None and (
                engine.claim_slot(session_id, watchdog_at) or require_arm
            ):
                try:
                    with trio.fail_after(engine.timings.scheduler_arm_timeout_s):
                        await engine.arm_now(session_id, watchdog_at)
                except (Exception, trio.TooSlowError) as exc:
                    engine.forget_slot(session_id, watchdog_at)
                    span.set_attribute("a2.append.armed", False)
                    span.record_error(exc)
                    if require_arm:
                        raise
            return appended

    async def _store_append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        mode: WriteMode,
        watchdog_at_ms: int | None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append, and get the pending work of an inline append running.

        An inline append on a server that runs handlers writes its events
        claimed for this process's drain (``ClaimRequest``): the handler starts
        one round trip sooner than if the drain claimed, and the row is written
        once. The drain is woken to claim only if the session held other
        claimable events. The local lease estimate is taken before the call,
        as the drain does, so it never outlives the store's stamp. While the
        append is in flight the running drain knows an answer is coming, so it
        does not end (or claim against its own holder's fresh claims).
        """
        engine = self.engine
        key = engine.key(session_id)
        pending = sum(not e.settled for e in events)
        # Claimed at insert only with a slot for each event (taken here, kept
        # by each claimed event's attempt): past that the drain claims as
        # slots free (backpressure on claims).
        if (
            mode != "inline"
            or not engine.run_handlers
            or not pending
            or not self.slots.take(pending)
        ):
            result = await _write(engine.store, key, events, None, expected_index)
            if result.has_pending and mode == "inline" and engine.run_handlers:
                self.wake(session_id, watchdog_at_ms)
            return result
        ttl_s = engine.timings.claim_ttl_s
        expires_at = trio.current_time() + ttl_s
        drain_watchdog_ms = engine.clock.now_ms() + int(
            (ttl_s + engine.timings.watchdog_grace_s) * 1000
        )
        signal = self._drains.get(session_id)
        if signal is None or signal.closed:
            signal = None
            claim = ClaimRequest(str(uuid.uuid4()), int(ttl_s * 1000))
        else:
            claim = ClaimRequest(signal.holder, int(ttl_s * 1000))
            signal.begin_append()
        adopted = 0
        try:
            result = await _write(engine.store, key, events, claim, expected_index)
            if result.claimed:
                adopted = len(result.claimed)
                self.adopt(
                    session_id,
                    claim.holder,
                    result.claimed,
                    expires_at,
                    drain_watchdog_ms,
                    watchdog_at_ms,
                )
            if result.others_claimable:
                self.wake(session_id, watchdog_at_ms)
        finally:
            # The slots of events written unclaimed (a lane's later events, a
            # replay), or of a failed append.
            self.slots.give_back(pending - adopted)
            if signal is not None:
                signal.appended()
        return result

    # -- drains ---------------------------------------------------------------------

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
            self.engine.spawn(self._background_drain, session_id, signal, watchdog_at_ms)
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
        self.engine.spawn(self._background_drain, session_id, signal, watchdog_at_ms)

    def wake_key(self, key: str) -> None:
        """Another process appended to store key ``key``: wake its drain if the
        key is this contract's and the server is open."""
        session_id = self.engine.session_of(key)
        if session_id is not None and self.engine.is_open:
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
        """Run one drain of ``session_id`` in this task (see ``drain.py``)."""
        return await drain_session(
            self.engine,
            self.handlers,
            self,
            self.slots,
            session_id,
            signal=signal,
            watchdog_due_at_ms=watchdog_due_at_ms,
        )


async def _write(
    store: Store,
    key: str,
    events: Sequence[AppendEvent],
    claim: ClaimRequest | None,
    expected_index: int | None,
) -> AppendResult:
    """``store.append``, naming ``expected_index`` only for a conditional
    append, so that stores written before it keep working for the rest."""
    if expected_index is None:
        return await store.append(key, events, claim=claim)
    return await store.append(key, events, claim=claim, expected_index=expected_index)
