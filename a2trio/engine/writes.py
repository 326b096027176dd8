"""The write path: appends, and the reaction they get going.

An append validates its events (``inputs.validate``), writes them, and hands
what it left pending to the session's drain (``drains.py``): the running one
is woken (or given the events the append claimed for it), never duplicated;
if none runs, one starts in the server's nursery. A dispatch append arms a
scheduler drain instead, and an external inline append arms a watchdog.
:class:`Writes` is the :class:`~a2trio.engine.context.Appends` that sessions,
handlers and actor calls write through. An append in the app's transaction
(``engine/transaction.py``) is written unclaimed, and its reaction waits for
the commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import msgspec
import trio

from ..contract import AppendInput, Event
from ..push import PushedEvent
from ..stores.base import AppendEvent, AppendResult, ClaimRequest, EventCause
from ..telemetry import NOOP_TELEMETRY
from .context import Engine, Source, WriteMode, measured
from .drains import DrainRegistry
from .handlers import HandlerSpec
from .inputs import validate
from .transaction import Transaction
from .watchdogs import LeaseWindow

__all__ = ["Writes"]


class Writes:
    """The write path of one server, and the drains it feeds (its
    :attr:`drains`, built here: their handlers append through this).

    Args:
      handlers: event type -> handler spec.
      max_handlers: handlers running at once across the server's drains.
    """

    def __init__(
        self, engine: Engine, handlers: Mapping[str, HandlerSpec], max_handlers: int
    ) -> None:
        self.engine = engine
        self.drains = DrainRegistry(engine, handlers, max_handlers, self)

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
        transaction: Transaction | None = None,
    ) -> list[Event[Any]]:
        """Validate and append ``events``, then get their reaction going.

        ``mode="inline"`` wakes this process's drain (and arms a watchdog for
        an external append); ``"dispatch"`` arms a scheduler drain instead.
        ``require_arm`` (a scheduler-delivered append) raises if that arm fails.
        ``expected_index`` makes the commit conditional (``Store.append``).
        ``trace_parent`` (an HTTP push's trace headers) is the ``a2.append``
        span's remote parent; each event stores that span's trace context.
        ``transaction`` (an inline external append) writes in the app's
        transaction, unclaimed; the reaction starts once it commits
        (:meth:`_committed`).

        Raises:
          RuntimeError: the server is not open (checked before writing); the
            transaction is over.
          TypeError: dispatch without a scheduler; bad inputs.
          ValueError: the transaction is open on another store.
          A2Error: validation and store errors (nothing written).

        Cancellation: a checkpoint. Cancelled midway, every event was written
        or none was; retrying with the same ids replays. The drain it wakes
        lives in the server's nursery, not in this task.
        """
        engine = self.engine
        watchdogs = engine.watchdogs
        telemetry = engine.telemetry
        # The default telemetry records nothing: its attributes are not built
        # (as for an attempt's span, engine/runs.py).
        attributes: dict[str, str | int] = {}
        if telemetry is not NOOP_TELEMETRY:
            attributes = {
                "a2.contract": engine.contract.name,
                "a2.session_id": session_id,
                "a2.append.source": source,
                "a2.append.mode": mode,
                "a2.append.types": ",".join(str(getattr(e, "type", "?")) for e in events),
                "a2.append.count": len(events),
            }
        with telemetry.span("a2.append", attributes, parent=trace_parent) as span:
            # Checked before writing: an append's drain needs the nursery.
            engine.background.require_open()
            if mode == "dispatch" and engine.scheduler is None:
                raise TypeError("dispatch requires a scheduler: pass Server(scheduler=...)")
            validated = validate(
                engine, session_id, events, trace_context=telemetry.trace_context()
            )
            if causes is not None:
                validated = [
                    msgspec.structs.replace(event, cause=cause)
                    for event, cause in zip(validated, causes, strict=True)
                ]
            if transaction is not None:
                return await self._append_in(transaction, session_id, validated, expected_index)
            window = watchdogs.window()
            watchdog_at: int | None = None
            if engine.scheduler is not None and source == "external" and mode == "inline":
                watchdog_at = watchdogs.slot(window.watchdog_at_ms)
            result = await self._store_append(
                session_id, validated, mode, window, watchdog_at, expected_index
            )
            watchdogs.wake_delayed(session_id, result.events)
            appended = [engine.to_public(row) for row in result.events]
            metrics = engine.metrics
            if metrics is not None:
                contract = engine.contract.name
                for row in result.events:
                    metrics.appended(contract, row.type, source)
            if not result.has_pending:
                return appended
            if mode == "dispatch":
                await watchdogs.arm_now(session_id, watchdogs.slot_floor(engine.clock.now_ms()))
                return appended
            # One arm per slot (the seed's startSchedulerArm), except that a
            # scheduler-delivered append must see its own arm succeed.
            if watchdog_at is not None and (
                watchdogs.claim_slot(session_id, watchdog_at) or require_arm
            ):
                try:
                    with trio.fail_after(engine.timings.scheduler_arm_timeout_s):
                        await watchdogs.arm_now(session_id, watchdog_at)
                except (Exception, trio.TooSlowError) as exc:
                    watchdogs.forget_slot(session_id, watchdog_at)
                    span.set_attribute("a2.append.armed", False)
                    span.record_error(exc)
                    if require_arm:
                        raise
            return appended

    async def _append_in(
        self,
        transaction: Transaction,
        session_id: str,
        events: Sequence[AppendEvent],
        expected_index: int | None,
    ) -> list[Event[Any]]:
        """Append in the app's transaction: nothing claimed (no drain may
        start on rows that could roll back), the reaction left to the commit."""
        engine = self.engine
        if not isinstance(transaction, Transaction):
            raise TypeError(f"transaction must be server.transaction()'s, got {transaction!r}")
        inner = transaction.writing(engine.store)
        call = inner.append(engine.key(session_id), events, expected_index=expected_index)
        metrics = engine.metrics
        result = await (call if metrics is None else measured(metrics, "append", call))
        transaction.on_commit(partial(self._committed, session_id, result))
        return [engine.to_public(row) for row in result.events]

    def _committed(self, session_id: str, result: AppendResult) -> None:
        """What an append in a transaction starts once it committed: counts,
        the drain woken, a watchdog armed in the background (as an external
        inline append would, from the lease window at the commit)."""
        engine = self.engine
        metrics = engine.metrics
        if metrics is not None:
            for row in result.events:
                metrics.appended(engine.contract.name, row.type, "external")
        if not result.has_pending or not engine.background.is_open:
            # A server closed meanwhile leaves the work to a sweep or watchdog.
            return
        watchdogs = engine.watchdogs
        window = watchdogs.window()
        if engine.run_handlers:
            armed = None if engine.scheduler is None else watchdogs.slot(window.watchdog_at_ms)
            self.drains.wake(session_id, armed)
        watchdogs.arm(session_id, window.watchdog_at_ms)

    async def _store_append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        mode: WriteMode,
        window: LeaseWindow,
        watchdog_at_ms: int | None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append, and get the pending work of an inline append running.

        An inline append on a server that runs handlers writes its events
        claimed for this process's drain (``ClaimRequest``): the handler starts
        one round trip sooner than if the drain claimed, and the row is written
        once. The drain is woken to claim only if the session held other
        claimable events. The lease ``window`` is taken before the call, as
        the drain does, so its estimate never outlives the store's stamp.
        While the append is in flight the running drain knows an answer is
        coming, so it does not end (or claim against its own holder's fresh
        claims).
        """
        engine = self.engine
        drains = self.drains
        key = engine.key(session_id)
        pending = sum(not e.settled for e in events)
        # Claimed at insert only with a slot for each event (taken here, kept
        # by each claimed event's attempt): past that the drain claims as
        # slots free (backpressure on claims).
        if (
            mode != "inline"
            or not engine.run_handlers
            or not pending
            or not drains.slots.take(pending)
        ):
            result = await _write(engine, key, events, None, expected_index)
            if result.has_pending and mode == "inline" and engine.run_handlers:
                drains.wake(session_id, watchdog_at_ms)
            return result
        signal = drains.mailbox(session_id)
        if signal is None:
            claim = ClaimRequest(str(uuid.uuid4()), window.ttl_ms)
        else:
            claim = ClaimRequest(signal.holder, window.ttl_ms)
            signal.begin_append()
        adopted = 0
        try:
            result = await _write(engine, key, events, claim, expected_index)
            if result.claimed:
                adopted = len(result.claimed)
                drains.adopt(
                    session_id,
                    claim.holder,
                    result.claimed,
                    window.expires_at,
                    window.watchdog_at_ms,
                    watchdog_at_ms,
                )
            # Keyed events not claimed at insert and throttled ones are claimed
            # by the drain, under their limits (``rules.claims_at_insert``); a
            # debounced append may have skipped a lane head, whose lane moved on.
            if result.others_claimable or any(
                (e.concurrency_key is not None and adopted < pending)
                or e.throttle_key is not None
                or e.debounce_key is not None
                for e in events
            ):
                drains.wake(session_id, watchdog_at_ms)
        finally:
            # The slots of events written unclaimed (a lane's later events, a
            # replay), or of a failed append.
            drains.slots.give_back(pending - adopted)
            if signal is not None:
                signal.appended()
        return result


async def _write(
    engine: Engine,
    key: str,
    events: Sequence[AppendEvent],
    claim: ClaimRequest | None,
    expected_index: int | None,
) -> AppendResult:
    """``store.append`` (timed, with metrics), naming ``expected_index`` only
    for a conditional append, so that stores written before it keep working
    for the rest."""
    store = engine.store
    if expected_index is None:
        call = store.append(key, events, claim=claim)
    else:
        call = store.append(key, events, claim=claim, expected_index=expected_index)
    metrics = engine.metrics
    return await (call if metrics is None else measured(metrics, "append", call))
