"""Running attempts: a claimed event's handler under its scopes, its outcome stored.

Theory of operation. A drain hands each event it claimed (or was handed) to its
:class:`AttemptRunner`, in a task of the drain's nursery. The runner opens the event's
``a2.event`` span, enters the lease scope (and, for a handler with ``abort_on``, registers an
abort subscription before the handler starts, then catches up on the log: ``abort.py``), runs
the handler with a :class:`~a2trio.HandlerContext` (inside a timeout scope, for a handler
with ``timeout``), and reads the scopes once the ``with`` blocks have exited (a durable
sleep's ``Suspend`` releases the claim: ``durable.release``). What to store, and the outcome
the store's answer implies, are pure functions of ``attempt.py``; this module calls the
store and writes the log lines on ``a2trio.drain`` and one line per attempt on
``a2trio.runs``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import trio

from ..stores.base import AppendEvent, CompleteResult, FailResult, StoredEvent
from ..telemetry import NOOP_TELEMETRY, AttemptOutcome, Span
from ..upcasting import UpcastError
from .abort import AbortHub, AbortSubscription
from .attempt import (
    SUPERSEDED,
    SURRENDERED,
    Lease,
    Outcome,
    Scopes,
    completed,
    decide,
    failed,
    stored_error,
    timed_out,
)
from .context import Appends, Engine, measured
from .durable import Suspend
from .flow import FlowKeyError, recheck
from .handlers import HandlerContext, HandlerSpec
from .inputs import returned
from .pacing import DebounceKeyError
from .session import HandlerSession
from .suspend import release

#: Handler failures (WARNING, with the traceback), dead letters (ERROR), lapsed and superseded
#: leases (WARNING); each record carries ``a2_contract``, ``a2_session``, ``a2_event_type``,
#: ``a2_index``, ``a2_attempt``, ``a2_holder``.
logger = logging.getLogger("a2trio.drain")
#: One INFO record per attempt: ``ran ordered #3 of session 'o-42' (attempt 1) in 2.1 ms:
#: processed`` (``timed out, failed`` for a timeout), with the fields above and ``a2_outcome``,
#: ``a2_duration_ms`` (the handler's own time), ``a2_timed_out``. ``serve`` shows them; a
#: library user sees them only with INFO logging on (silence this logger alone to keep the rest).
runs_logger = logging.getLogger("a2trio.runs")

__all__ = ["AttemptRunner", "outcome_label"]


def outcome_label(outcome: Outcome) -> AttemptOutcome:
    """How metrics label an attempt's outcome (:data:`~a2trio.telemetry.AttemptOutcome`)."""
    if outcome.status == "processed":
        return "aborted" if outcome.aborted else "completed"
    if outcome.status == "failed" and outcome.timed_out:
        return "timed_out"
    return outcome.status


class AttemptRunner:
    """The attempts of one drain: each claimed event's handler, run to its
    outcome, and that outcome stored.

    Args:
      appends: the write path the handlers' sessions append through.
      nursery: the drain's, where the abort hub follows the session.

    Attributes:
      finishing: indexes whose handler has ended and whose outcome is being
        stored. The drain's claims leave them alone meanwhile (once a failure
        is stored the event is claimable again, and a drain's claim ignores
        the retry backoff: woken then, it ran the failed event again at once).
    """

    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, HandlerSpec],
        appends: Appends,
        session_id: str,
        nursery: trio.Nursery,
    ) -> None:
        self.engine = engine
        self.handlers = handlers
        self.appends = appends
        self.session_id = session_id
        self.key = engine.key(session_id)
        self.finishing: set[int] = set()
        self._nursery = nursery
        self._hub: AbortHub | None = None

    async def run(self, event: StoredEvent, lease: Lease) -> Outcome:
        """Run one attempt of ``event`` under ``lease`` and store its outcome
        (see the module docstring); one INFO line on ``a2trio.runs`` says how
        it ended.

        Cancellation: cancelled (the drain ended, the server closed), nothing
        more is stored: the claim lapses and a later drain retries the event
        with attempt + 1.
        """
        started = trio.current_time()
        try:
            outcome = await self._attempt(event, lease)
        finally:
            self.finishing.discard(lease.index)
        metrics = self.engine.metrics
        if metrics is not None:
            ended = lease.ended_at if lease.ended_at is not None else trio.current_time()
            metrics.attempt_ended(
                self.engine.contract.name, event.type, outcome_label(outcome), ended - started
            )
        if runs_logger.isEnabledFor(logging.INFO):
            ended = lease.ended_at if lease.ended_at is not None else trio.current_time()
            status = "aborted" if outcome.aborted else outcome.status
            said = status.replace("_", "-")
            took_ms = (ended - started) * 1000
            self._log(
                logging.INFO,
                event,
                lease,
                "ran %s in %.1f ms: %s",
                took_ms,
                f"timed out, {said}" if outcome.timed_out else said,
                to=runs_logger,
                a2_outcome=status,
                a2_duration_ms=round(took_ms, 3),
                a2_timed_out=outcome.timed_out,
            )
        return outcome

    async def _attempt(self, event: StoredEvent, lease: Lease) -> Outcome:
        """The attempt: the handler under its scopes, the decision, the store's
        answer, each in the ``a2.event`` span."""
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
            abort_scope: trio.CancelScope | None = None
            timeout_scope: trio.CancelScope | None = None
            subscription: AbortSubscription | None = None
            result: Any = None
            error: Exception | None = None
            try:
                aborted: trio.Event | None = None
                if registration is not None and registration.abort_on is not None:
                    aborted = trio.Event()
                    abort_scope = trio.CancelScope()
                    subscription = self._abort_hub().subscribe(
                        event, registration.abort_on, event.attempt_count, abort_scope, aborted
                    )
                if registration is not None and registration.timeout is not None:
                    # Its deadline counts from the handler's start (entering it).
                    timeout_scope = trio.CancelScope(relative_deadline=registration.timeout)
                with lease.scope:
                    if subscription is not None:
                        await subscription.catch_up()
                    if registration is not None:
                        result = await self._call(
                            registration, event, aborted, abort_scope, timeout_scope
                        )
                if subscription is not None and subscription.error is not None:
                    raise subscription.error
            except Exception as exc:
                error = exc
            except Suspend as suspend:  # a durable sleep: the claim is released
                self._ended(lease)
                return await release(engine, self.key, event, suspend, span, subscription)
            finally:
                if subscription is not None:
                    subscription.close()
            scopes = Scopes(
                raised=error is not None,
                fenced=lease.fenced,
                lease_cancel_called=lease.scope.cancel_called,
                lease_cancelled_caught=lease.scope.cancelled_caught,
                abort_cancel_called=abort_scope is not None and abort_scope.cancel_called,
                abort_cancelled_caught=abort_scope is not None and abort_scope.cancelled_caught,
                timeout_cancelled_caught=(
                    timeout_scope is not None and timeout_scope.cancelled_caught
                ),
            )
            decision = decide(scopes)
            if decision == "superseded":
                span.set_attribute("a2.event.outcome", "superseded")
                self._log(
                    logging.WARNING,
                    event,
                    lease,
                    "%s was superseded: a newer attempt owns the event",
                )
                return SUPERSEDED
            if decision == "surrendered":
                span.set_attribute("a2.event.outcome", "surrendered")
                self._log(
                    logging.WARNING,
                    event,
                    lease,
                    "%s surrendered: its lease lapsed (renewals failed); "
                    "it is retried once the claim expires",
                )
                return SURRENDERED
            events: list[AppendEvent] = []
            if decision == "complete":
                try:
                    events = returned(engine, event, result)
                except Exception as exc:
                    error = exc
            elif decision == "timed_out":
                assert registration is not None
                assert registration.timeout is not None
                error = timed_out(registration.name, registration.timeout)
                span.set_attribute("a2.event.timed_out", True)
            self._ended(lease)
            if error is not None:
                span.record_error(error)
                failure = await self._fail(
                    event, lease, registration, error, span, timed_out=decision == "timed_out"
                )
                return failed(failure, timed_out=decision == "timed_out")
            answer = await self._complete(event, lease, events, span)
            outcome = completed(
                answer, laned=event.lane is not None, aborted=scopes.abort_cancel_called
            )
            if answer is not None:
                span.set_attribute("a2.event.outcome", outcome.status)
                if outcome.status == "superseded":
                    self._log(
                        logging.WARNING,
                        event,
                        lease,
                        "%s ran but was superseded: its completion was refused",
                    )
                elif outcome.aborted:
                    span.set_attribute("a2.event.aborted", True)
            return outcome

    def _ended(self, lease: Lease) -> None:
        """The handler has ended and its outcome is about to be stored."""
        lease.ended_at = trio.current_time()
        self.finishing.add(lease.index)

    async def _call(
        self,
        registration: HandlerSpec,
        event: StoredEvent,
        aborted: trio.Event | None,
        abort_scope: trio.CancelScope | None,
        timeout_scope: trio.CancelScope | None,
    ) -> Any:
        """Run the handler, the timeout scope innermost. Its context lives in
        this frame only, gone before the completion's round trip (under load
        thousands wait there, and what they hold the garbage collector scans)."""
        session = HandlerSession(self.engine, self.appends, self.session_id, event)
        ctx = HandlerContext(self.engine.to_public(event), session, aborted, self.engine, event)
        # A flow option's key or priority failed at append (or it predates
        # the option): raises the error again, or runs it unlimited.
        recheck(registration, event, ctx.event.payload)
        if abort_scope is None and timeout_scope is None:
            return await registration.fn(ctx)
        with abort_scope or contextlib.nullcontext(), timeout_scope or contextlib.nullcontext():
            return await registration.fn(ctx)

    async def _complete(
        self, event: StoredEvent, lease: Lease, events: list[AppendEvent], span: Span
    ) -> CompleteResult | None:
        """``complete_attempt``'s answer; None (logged) when the store failed."""
        try:
            call = self.engine.store.complete_attempt(
                self.key, index=event.index, attempt=event.attempt_count, events=events
            )
            metrics = self.engine.metrics
            answer = await (call if metrics is None else measured(metrics, "complete", call))
            if answer.events:
                # The returned events, appended by the completion.
                self.engine.watchdogs.wake_delayed(self.session_id, answer.events)
                if metrics is not None:
                    contract = self.engine.contract.name
                    for row in answer.events:
                        metrics.appended(contract, row.type, "handler")
            return answer
        except Exception as exc:
            span.record_error(exc)
            span.set_attribute("a2.event.outcome", "surrendered")
            self._log(
                logging.WARNING,
                event,
                lease,
                "%s ran but its completion could not be stored (%s); it is retried "
                "once the claim expires",
                exc,
            )
            return None

    async def _fail(
        self,
        event: StoredEvent,
        lease: Lease,
        registration: HandlerSpec | None,
        error: BaseException,
        span: Span,
        *,
        timed_out: bool,
    ) -> FailResult | None:
        """``fail_attempt``'s answer, logged; None when the store failed.

        The handler's ``retry=`` sets ``max_failures``; a non-retryable error
        passes 1, so the store dead-letters on this failure
        (:func:`a2trio.stores.rules.fail_verdict`). Its backoff's wait is
        stored as the retry-at, and a drain is armed for it."""
        retry = registration.retry if registration is not None else None
        max_attempts = retry.max_attempts if retry is not None else self.engine.timings.max_failures
        # An event that cannot be upcast fails the same way on every read, and
        # so does a concurrency or debounce key that failed at append.
        retryable = not isinstance(error, UpcastError | FlowKeyError | DebounceKeyError) and (
            retry is None or retry.retryable(error)
        )
        max_failures = max_attempts if retryable else 1
        verb = "timed out" if timed_out else "failed"
        retry_after_ms = None
        try:
            if retry is not None and retryable:
                retry_after_ms = retry.retry_after_ms(event.failure_count + 1)
        except ValueError as bad:  # a broken backoff function
            self._log(logging.ERROR, event, lease, "%s: %s; the seed's rule retries it", bad)
        try:
            call = self.engine.store.fail_attempt(
                self.key,
                index=event.index,
                attempt=event.attempt_count,
                error=stored_error(error),
                max_failures=max_failures,
                retry_after_ms=retry_after_ms,
            )
            metrics = self.engine.metrics
            failure = await (call if metrics is None else measured(metrics, "fail", call))
        except Exception as exc:
            span.record_error(exc)
            span.set_attribute("a2.event.outcome", "surrendered")
            self._log(
                logging.WARNING,
                event,
                lease,
                "%s failed and the failure could not be stored (%s); it is retried "
                "once the claim expires",
                exc,
                error=error,
            )
            return None
        span.set_attribute("a2.event.outcome", failure.outcome)
        if failure.retry_at_ms is not None:
            self.engine.watchdogs.wake(self.session_id, failure.retry_at_ms)
        if failure.outcome == "dead_lettered" and not retryable:
            self._log(
                logging.ERROR,
                event,
                lease,
                "%s %s with a non-retryable %s: dead-lettered, and its lane is blocked behind it",
                verb,
                type(error).__name__,
                error=error,
            )
        elif failure.outcome == "dead_lettered":
            self._log(
                logging.ERROR,
                event,
                lease,
                "%s %s %d time%s: dead-lettered, and its lane is blocked behind it",
                verb,
                failure.failure_count,
                "" if failure.failure_count == 1 else "s",
                error=error,
            )
        elif failure.outcome == "failed":
            self._log(
                logging.WARNING,
                event,
                lease,
                "%s %s (%d of %d): it is retried",
                verb,
                failure.failure_count,
                max_failures,
                error=error,
            )
        return failure

    def _log(
        self,
        level: int,
        event: StoredEvent,
        lease: Lease,
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
            f"{event.type} #{event.index} of session {self.session_id!r} (attempt {lease.attempt})"
        )
        extra = {
            "a2_contract": self.engine.contract.name,
            "a2_session": self.session_id,
            "a2_event_type": event.type,
            "a2_index": event.index,
            "a2_attempt": lease.attempt,
            "a2_holder": lease.holder,
            **fields,
        }
        to.log(level, message, name, *args, exc_info=error, extra=extra)

    def _abort_hub(self) -> AbortHub:
        if self._hub is None:
            self._hub = AbortHub(self.engine.store, self.key, self._nursery, self.engine.to_public)
        return self._hub
