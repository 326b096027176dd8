"""One attempt's outcome: a pure function of its scopes and the store's answer.

Theory of operation
-------------------

A drain (``drain.py``) claims events and runs one attempt per claimed event
(``runs.py``), with the event's :class:`Lease`. The handler runs inside the
lease scope and, when it has ``abort_on``, inside an abort scope (both
described in ``drain.py``); innermost, when it has a ``timeout``, inside a
*timeout scope* whose deadline is the handler's start + ``timeout``.
Whatever happens, the attempt ends in one of five statuses
(:data:`EventStatus`): processed, failed, dead-lettered, superseded or
surrendered.

Outcomes are decided from the scopes after the ``with`` blocks, never from a
bare ``except Cancelled``, in two pure steps tested without a store
(``tests/test_attempt.py``): :func:`decide` reads the scopes (a
:class:`Scopes` record) and says what to ask the store, and :func:`completed`
and :func:`failed` read the store's answer. The rules:

* Any exception is a failure, recorded by ``fail_attempt``, whatever the
  scopes say; after ``max_failures`` (the handler's ``Retry.max_attempts``,
  else ``Timings.max_failures``) the event is dead-lettered and its lane
  stays blocked. An exception of a ``non_retryable`` type dead-letters on
  this failure.
* A fenced attempt (a renewal reported a newer attempt, or this drain
  re-claimed the index) is superseded: nothing is stored.
* A lease whose cancellation ended the handler is surrendered: no completion
  and no failure spent; the claim expires in the store and a later drain
  retries with attempt + 1. Trio delivers one ``Cancelled`` to the outermost
  cancelled scope, so when the lease lapses as an abort lands the lease
  scope catches it. An abort scope that caught its ``Cancelled`` with the
  lease cancelled by the time the scopes are read surrenders too: the lease
  is gone all the same.
* Otherwise the attempt completes. Trio tells a cancellation requested
  (``cancel_called``) from one that landed (``cancelled_caught``); we act on
  the one that landed. A handler that returns normally is completed even if
  its lease was cancelled while it returned: the store's attempt fence
  decides (a zombie's completion comes back ``superseded`` and counts for
  nothing). An abort that landed completes with no returned events; a
  handler that returned after its abort was requested but before it landed
  (it shielded itself and watched ``ctx.aborted``, or it was returning
  anyway) completes with the events it returned. Either way the attempt
  counts as aborted (the span's ``a2.event.aborted``, the run's log line).
* A timeout that ended the handler (``timeout_cancelled_caught``) is a
  failure, *timed out*: ``fail_attempt`` records a :class:`TimeoutError`
  naming the timeout, and ``retry=`` decides as for any failure. Being the
  innermost scope, the timeout scope catches its ``Cancelled`` only when
  neither the abort nor the lease was cancelled by then: an abort landing
  with the timeout is an abort, a fenced attempt is superseded, and a lease
  cancelled by the time the scopes are read surrenders (as for an abort). A
  handler that returned past its timeout (it shielded itself) completes. A
  server shutdown cancels outside every scope, so none catches it: the
  ``Cancelled`` leaves the attempt, nothing is stored, and the claim lapses.

A store failure while completing or failing leaves the claim to lapse
(surrendered): the event is retried, and the store's idempotency makes the
retry safe.
"""

from __future__ import annotations

import traceback
from typing import Literal

import msgspec
import trio

from ..stores.base import CompleteResult, FailResult

__all__ = [
    "MAX_ERROR_CHARS",
    "SUPERSEDED",
    "SURRENDERED",
    "Decision",
    "EventStatus",
    "Lease",
    "Outcome",
    "Scopes",
    "completed",
    "decide",
    "failed",
    "stored_error",
    "timed_out",
]

EventStatus = Literal[
    "processed", "failed", "dead_lettered", "superseded", "surrendered", "suspended"
]


class Lease:
    """One claimed event's lease as its drain knows it.

    Attributes:
      index, attempt, holder: the claim (the event, its durable attempt, the
        claim's holder).
      expires_at: the local lease estimate (Trio time), moved by renewals.
      scope: the lease scope; its deadline is ``expires_at``.
      fenced: a newer attempt owns the event (:meth:`fence`).
      ended_at: when the handler ended (Trio time), for the run's log line.
    """

    __slots__ = ("attempt", "ended_at", "expires_at", "fenced", "holder", "index", "scope")

    def __init__(self, index: int, attempt: int, holder: str, expires_at: float) -> None:
        self.index = index
        self.attempt = attempt
        self.holder = holder
        self.expires_at = expires_at
        self.scope = trio.CancelScope(deadline=expires_at)
        self.fenced = False
        self.ended_at: float | None = None

    def fence(self, reason: str) -> None:
        """Cancel the handler because a newer attempt owns the event."""
        self.fenced = True
        self.scope.cancel(reason=reason)


class Scopes(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt's scopes say once the handler's ``with`` blocks exited.

    Attributes:
      raised: the handler raised an exception (so did the abort hub, or the
        catch-up read); a ``Cancelled`` is no exception.
      fenced: the lease was fenced (a newer attempt owns the event).
      lease_cancel_called / lease_cancelled_caught: the lease scope was
        cancelled (its deadline passed, or it was fenced) / and that
        cancellation ended the handler.
      abort_cancel_called / abort_cancelled_caught: the same for the abort
        scope (an ``abort_on`` match, or the abort hub failed).
      timeout_cancelled_caught: the handler's ``timeout`` passed and its
        cancellation ended the handler.
    """

    raised: bool = False
    fenced: bool = False
    lease_cancel_called: bool = False
    lease_cancelled_caught: bool = False
    abort_cancel_called: bool = False
    abort_cancelled_caught: bool = False
    timeout_cancelled_caught: bool = False


#: What to ask the store once the handler has ended: ``fail`` (it raised) or
#: ``timed_out`` (a failure too, with a :class:`TimeoutError`); nothing
#: (``superseded``, ``surrendered``); ``complete`` with the returned events,
#: or ``complete_empty`` with none (an abort landed).
Decision = Literal["fail", "timed_out", "superseded", "surrendered", "complete", "complete_empty"]


def decide(scopes: Scopes) -> Decision:
    """What to ask the store about an attempt whose handler has ended (the
    rules are the module docstring's)."""
    if scopes.raised:
        return "fail"
    if scopes.fenced:
        return "superseded"
    if scopes.lease_cancelled_caught or (
        (scopes.abort_cancelled_caught or scopes.timeout_cancelled_caught)
        and scopes.lease_cancel_called
    ):
        return "surrendered"
    if scopes.abort_cancelled_caught:
        return "complete_empty"
    if scopes.timeout_cancelled_caught:
        return "timed_out"
    return "complete"


class Outcome(msgspec.Struct, frozen=True):
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
    #: Failed because the handler ran past its ``timeout``.
    timed_out: bool = False


SURRENDERED = Outcome("surrendered")
#: A durable sleep released the claim until its wake instant (``durable.release``).
SUSPENDED = Outcome("suspended")
SUPERSEDED = Outcome("superseded")


def completed(answer: CompleteResult | None, *, laned: bool, aborted: bool) -> Outcome:
    """The outcome of a completion: ``answer`` is the store's, None when the
    store failed (the claim lapses: surrendered). ``laned``: the event is in
    a lane; ``aborted``: an abort was requested (``abort_cancel_called``)."""
    if answer is None:
        return SURRENDERED
    if answer.outcome == "superseded":
        return SUPERSEDED
    return Outcome(
        "processed",
        opens_lane=laned,
        appended=bool(answer.events),
        drained=answer.drained,
        aborted=aborted,
    )


def failed(answer: FailResult | None, *, timed_out: bool = False) -> Outcome:
    """The outcome of a recorded failure: ``answer`` is the store's, None when
    the store failed (the claim lapses: surrendered). ``timed_out``: the
    failure was the handler's timeout (kept on a recorded failure only)."""
    if answer is None:
        return SURRENDERED
    return Outcome(answer.outcome, timed_out=timed_out and answer.outcome != "superseded")


#: The most characters of a traceback a failure stores (``last_error``). The
#: tail is kept: it holds the exception and the frames nearest to it; a deep
#: recursion's traceback would otherwise be megabytes per attempt.
MAX_ERROR_CHARS = 8_192


def timed_out(name: str, timeout: float) -> TimeoutError:
    """The error a timed-out attempt fails with (its message is the stored
    ``last_error``): ``handler 'ship' timed out after 2.0 s``."""
    return TimeoutError(f"handler {name!r} timed out after {timeout} s")


def stored_error(error: BaseException) -> str:
    """The traceback of ``error`` as stored: its last :data:`MAX_ERROR_CHARS`
    characters, marked when cut."""
    text = "".join(traceback.format_exception(error))
    if len(text) <= MAX_ERROR_CHARS:
        return text
    cut = len(text) - MAX_ERROR_CHARS
    return f"[{cut} characters cut]\n" + text[cut:]
