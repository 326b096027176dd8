"""An attempt's outcome as pure functions (``a2trio/engine/attempt.py``): the
scopes' state and the store's answer in, the outcome out; no store, no drain.

The last tests run real Trio scopes nested as an attempt nests them, so the
state the table starts from is the state Trio leaves.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from a2trio.engine.attempt import (
    SUPERSEDED,
    SURRENDERED,
    Decision,
    Lease,
    Outcome,
    Scopes,
    completed,
    decide,
    failed,
    stored_error,
    timed_out,
)
from a2trio.stores.base import CompleteResult, FailResult, StoredEvent

#: (what the scopes say, what to ask the store), as ``attempt.py`` states the rules.
DECISIONS: list[tuple[str, Scopes, Decision]] = [
    ("returned", Scopes(), "complete"),
    ("raised", Scopes(raised=True), "fail"),
    # An exception wins over every scope: fenced, lapsed, aborted.
    (
        "raised while fenced, lapsed and aborted",
        Scopes(
            raised=True,
            fenced=True,
            lease_cancel_called=True,
            lease_cancelled_caught=True,
            abort_cancel_called=True,
            abort_cancelled_caught=True,
        ),
        "fail",
    ),
    ("fenced, returned", Scopes(fenced=True, lease_cancel_called=True), "superseded"),
    (
        "fenced, cancelled",
        Scopes(fenced=True, lease_cancel_called=True, lease_cancelled_caught=True),
        "superseded",
    ),
    (
        "fenced while an abort landed",
        Scopes(
            fenced=True,
            lease_cancel_called=True,
            abort_cancel_called=True,
            abort_cancelled_caught=True,
        ),
        "superseded",
    ),
    (
        "lease lapsed",
        Scopes(lease_cancel_called=True, lease_cancelled_caught=True),
        "surrendered",
    ),
    # The lease was cancelled while the handler returned: the store's fence decides.
    ("lease lapsed as it returned", Scopes(lease_cancel_called=True), "complete"),
    (
        "aborted",
        Scopes(abort_cancel_called=True, abort_cancelled_caught=True),
        "complete_empty",
    ),
    # Returned after the abort was requested, before it landed (shielded).
    ("abort requested, returned", Scopes(abort_cancel_called=True), "complete"),
    # Both cancelled: Trio's one Cancelled goes to the outermost, the lease.
    (
        "aborted while the lease lapsed",
        Scopes(
            lease_cancel_called=True,
            lease_cancelled_caught=True,
            abort_cancel_called=True,
        ),
        "surrendered",
    ),
    # The abort landed first and the lease was cancelled before the scopes
    # were read: the lease is gone all the same.
    (
        "aborted, then the lease lapsed",
        Scopes(lease_cancel_called=True, abort_cancel_called=True, abort_cancelled_caught=True),
        "surrendered",
    ),
    # A timeout that ended the handler is a failure (issue 33).
    ("timed out", Scopes(timeout_cancelled_caught=True), "timed_out"),
    # It raised something else while its timeout was landing: that error is stored.
    ("raised as it timed out", Scopes(raised=True, timeout_cancelled_caught=True), "fail"),
    # An abort requested once the timeout had landed cannot undo it.
    (
        "timed out, abort requested",
        Scopes(abort_cancel_called=True, timeout_cancelled_caught=True),
        "timed_out",
    ),
    # Timed out and fenced, or with the lease gone by the time the scopes are
    # read: no failure is spent (as for an abort).
    (
        "timed out while fenced",
        Scopes(fenced=True, lease_cancel_called=True, timeout_cancelled_caught=True),
        "superseded",
    ),
    (
        "timed out, then the lease lapsed",
        Scopes(lease_cancel_called=True, timeout_cancelled_caught=True),
        "surrendered",
    ),
]


@pytest.mark.parametrize(
    ("scopes", "decision"),
    [(scopes, decision) for _, scopes, decision in DECISIONS],
    ids=[name for name, _, _ in DECISIONS],
)
def test_what_the_scopes_say_decides_what_to_ask_the_store(
    scopes: Scopes, decision: Decision
) -> None:
    assert decide(scopes) == decision


def _row(index: int = 1) -> StoredEvent:
    return StoredEvent(
        id=f"e{index}",
        type="ordered",
        payload={},
        index=index,
        session_id="orders\x1fs1",
        created_at_ms=0,
    )


def test_a_completion_s_answer_is_its_outcome() -> None:
    # The store could not be reached: the claim lapses.
    assert completed(None, laned=True, aborted=False) is SURRENDERED
    # The attempt fence refused it: a newer attempt owns the event.
    assert completed(CompleteResult("superseded"), laned=True, aborted=False) is SUPERSEDED
    assert completed(CompleteResult("completed"), laned=False, aborted=False) == Outcome(
        "processed"
    )
    answer = CompleteResult("completed", events=[_row(2)], drained=True)
    assert completed(answer, laned=True, aborted=True) == Outcome(
        "processed", opens_lane=True, appended=True, drained=True, aborted=True
    )


def test_a_failure_s_answer_is_its_outcome() -> None:
    assert failed(None) is SURRENDERED
    assert failed(FailResult("failed", 1)) == Outcome("failed")
    assert failed(FailResult("dead_lettered", 10)) == Outcome("dead_lettered")
    assert failed(FailResult("superseded", 1)) == SUPERSEDED
    # A timeout is told apart on a recorded failure only.
    assert failed(None, timed_out=True) is SURRENDERED
    assert failed(FailResult("failed", 1), timed_out=True) == Outcome("failed", timed_out=True)
    assert failed(FailResult("dead_lettered", 3), timed_out=True) == Outcome(
        "dead_lettered", timed_out=True
    )
    assert failed(FailResult("superseded", 1), timed_out=True) == SUPERSEDED


def test_a_timed_out_attempt_s_error_names_the_handler_and_the_timeout() -> None:
    error = timed_out("ship", 2.0)
    assert isinstance(error, TimeoutError)
    assert stored_error(error) == "TimeoutError: handler 'ship' timed out after 2.0 s\n"


async def test_fencing_a_lease_cancels_its_scope() -> None:
    expires_at = trio.current_time() + 30
    lease = Lease(3, 2, "holder", expires_at)
    assert (lease.scope.deadline, lease.fenced, lease.scope.cancel_called) == (
        expires_at,
        False,
        False,
    )
    lease.fence("superseded: a newer attempt owns this event")
    assert (lease.fenced, lease.scope.cancel_called) == (True, True)


def _scopes_of(
    lease: Lease, abort_scope: trio.CancelScope, timeout_scope: trio.CancelScope | None = None
) -> Scopes:
    """The scopes' state, read as the attempt reads it after the ``with`` blocks."""
    return Scopes(
        fenced=lease.fenced,
        lease_cancel_called=lease.scope.cancel_called,
        lease_cancelled_caught=lease.scope.cancelled_caught,
        abort_cancel_called=abort_scope.cancel_called,
        abort_cancelled_caught=abort_scope.cancelled_caught,
        timeout_cancelled_caught=timeout_scope is not None and timeout_scope.cancelled_caught,
    )


async def test_an_abort_landing_as_the_lease_lapses_is_caught_by_the_lease_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    with lease.scope:
        with abort_scope:
            lease.scope.cancel(reason="lease lapsed")
            abort_scope.cancel(reason="aborted by e2")
            await trio.sleep(1)
    scopes = _scopes_of(lease, abort_scope)
    # Trio delivers the cancellation to the outermost cancelled scope.
    assert scopes == Scopes(
        lease_cancel_called=True, lease_cancelled_caught=True, abort_cancel_called=True
    )
    assert decide(scopes) == "surrendered"
    assert trio.current_time() == 0


async def test_an_abort_that_landed_is_caught_by_the_abort_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    with lease.scope:
        with abort_scope:
            abort_scope.cancel(reason="aborted by e2")
            await trio.sleep(1)
    scopes = _scopes_of(lease, abort_scope)
    assert scopes == Scopes(abort_cancel_called=True, abort_cancelled_caught=True)
    assert decide(scopes) == "complete_empty"
    assert trio.current_time() == 0


async def test_a_lease_that_lapses_ends_the_handler_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    with lease.scope:
        with abort_scope:
            await trio.sleep(45)
    assert trio.current_time() == 30
    assert decide(_scopes_of(lease, abort_scope)) == "surrendered"


async def test_a_shielded_handler_returns_after_its_abort_and_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    with lease.scope:
        with abort_scope:
            abort_scope.cancel(reason="aborted by e2")
            with trio.CancelScope(shield=True):
                await trio.sleep(1)
    scopes = _scopes_of(lease, abort_scope)
    assert scopes == Scopes(abort_cancel_called=True)
    assert decide(scopes) == "complete"
    assert trio.current_time() == 1


async def test_a_timeout_ends_the_handler_at_its_deadline_and_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    timeout_scope = trio.CancelScope(relative_deadline=2)
    with lease.scope, abort_scope, timeout_scope:
        await trio.sleep(45)
    assert trio.current_time() == 2
    scopes = _scopes_of(lease, abort_scope, timeout_scope)
    assert scopes == Scopes(timeout_cancelled_caught=True)
    assert decide(scopes) == "timed_out"


async def test_an_abort_landing_with_the_timeout_is_caught_by_the_abort_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    timeout_scope = trio.CancelScope(relative_deadline=2)
    with lease.scope, abort_scope, timeout_scope:
        await trio.sleep(1)
        # Both before the handler's next checkpoint.
        abort_scope.cancel(reason="aborted by e2")
        timeout_scope.deadline = trio.current_time()
        await trio.sleep(1)
    scopes = _scopes_of(lease, abort_scope, timeout_scope)
    # The timeout passed too, but Trio's one Cancelled goes to the outer scope.
    assert timeout_scope.cancel_called
    assert scopes == Scopes(abort_cancel_called=True, abort_cancelled_caught=True)
    assert decide(scopes) == "complete_empty"
    assert trio.current_time() == 1


async def test_a_lease_lapsing_with_the_timeout_surrenders(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    timeout_scope = trio.CancelScope(relative_deadline=30)
    with lease.scope, abort_scope, timeout_scope:
        await trio.sleep(45)
    assert trio.current_time() == 30
    assert decide(_scopes_of(lease, abort_scope, timeout_scope)) == "surrendered"


async def test_a_shutdown_is_caught_by_no_attempt_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = Lease(1, 1, "holder", expires_at=trio.current_time() + 30)
    abort_scope = trio.CancelScope()
    timeout_scope = trio.CancelScope(relative_deadline=2)
    with trio.CancelScope() as server:
        with lease.scope, abort_scope, timeout_scope:
            await trio.sleep(1)
            server.cancel(reason="server closing")
            await trio.sleep(45)
    # The Cancelled left every attempt scope: the attempt stores nothing.
    assert server.cancelled_caught
    caught = [s.cancelled_caught for s in (lease.scope, abort_scope, timeout_scope)]
    assert caught == [False, False, False]
    assert trio.current_time() == 1
