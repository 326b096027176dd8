"""The drain: claim, run under leases, and claim again until nothing is left.

Theory of operation
-------------------

A *drain* processes one session until nothing is claimable. It owns a nursery
holding one heartbeat task, the abort hub (while some running handler has
``abort_on``) and one task per claimed event. Nothing it starts outlives it.

Claims. A drain claims every eligible event at once under a random holder id
and a ttl. The store advances each event's durable ``attempt`` and stamps the
claim's expiry on its own clock. Before asking, the drain takes a lease window
(``watchdogs.py``): the *local lease estimate* is Trio time then + ttl, never
later than the store's stamp, so a drain can conclude "my claim may be gone"
with zero I/O, even while the store is unreachable.

Two cancel scopes wrap each handler:

* the **lease scope**, whose deadline is the local lease estimate. The
  heartbeat renews every active claim each ``heartbeat_s`` and moves the
  deadlines it renewed; after a failed renewal it retries promptly (jittered)
  while any lease is still saveable. If the deadline passes the handler is
  cancelled: *surrendered*, no completion and no failure spent; the claim
  expires in the store and a later drain retries with attempt + 1. A renewal
  that reports a newer attempt (durable proof of supersession) cancels the
  scope at once, and so does this drain re-claiming an index it still tracks.
* the **abort scope**, cancelled by the abort hub when a matching ``abort_on``
  event lands after the trigger. The attempt then completes with no returned
  events and the span is marked aborted. A handler that shields itself can
  watch ``ctx.aborted`` and return events instead.

Each event's attempt runs in ``runs.py``; its outcome is decided from the
scopes after the ``with`` blocks and from the store's answer, by the pure
functions of ``attempt.py`` (whose docstring gives the rules).

Claims handed over. An inline append claims its events for this process's
drain in its own transaction and hands them to the drain through its mailbox
(``mailbox.py``); the drain runs them as if it had claimed them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Literal

import msgspec
import trio

from ..stores.base import Busy, Claimed, ClaimRef, StoredEvent
from .attempt import Lease
from .context import Appends, Engine, measured
from .handlers import HandlerSpec
from .mailbox import DrainSignal
from .runs import AttemptRunner

__all__ = ["DrainOutcome", "DrainResult", "HandlerSlots", "drain_session"]

DrainOutcome = Literal["settled", "busy", "stalled"]


class DrainResult(msgspec.Struct, frozen=True):
    """What a drain did.

    Attributes:
      settled: nothing actionable remains (no failure and no live claim elsewhere).
      outcome: ``settled``; ``busy`` (claims held elsewhere, ``retry_at_ms``
        says when they expire); ``stalled`` (an event failed or was
        dead-lettered during this drain).
      processed: events completed by this drain.
    """

    settled: bool
    outcome: DrainOutcome
    processed: int
    retry_at_ms: int | None = None


class HandlerSlots:
    """The handlers one server may run at once, shared by its drains.

    A slot is taken for every event claimed (by a drain, or by an append for
    its drain) and given back when that event's attempt ends, so a server never
    holds more claims than it can run: the rest stay claimable by other
    processes (backpressure on claims, not a queue of tasks).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._freed = trio.Event()

    @property
    def free(self) -> int:
        """Slots free now."""
        return self._free

    def take(self, count: int) -> bool:
        """Take ``count`` slots if that many are free; False (none taken) if not."""
        if count > self._free:
            return False
        self._free -= count
        return True

    async def take_free(self) -> int:
        """Take every free slot, waiting for one if none is; how many.

        Cancellation: a checkpoint; cancelled, it took nothing.
        """
        await trio.lowlevel.checkpoint()
        while self._free == 0:
            if self._freed.is_set():
                self._freed = trio.Event()
            await self._freed.wait()
        # No checkpoint between the check and the take: another drain would
        # take the slots in between.
        taken, self._free = self._free, 0
        return taken

    def give_back(self, count: int) -> None:
        """Return ``count`` slots (an attempt ended, or a claim took fewer)."""
        self._free += count
        if count:
            self._freed.set()


class _Drain:
    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, HandlerSpec],
        appends: Appends,
        slots: HandlerSlots,
        session_id: str,
        signal: DrainSignal | None,
        watchdog_due_at_ms: int | None,
    ) -> None:
        self.engine = engine
        self.handlers = handlers
        self.appends = appends
        self.slots = slots
        self.store = engine.store
        self.timings = engine.timings
        self.watchdogs = engine.watchdogs
        self.session_id = session_id
        self.key = engine.key(session_id)
        self.signal = signal
        self.watchdog_due_at_ms = watchdog_due_at_ms
        self.holder = signal.holder if signal is not None else str(uuid.uuid4())
        self.active: dict[int, Lease] = {}
        self.excluded: set[int] = set()
        self.processed = 0
        self.saw_failure = False
        self.claim_again = False
        # The last claim hit its limit: more may be claimable once slots free.
        self.limited = False
        # The last claim left events waiting on a full concurrency key.
        self.flow_waiting = False
        # The last finished completion said nothing else is left to claim.
        self.drained = False
        self._dirty = False
        self._changed = trio.Event()
        self._stop_renewing = False
        self._nursery: trio.Nursery | None = None
        self._runner: AttemptRunner | None = None

    def poke(self) -> None:
        """Something changed: the loop looks again (:class:`~.mailbox.Listener`)."""
        self._dirty = True
        self._changed.set()

    async def _wait_changed(self) -> None:
        if not self._dirty:
            self._changed = trio.Event()
            await self._changed.wait()
        self._dirty = False

    def _request_watchdog(self, due_at_ms: int) -> None:
        # Stay on the grid of the watchdog that started us, if one did.
        self.watchdogs.arm(self.session_id, due_at_ms, grid_from_ms=self.watchdog_due_at_ms)

    async def run(self) -> DrainResult:
        """The drain, in its own nursery: heartbeat, attempts, the claim loop."""
        error: BaseException | None = None
        result: DrainResult | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._runner = AttemptRunner(
                self.engine, self.handlers, self.appends, self.session_id, nursery
            )
            if self.signal is not None:
                self.signal.listen(self)
            nursery.start_soon(self._heartbeat)
            try:
                result = await self._loop()
            except BaseException as exc:
                # Raised as itself below, not wrapped in an ExceptionGroup by
                # the nursery: the helpers are cancelled, not failed, by it.
                error = exc
            finally:
                if self.signal is not None:
                    self.signal.close()
                self._stop_renewing = True
                nursery.cancel_scope.cancel(reason="drain finished")
        if error is not None:
            raise error
        assert result is not None
        return result

    def take_adopted(self) -> bool:
        """Start the events an append claimed for this drain; True if any
        (:class:`~.mailbox.Listener`)."""
        adopted = self.signal.take() if self.signal is not None else []
        for claim in adopted:
            self._request_watchdog(claim.watchdog_at_ms)
            for event in claim.events:
                self._start(event, claim.holder, claim.expires_at)
        return bool(adopted)

    def _version(self) -> int:
        return self.signal.version if self.signal is not None else 0

    def _awaiting_append(self) -> bool:
        return self.signal is not None and self.signal.appending

    async def _loop(self) -> DrainResult:
        assert self._runner is not None
        # A drain started for an append's own claim has nothing more to claim
        # unless it was also woken (the signal's version moved) meanwhile.
        need_claim = not self.take_adopted() or self._version() != 0
        version = 0
        while True:
            if need_claim:
                need_claim = False
                version = self._version()
                room = await self.slots.take_free()
                window = self.watchdogs.window()
                try:
                    call = self.store.claim_available(
                        self.key,
                        holder=self.holder,
                        ttl_ms=window.ttl_ms,
                        # An attempt storing its outcome is not to be claimed
                        # again: a failure's retry waits for the sweep.
                        exclude=sorted(self.excluded | self._runner.finishing),
                        limit=room,
                    )
                    metrics = self.engine.metrics
                    claim = await (call if metrics is None else measured(metrics, "claim", call))
                except Exception:
                    self.slots.give_back(room)
                    # Let running handlers finish (or lapse) before reporting.
                    while self.active:
                        await self._wait_changed()
                    raise
                except BaseException:
                    self.slots.give_back(room)
                    raise
                claimed = claim.events if isinstance(claim, Claimed) else []
                # Each claimed event keeps its slot until its attempt ends.
                self.slots.give_back(room - len(claimed))
                self.limited = len(claimed) >= room
                waiting = claim.waiting if isinstance(claim, Claimed | Busy) else []
                self.flow_waiting = bool(waiting)
                if waiting:
                    # Woken when an attempt of the key ends here (the sweep,
                    # or the Busy answer's watchdog, when one ends elsewhere).
                    self.engine.waiters.wait(self.session_id, waiting)
                if claimed:
                    self._request_watchdog(window.watchdog_at_ms)
                    for event in claimed:
                        self._start(event, self.holder, window.expires_at)
                # Claims handed over meanwhile (they may be why this one came
                # back Busy: they are ours to run).
                self.take_adopted()
                if self._version() != version:
                    need_claim = True
                    continue
                if not self.active and not self._awaiting_append():
                    if isinstance(claim, Busy):
                        self._request_watchdog(self.watchdogs.due_after(claim.retry_at_ms))
                        if claim.throttled:
                            # A throttle's window has room again at exactly this instant.
                            self.watchdogs.wake(self.session_id, claim.retry_at_ms)
                        return DrainResult(False, "busy", self.processed, claim.retry_at_ms)
                    return self._finished()
            elif not self.active and not self._awaiting_append():
                # Everything ran and nothing woke us: confirm with a claim,
                # unless the last completion said nothing is left.
                if self.drained:
                    return self._finished()
                need_claim = True
                continue
            await self._wait_changed()
            # Before deciding anything: the loop must not end with a
            # handed-over claim still waiting to start.
            self.take_adopted()
            if self.claim_again or self._version() != version:
                self.claim_again = False
                need_claim = True

    def _finished(self) -> DrainResult:
        if self.saw_failure:
            return DrainResult(False, "stalled", self.processed)
        return DrainResult(True, "settled", self.processed)

    def _start(self, event: StoredEvent, holder: str, expires_at: float) -> None:
        previous = self.active.get(event.index)
        if previous is not None:
            # Our own re-claim advanced the attempt: durable proof the old one lost.
            previous.fence("superseded by this drain's re-claim")
        lease = Lease(event.index, event.attempt_count, holder, expires_at)
        self.active[event.index] = lease
        self.drained = False
        assert self._nursery is not None
        self._nursery.start_soon(self._run_event, event, lease)

    async def _run_event(self, event: StoredEvent, lease: Lease) -> None:
        assert self._runner is not None
        try:
            outcome = await self._runner.run(event, lease)
        finally:
            self.slots.give_back(1)
            if event.concurrency_key is not None:
                self.engine.waiters.freed(event.concurrency_key)
        if self.active.get(event.index) is lease:
            del self.active[event.index]
        self.drained = outcome.drained and not lease.fenced
        if not lease.fenced:
            if outcome.status == "processed":
                self.processed += 1
            elif outcome.status in ("failed", "dead_lettered"):
                self.excluded.add(event.index)
                self.saw_failure = True
            self.claim_again = (
                self.claim_again
                or outcome.opens_lane
                or outcome.appended
                or self.limited
                or self.flow_waiting
            )
        self.poke()

    async def _heartbeat(self) -> None:
        while True:
            await trio.sleep(self.timings.heartbeat_s)
            await self._renew()

    async def _renew(self) -> None:
        # Usually one holder; an append's claim handed over late may bring another.
        holders = {e.holder for e in self.active.values() if not e.scope.cancel_called}
        for holder in sorted(holders):
            await self._renew_holder(holder)

    async def _renew_holder(self, holder: str) -> None:
        while not self._stop_renewing:
            leases = [
                e for e in self.active.values() if not e.scope.cancel_called and e.holder == holder
            ]
            if not leases:
                return
            window = self.watchdogs.window()
            self._request_watchdog(window.watchdog_at_ms)
            try:
                call = self.store.renew_claims(
                    self.key,
                    holder=holder,
                    claims=[ClaimRef(e.index, e.attempt) for e in leases],
                    ttl_ms=window.ttl_ms,
                )
                metrics = self.engine.metrics
                result = await (call if metrics is None else measured(metrics, "renew", call))
            except Exception:
                # A missed beat spends lease slack: retry soon, jittered, while a
                # lease can still be saved. The lease deadlines end this naturally.
                now = trio.current_time()
                if not any(e.expires_at > now for e in self.active.values()):
                    return
                await trio.sleep(self.timings.renew_retry_s * (0.5 + random.random() * 0.5))
                continue
            for index in result.renewed:
                lease = self.active.get(index)
                if lease is not None and not lease.scope.cancel_called:
                    lease.expires_at = window.expires_at
                    lease.scope.deadline = window.expires_at
            for index in result.superseded:
                lease = self.active.pop(index, None)
                if lease is not None:
                    # Release the slot now; the cancelled task ends on its own.
                    lease.fence("superseded: a newer attempt owns this event")
                    self.poke()
            return


async def drain_session(
    engine: Engine,
    handlers: Mapping[str, HandlerSpec],
    appends: Appends,
    slots: HandlerSlots,
    session_id: str,
    *,
    signal: DrainSignal | None = None,
    watchdog_due_at_ms: int | None = None,
) -> DrainResult:
    """Run one drain of ``session_id`` to the end (see the module docstring).

    ``appends`` is the write path the handlers' sessions append through;
    ``slots`` bounds the handlers running at once across the server's drains;
    ``signal`` is the drain's mailbox when it runs in the background, and
    ``watchdog_due_at_ms`` the due time of the watchdog that started it.

    Cancellation: cancelling cancels the handlers; their claims lapse and a
    later drain retries them.
    """
    attributes = {"a2.contract": engine.contract.name, "a2.session_id": session_id}
    with engine.telemetry.span("a2.drain", attributes) as span:
        drain = _Drain(engine, handlers, appends, slots, session_id, signal, watchdog_due_at_ms)
        result = await drain.run()
        span.set_attribute("a2.drain.processed", result.processed)
        span.set_attribute("a2.drain.outcome", result.outcome)
        return result
