"""The drain engine: claim, run under leases, complete or fail.

Theory of operation
-------------------

A *drain* processes one session until nothing is claimable. It owns a nursery
holding one heartbeat task, the abort hub (while some running handler has
``abort_on``) and one task per claimed event. Nothing it starts outlives it.

Claims. A drain claims every eligible event at once under a random holder id
and a ttl. The store advances each event's durable ``attempt`` and stamps the
claim's expiry on its own clock. Before asking, the drain notes Trio time: the
*local lease estimate* is that instant + ttl, never later than the store's
stamp, so a drain can conclude "my claim may be gone" with zero I/O, even
while the store is unreachable.

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

Outcomes are decided from the scopes after the ``with`` blocks, never from a
bare ``except Cancelled``. A handler that returns normally is completed even
if its lease was cancelled while it returned: the store's attempt fence
decides (a zombie's completion comes back ``superseded`` and counts for
nothing). Any exception is a failure, recorded by ``fail_attempt``; after
``max_failures`` the event is dead-lettered and its lane stays blocked.

A store failure while completing or failing leaves the claim to lapse: the
event is retried, and the store's idempotency makes the retry safe.
"""

from __future__ import annotations

import logging
import math
import random
import traceback
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
import trio

from ..stores.base import Busy, Claimed, ClaimRef, StoredEvent
from ..telemetry import NOOP_TELEMETRY, Span
from .abort import AbortHub, AbortSubscription
from .context import Appends, Engine
from .handlers import HandlerContext, HandlerSpec
from .session import HandlerSession

#: Handler failures (WARNING, with the traceback), dead letters (ERROR), lapsed
#: and superseded leases (WARNING); each record carries ``a2_contract``,
#: ``a2_session``, ``a2_event_type``, ``a2_index``, ``a2_attempt``, ``a2_holder``.
logger = logging.getLogger("a2trio.drain")
#: One INFO record per attempt: ``ran ordered #3 of session 'o-42' (attempt 1)
#: in 2.1 ms: processed``, with the fields above and ``a2_outcome``,
#: ``a2_duration_ms`` (the handler's own time). ``serve`` shows them; a library
#: user sees them only with INFO logging on (silence this logger alone to keep
#: the rest).
runs_logger = logging.getLogger("a2trio.runs")

__all__ = [
    "MAX_ERROR_CHARS",
    "DrainOutcome",
    "DrainResult",
    "DrainSignal",
    "HandlerSlots",
    "drain_session",
    "stored_error",
]

DrainOutcome = Literal["settled", "busy", "stalled"]
EventStatus = Literal["processed", "failed", "dead_lettered", "superseded", "surrendered"]


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


class DrainSignal:
    """The mailbox of one background drain: the write path wakes it instead of
    starting a second one, and hands it events claimed elsewhere (an append's
    own claim). Only its methods change it.

    ``holder`` is the drain's claim holder, known before the drain starts so an
    append can claim for it; appends that do are bracketed by
    :meth:`begin_append` and :meth:`appended` (the drain waits for their answer
    rather than end or claim against them).
    """

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder or str(uuid.uuid4())
        self._version = 0
        self._closed = False
        self._adopted: list[_Adopted] = []
        self._appending = 0
        self._listener: _Drain | None = None

    @property
    def closed(self) -> bool:
        """The drain has finished: wake or hand work to a new one."""
        return self._closed

    @property
    def version(self) -> int:
        """How often the drain was woken: it claims again when this moved."""
        return self._version

    @property
    def appending(self) -> bool:
        """Appends that claim for this drain are in flight."""
        return self._appending > 0

    def listen(self, drain: _Drain) -> None:
        """Tell ``drain`` (the running one) of wake-ups and handed-over claims."""
        self._listener = drain

    def take(self) -> list[_Adopted]:
        """The claims handed over since the last call."""
        adopted, self._adopted = self._adopted, []
        return adopted

    def close(self) -> None:
        """Mark the drain finished (idempotent)."""
        self._closed = True
        self._listener = None

    def begin_append(self) -> None:
        """An append is claiming for this drain: its answer is coming."""
        self._appending += 1

    def appended(self) -> None:
        """An append that claimed for this drain has its answer (or failed)."""
        self._appending -= 1
        if self._listener is not None:
            self._listener.poke()

    def notify(self) -> None:
        """Something may be claimable: claim again before ending."""
        self._version += 1
        if self._listener is not None:
            self._listener.poke()

    def adopt(
        self, holder: str, events: list[StoredEvent], expires_at: float, watchdog_at_ms: int
    ) -> None:
        """Run ``events``, already claimed by ``holder``, as if this drain had
        claimed them (no further claim is needed for them)."""
        self._adopted.append(_Adopted(holder, events, expires_at, watchdog_at_ms))
        if self._listener is not None:
            # Started from here, not from the drain's loop: one scheduler pass
            # sooner to the handler.
            self._listener.take_adopted()


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
        """Take every free slot, waiting for one if none is; how many."""
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


class _Adopted(msgspec.Struct, frozen=True):
    holder: str
    events: list[StoredEvent]
    expires_at: float
    watchdog_at_ms: int


class _Entry:
    __slots__ = ("attempt", "ended_at", "expires_at", "fenced", "holder", "index", "lease")

    def __init__(self, index: int, attempt: int, holder: str, expires_at: float) -> None:
        self.index = index
        self.attempt = attempt
        self.holder = holder
        self.expires_at = expires_at
        self.lease = trio.CancelScope(deadline=expires_at)
        self.fenced = False
        # When the handler ended (Trio time), for the run's log line.
        self.ended_at: float | None = None

    def fence(self, reason: str) -> None:
        self.fenced = True
        self.lease.cancel(reason=reason)


class _Window(msgspec.Struct, frozen=True):
    ttl_ms: int
    expires_at: float
    watchdog_at_ms: int


class _Attempt(msgspec.Struct, frozen=True):
    """How one attempt ended, and what it tells the drain's loop."""

    status: EventStatus
    #: A completed laned event: the lane's next event became claimable.
    opens_lane: bool = False
    #: The completion committed returned events (they may need handling).
    appended: bool = False
    #: The store said nothing else is claimable in the session.
    drained: bool = False
    #: Completed after an ``abort_on`` match.
    aborted: bool = False


_SURRENDERED = _Attempt("surrendered")
_SUPERSEDED = _Attempt("superseded")


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
        self.session_id = session_id
        self.key = engine.key(session_id)
        self.signal = signal
        self.watchdog_due_at_ms = watchdog_due_at_ms
        self.holder = signal.holder if signal is not None else str(uuid.uuid4())
        self.active: dict[int, _Entry] = {}
        self.excluded: set[int] = set()
        # Indexes whose handler has ended and whose outcome is being stored.
        self.finishing: set[int] = set()
        self.processed = 0
        self.saw_failure = False
        self.claim_again = False
        # The last claim hit its limit: more may be claimable once slots free.
        self.limited = False
        # The last finished completion said nothing else is left to claim.
        self.drained = False
        self._dirty = False
        self._changed = trio.Event()
        self._stop_renewing = False
        self._hub: AbortHub | None = None
        self._nursery: trio.Nursery | None = None

    def poke(self) -> None:
        self._dirty = True
        self._changed.set()

    async def _wait_changed(self) -> None:
        if not self._dirty:
            self._changed = trio.Event()
            await self._changed.wait()
        self._dirty = False

    def _window(self) -> _Window:
        ttl_s = self.timings.claim_ttl_s
        expires_ms = self.engine.clock.now_ms() + int(ttl_s * 1000)
        return _Window(
            ttl_ms=int(ttl_s * 1000),
            expires_at=trio.current_time() + ttl_s,
            watchdog_at_ms=expires_ms + int(self.timings.watchdog_grace_s * 1000),
        )

    def _request_watchdog(self, due_at_ms: int) -> None:
        if self.engine.scheduler is None:
            return
        if self.watchdog_due_at_ms is not None:
            # Stay on the grid of the watchdog that started us, so heartbeats
            # re-arm the same slots instead of a new one per beat.
            beat_ms = int(self.timings.heartbeat_s * 1000)
            beats = max(0, math.ceil((due_at_ms - self.watchdog_due_at_ms) / beat_ms))
            due_at_ms = self.watchdog_due_at_ms + beats * beat_ms
        self.engine.arm_watchdog(self.session_id, due_at_ms)

    async def run(self) -> DrainResult:
        error: BaseException | None = None
        result: DrainResult | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
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
        """Start the events an append claimed for this drain; True if any."""
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
        # A drain started for an append's own claim has nothing more to claim
        # unless it was also woken (the signal's version moved) meanwhile.
        need_claim = not self.take_adopted() or self._version() != 0
        version = 0
        while True:
            if need_claim:
                need_claim = False
                version = self._version()
                room = await self.slots.take_free()
                window = self._window()
                try:
                    claim = await self.store.claim_available(
                        self.key,
                        holder=self.holder,
                        ttl_ms=window.ttl_ms,
                        # An attempt storing its outcome is not to be claimed
                        # again: a failure's retry waits for the sweep.
                        exclude=sorted(self.excluded | self.finishing),
                        limit=room,
                    )
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
                        grace_ms = int(self.timings.watchdog_grace_s * 1000)
                        self._request_watchdog(claim.retry_at_ms + grace_ms)
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
        entry = _Entry(event.index, event.attempt_count, holder, expires_at)
        self.active[event.index] = entry
        self.drained = False
        assert self._nursery is not None
        self._nursery.start_soon(self._run_event, event, entry)

    async def _run_event(self, event: StoredEvent, entry: _Entry) -> None:
        started = trio.current_time()
        try:
            attempt = await self._attempt(event, entry)
        finally:
            self.slots.give_back(1)
            self.finishing.discard(entry.index)
        if runs_logger.isEnabledFor(logging.INFO):
            ended = entry.ended_at if entry.ended_at is not None else trio.current_time()
            outcome = "aborted" if attempt.aborted else attempt.status
            took_ms = (ended - started) * 1000
            self._log(
                logging.INFO,
                event,
                entry,
                "ran %s in %.1f ms: %s",
                took_ms,
                outcome.replace("_", "-"),
                to=runs_logger,
                a2_outcome=outcome,
                a2_duration_ms=round(took_ms, 3),
            )
        if self.active.get(event.index) is entry:
            del self.active[event.index]
        self.drained = attempt.drained and not entry.fenced
        if not entry.fenced:
            if attempt.status == "processed":
                self.processed += 1
            elif attempt.status in ("failed", "dead_lettered"):
                self.excluded.add(event.index)
                self.saw_failure = True
            self.claim_again = (
                self.claim_again or attempt.opens_lane or attempt.appended or self.limited
            )
        self.poke()

    def _ended(self, entry: _Entry) -> None:
        """The handler has ended and its outcome is about to be stored: this
        drain's claims leave the event alone meanwhile (once a failure is
        stored the event is claimable again, and a drain's claim ignores the
        retry backoff: woken then, it ran the failed event again at once)."""
        entry.ended_at = trio.current_time()
        self.finishing.add(entry.index)

    async def _attempt(self, event: StoredEvent, entry: _Entry) -> _Attempt:
        engine = self.engine
        registration = self.handlers.get(event.type)
        # The default telemetry records nothing: skip building its attributes
        # (a dict per event showed in the drain's profile).
        attributes: dict[str, str | int | bool] = {}
        if engine.telemetry is not NOOP_TELEMETRY:
            attributes = {
                "a2.contract": engine.contract.name,
                "a2.session_id": self.session_id,
                "a2.event.type": event.type,
                "a2.event.index": event.index,
                "a2.event.id": event.id,
                "a2.event.attempt": event.attempt_count,
                "a2.event.handled": registration is not None,
            }
            if event.lane is not None:
                attributes["a2.event.lane"] = event.lane
        with engine.telemetry.span("a2.event", attributes, parent=event.trace_context) as span:
            # Only handlers with ``abort_on`` get an abort scope and an
            # ``aborted`` event: each per event showed in the drain's profile.
            aborted: trio.Event | None = None
            abort_scope: trio.CancelScope | None = None
            subscription: AbortSubscription | None = None
            result: Any = None
            try:
                if registration is not None and registration.abort_on is not None:
                    aborted = trio.Event()
                    abort_scope = trio.CancelScope()
                    subscription = self._abort_hub().subscribe(
                        event, registration.abort_on, event.attempt_count, abort_scope, aborted
                    )
                with entry.lease:
                    if subscription is not None:
                        await subscription.catch_up()
                    if registration is not None:
                        result = await self._call(registration, event, aborted, abort_scope)
                if subscription is not None and subscription.error is not None:
                    raise subscription.error
                aborted_caught = abort_scope is not None and abort_scope.cancelled_caught
                if entry.fenced:
                    span.set_attribute("a2.event.outcome", "superseded")
                    self._log(
                        logging.WARNING,
                        event,
                        entry,
                        "%s was superseded: a newer attempt owns the event",
                    )
                    return _SUPERSEDED
                if entry.lease.cancelled_caught or (aborted_caught and entry.lease.cancel_called):
                    span.set_attribute("a2.event.outcome", "surrendered")
                    self._log(
                        logging.WARNING,
                        event,
                        entry,
                        "%s surrendered: its lease lapsed (renewals failed); "
                        "it is retried once the claim expires",
                    )
                    return _SURRENDERED
                was_aborted = aborted is not None and aborted.is_set()
                returned = [] if aborted_caught else engine.returned(event, result)
            except Exception as exc:
                span.record_error(exc)
                self._ended(entry)
                return _Attempt(await self._fail(event, entry, exc, span))
            finally:
                if subscription is not None:
                    subscription.close()
            self._ended(entry)
            try:
                completion = await self.store.complete_attempt(
                    self.key, index=event.index, attempt=event.attempt_count, events=returned
                )
            except Exception as exc:
                span.record_error(exc)
                span.set_attribute("a2.event.outcome", "surrendered")
                self._log(
                    logging.WARNING,
                    event,
                    entry,
                    "%s ran but its completion could not be stored (%s); it is retried "
                    "once the claim expires",
                    exc,
                )
                return _SURRENDERED
            if completion.outcome == "superseded":
                span.set_attribute("a2.event.outcome", "superseded")
                self._log(
                    logging.WARNING,
                    event,
                    entry,
                    "%s ran but was superseded: its completion was refused",
                )
                return _SUPERSEDED
            span.set_attribute("a2.event.outcome", "processed")
            if was_aborted:
                span.set_attribute("a2.event.aborted", True)
            return _Attempt(
                "processed",
                opens_lane=event.lane is not None,
                appended=bool(completion.events),
                drained=completion.drained,
                aborted=was_aborted,
            )

    async def _call(
        self,
        registration: HandlerSpec,
        event: StoredEvent,
        aborted: trio.Event | None,
        abort_scope: trio.CancelScope | None,
    ) -> Any:
        """Run the handler. Its context lives in this frame only, so it is gone
        before the completion's round trip: under load thousands of events wait
        there, and what they still hold is what the garbage collector scans."""
        session = HandlerSession(self.engine, self.appends, self.session_id, event)
        ctx = HandlerContext(self.engine.to_public(event), event.attempt_count, session, aborted)
        if abort_scope is None:
            return await registration.fn(ctx)
        with abort_scope:
            return await registration.fn(ctx)

    def _log(
        self,
        level: int,
        event: StoredEvent,
        entry: _Entry,
        message: str,
        *args: object,
        error: BaseException | None = None,
        to: logging.Logger = logger,
        **fields: object,
    ) -> None:
        """One record about an attempt on ``to``: ``message``'s ``%s`` names
        it; ``fields`` are more ``a2_*`` fields."""
        if not to.isEnabledFor(level):
            return
        name = (
            f"{event.type} #{event.index} of session {self.session_id!r} (attempt {entry.attempt})"
        )
        extra = {
            "a2_contract": self.engine.contract.name,
            "a2_session": self.session_id,
            "a2_event_type": event.type,
            "a2_index": event.index,
            "a2_attempt": entry.attempt,
            "a2_holder": entry.holder,
            **fields,
        }
        to.log(level, message, name, *args, exc_info=error, extra=extra)

    async def _fail(
        self, event: StoredEvent, entry: _Entry, error: BaseException, span: Span
    ) -> EventStatus:
        try:
            failure = await self.store.fail_attempt(
                self.key,
                index=event.index,
                attempt=event.attempt_count,
                error=stored_error(error),
                max_failures=self.timings.max_failures,
            )
        except Exception as exc:
            span.record_error(exc)
            span.set_attribute("a2.event.outcome", "surrendered")
            self._log(
                logging.WARNING,
                event,
                entry,
                "%s failed and the failure could not be stored (%s); it is retried "
                "once the claim expires",
                exc,
                error=error,
            )
            return "surrendered"
        span.set_attribute("a2.event.outcome", failure.outcome)
        if failure.outcome == "dead_lettered":
            self._log(
                logging.ERROR,
                event,
                entry,
                "%s failed %d time%s: dead-lettered, and its lane is blocked behind it",
                failure.failure_count,
                "" if failure.failure_count == 1 else "s",
                error=error,
            )
        elif failure.outcome == "failed":
            self._log(
                logging.WARNING,
                event,
                entry,
                "%s failed (%d of %d): it is retried",
                failure.failure_count,
                self.timings.max_failures,
                error=error,
            )
        return failure.outcome

    def _abort_hub(self) -> AbortHub:
        if self._hub is None:
            assert self._nursery is not None
            self._hub = AbortHub(self.store, self.key, self._nursery, self.engine.to_public)
        return self._hub

    async def _heartbeat(self) -> None:
        while True:
            await trio.sleep(self.timings.heartbeat_s)
            await self._renew()

    async def _renew(self) -> None:
        # Usually one holder; an append's claim handed over late may bring another.
        holders = {e.holder for e in self.active.values() if not e.lease.cancel_called}
        for holder in sorted(holders):
            await self._renew_holder(holder)

    async def _renew_holder(self, holder: str) -> None:
        while not self._stop_renewing:
            entries = [
                e for e in self.active.values() if not e.lease.cancel_called and e.holder == holder
            ]
            if not entries:
                return
            window = self._window()
            self._request_watchdog(window.watchdog_at_ms)
            try:
                result = await self.store.renew_claims(
                    self.key,
                    holder=holder,
                    claims=[ClaimRef(e.index, e.attempt) for e in entries],
                    ttl_ms=window.ttl_ms,
                )
            except Exception:
                # A missed beat spends lease slack: retry soon, jittered, while a
                # lease can still be saved. The lease deadlines end this naturally.
                now = trio.current_time()
                if not any(e.expires_at > now for e in self.active.values()):
                    return
                await trio.sleep(self.timings.renew_retry_s * (0.5 + random.random() * 0.5))
                continue
            for index in result.renewed:
                entry = self.active.get(index)
                if entry is not None and not entry.lease.cancel_called:
                    entry.expires_at = window.expires_at
                    entry.lease.deadline = window.expires_at
            for index in result.superseded:
                entry = self.active.pop(index, None)
                if entry is not None:
                    # Release the slot now; the cancelled task ends on its own.
                    entry.fence("superseded: a newer attempt owns this event")
                    self.poke()
            return


#: The most characters of a traceback a failure stores (``last_error``). The
#: tail is kept: it holds the exception and the frames nearest to it; a deep
#: recursion's traceback would otherwise be megabytes per attempt.
MAX_ERROR_CHARS = 8_192


def stored_error(error: BaseException) -> str:
    """The traceback of ``error`` as stored: its last :data:`MAX_ERROR_CHARS`
    characters, marked when cut."""
    text = "".join(traceback.format_exception(error))
    if len(text) <= MAX_ERROR_CHARS:
        return text
    cut = len(text) - MAX_ERROR_CHARS
    return f"[{cut} characters cut]\n" + text[cut:]


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
    ``slots`` bounds the handlers running at once across the server's drains.
    """
    attributes = {"a2.contract": engine.contract.name, "a2.session_id": session_id}
    with engine.telemetry.span("a2.drain", attributes) as span:
        drain = _Drain(engine, handlers, appends, slots, session_id, signal, watchdog_due_at_ms)
        result = await drain.run()
        span.set_attribute("a2.drain.processed", result.processed)
        span.set_attribute("a2.drain.outcome", result.outcome)
        return result
