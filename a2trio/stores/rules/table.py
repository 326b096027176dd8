"""The table of cases: every rule against every state it distinguishes.

h11 draws its state machine as tables; this is the event lifecycle's. Each
state of :data:`STATES` is reachable through a store's public API
(``a2trio.stores.conformance.verdicts`` builds it so and plays every case),
and :func:`decide` is the rules' own answer (``tests/test_verdicts.py``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..base import OperatorActionError
from .actions import check_action, retry_targets
from .dispatch import RETRY_FIRST_MS, alive, claimable, debounces, renew_verdict, sweepable
from .fences import complete_verdict, fail_verdict, release_verdict

__all__ = [
    "CASES",
    "DEFER_MS",
    "LEASE_MS",
    "NOW",
    "STATES",
    "Case",
    "Facts",
    "Rule",
    "decide",
]


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """One event row's bookkeeping in a named state of :data:`STATES`, at
    :data:`NOW` (it satisfies every row protocol above). Every row is a
    ``note`` of debounce key ``k`` (what the ``debounce`` cases append)."""

    type: str = "note"
    debounce_key: str | None = "k"
    lane: str | None = None
    lane_ready: bool = True
    processed_at_ms: int | None = None
    processed_by_attempt: int | None = None
    returned_event_ids: list[str] | None = None
    attempt_count: int = 0
    claim_holder: str | None = None
    claim_expires_at_ms: int | None = None
    failure_count: int = 0
    last_failed_at_ms: int | None = None
    last_failed_attempt: int | None = None
    failed_at_ms: int | None = None
    not_before_ms: int | None = None


#: The table's clock, the lease its claims took, and the delay of its
#: releases and backoffs (the not-before states).
NOW = 1_000_000
LEASE_MS = 1_000
DEFER_MS = 5_000

#: The rows the table starts from. Each is reachable through a store's
#: public API (``a2trio.stores.conformance.verdicts`` builds it so): ``h1``
#: claims attempt 1; ``h2`` claims attempt 2 after ``h1``'s lapsed. The lane
#: states are the second event of a lane whose first is held by a live
#: claim, completed, or dead-lettered. ``deferred`` is ``claimed`` released
#: (``release_attempt``) for :data:`DEFER_MS`, ``deferred_due`` once that
#: passed; ``backing_off`` failed with a per-handler backoff of
#: :data:`DEFER_MS` (``fail_attempt(retry_after_ms=...)``), whose seed
#: backoff passed but not its own. ``missing`` is an index past the end.
STATES: dict[str, Facts | None] = {
    "new": Facts(),
    "claimed": Facts(attempt_count=1, claim_holder="h1", claim_expires_at_ms=NOW + LEASE_MS),
    # Expiring exactly now: free (the boundary of `claim_free`).
    "lapsed": Facts(attempt_count=1, claim_holder="h1", claim_expires_at_ms=NOW),
    "reclaimed": Facts(attempt_count=2, claim_holder="h2", claim_expires_at_ms=NOW + LEASE_MS),
    "failed": Facts(attempt_count=1, failure_count=1, last_failed_at_ms=NOW, last_failed_attempt=1),
    # The backoff of one failure passed exactly now (the boundary of `due`).
    "failed_due": Facts(
        attempt_count=1,
        failure_count=1,
        last_failed_at_ms=NOW - RETRY_FIRST_MS,
        last_failed_attempt=1,
    ),
    "dead": Facts(
        attempt_count=1,
        failure_count=1,
        last_failed_at_ms=NOW,
        last_failed_attempt=1,
        failed_at_ms=NOW,
    ),
    "processed": Facts(
        attempt_count=1, processed_at_ms=NOW, processed_by_attempt=1, returned_event_ids=[]
    ),
    "waiting": Facts(lane="l", lane_ready=False),
    "handed_on": Facts(lane="l"),
    "behind_dead": Facts(lane="l", lane_ready=False),
    "deferred": Facts(attempt_count=1, not_before_ms=NOW + DEFER_MS),
    # Its not-before is exactly now: ripe (the boundary of `ripe`).
    "deferred_due": Facts(attempt_count=1, not_before_ms=NOW),
    "backing_off": Facts(
        attempt_count=1,
        failure_count=1,
        last_failed_at_ms=NOW - RETRY_FIRST_MS,
        last_failed_attempt=1,
        not_before_ms=NOW - RETRY_FIRST_MS + DEFER_MS,
    ),
    "missing": None,
}

Rule = Literal[
    "claim",
    "sweep",
    "renew",
    "complete",
    "fail",
    "release",
    "debounce",
    "redrive",
    "skip",
    "retry_now",
]


class Case(msgspec.Struct, frozen=True):
    """One row of the table: ``rule`` applied to the row in state ``before``
    by ``attempt`` (held by ``holder``; ``max_failures`` for ``fail``)
    answers ``verdict``.

    Verdicts: ``claim`` ``claimed``/``passed``; ``sweep`` ``swept``/``passed``;
    ``renew`` a :data:`RenewVerdict`; ``complete`` a :data:`CompleteVerdict`
    (returning no events); ``fail`` the outcome, ``+ recorded`` when it writes;
    ``release`` a :data:`ReleaseVerdict`; ``debounce`` (a later ``note`` of
    the row's key appended) ``skipped``/``passed``;
    the operator actions ``done`` or their refusal's reason; ``no_event`` for
    an index the session lacks.
    """

    rule: Rule
    before: str
    verdict: str
    attempt: int = 1
    holder: str = "h1"
    max_failures: int = 3


def _cases(
    rule: Rule, verdicts: str, *, attempt: int = 1, holder: str = "h1", max_failures: int = 3
) -> list[Case]:
    """Cases of ``rule`` from ``"state: verdict, ..."``."""
    pairs = (item.split(":") for item in verdicts.split(","))
    return [
        Case(rule, before.strip(), verdict.strip(), attempt, holder, max_failures)
        for before, verdict in pairs
    ]


#: Every rule against every state it distinguishes.
CASES: tuple[Case, ...] = (
    *_cases(
        "claim",
        "new: claimed, claimed: passed, lapsed: claimed, reclaimed: passed, failed: claimed,"
        " failed_due: claimed, dead: passed, processed: passed, waiting: passed,"
        " handed_on: claimed, behind_dead: passed, deferred: passed, deferred_due: claimed,"
        " backing_off: passed",
        holder="h9",
    ),
    *_cases(
        "sweep",
        "new: swept, claimed: passed, lapsed: swept, reclaimed: passed, failed: passed,"
        " failed_due: swept, dead: passed, processed: passed, waiting: passed,"
        " handed_on: swept, behind_dead: passed, deferred: passed, deferred_due: swept,"
        " backing_off: passed",
    ),
    *_cases(
        "renew",
        "claimed: renewed, lapsed: lost, reclaimed: superseded, failed: lost, dead: lost,"
        " processed: lost, new: lost, missing: lost",
    ),
    *_cases("renew", "claimed: lost", holder="h9"),
    *_cases("renew", "claimed: lost", attempt=2),
    *_cases("renew", "reclaimed: renewed", attempt=2, holder="h2"),
    *_cases(
        "complete",
        "claimed: completed, lapsed: completed, reclaimed: superseded, failed: superseded,"
        " dead: superseded, processed: replay, new: superseded, missing: no_event",
    ),
    *_cases("complete", "reclaimed: completed, processed: superseded", attempt=2),
    *_cases(
        "fail",
        "claimed: failed + recorded, lapsed: failed + recorded, reclaimed: superseded,"
        " failed: failed, dead: dead_lettered, processed: superseded, new: superseded,"
        " missing: no_event",
    ),
    *_cases("fail", "claimed: dead_lettered + recorded", max_failures=1),
    *_cases("fail", "reclaimed: failed + recorded, failed: superseded", attempt=2),
    *_cases("fail", "deferred: superseded, backing_off: failed"),
    *_cases("complete", "deferred: superseded"),
    *_cases(
        "release",
        "claimed: released, lapsed: released, reclaimed: superseded, failed: superseded,"
        " dead: superseded, processed: superseded, new: superseded, deferred: superseded,"
        " missing: no_event",
    ),
    *_cases("release", "reclaimed: released", attempt=2),
    *_cases(
        "debounce",
        "new: skipped, claimed: passed, lapsed: skipped, reclaimed: passed, failed: skipped,"
        " failed_due: skipped, dead: passed, processed: passed, waiting: skipped,"
        " handed_on: skipped, behind_dead: skipped, deferred: skipped, deferred_due: skipped,"
        " backing_off: skipped",
    ),
    *_cases(
        "redrive",
        "dead: done, claimed: claimed, lapsed: not_dead_lettered, new: not_dead_lettered,"
        " failed: not_dead_lettered, processed: not_dead_lettered, missing: no_event",
    ),
    *_cases(
        "skip",
        "new: done, claimed: claimed, reclaimed: claimed, lapsed: done, failed: done,"
        " dead: done, processed: settled, waiting: done, missing: no_event",
    ),
    *_cases(
        "retry_now",
        "new: done, claimed: claimed, lapsed: done, failed: done, failed_due: done,"
        " dead: nothing_to_retry, processed: nothing_to_retry",
    ),
)


def decide(case: Case) -> str:
    """The verdict the rules above give ``case`` (``tests/test_verdicts.py``
    checks it against ``case.verdict``)."""
    row = STATES[case.before]
    if row is None and case.rule in ("complete", "fail", "release"):
        return "no_event"
    if case.rule == "claim":
        return "claimed" if row is not None and claimable(row, NOW) else "passed"
    if case.rule == "sweep":
        return "swept" if row is not None and sweepable(row, NOW) else "passed"
    if case.rule == "debounce":
        return "skipped" if row is not None and debounces(row, "note", "k", NOW) else "passed"
    if case.rule == "renew":
        return renew_verdict(row, case.attempt, case.holder, NOW)
    assert row is not None or case.rule in ("redrive", "skip", "retry_now")
    if case.rule == "complete":
        assert row is not None
        return complete_verdict(row, case.attempt, [])
    if case.rule == "fail":
        assert row is not None
        verdict = fail_verdict(row, case.attempt, case.max_failures)
        return verdict.result.outcome + (" + recorded" if verdict.record else "")
    if case.rule == "release":
        assert row is not None
        return release_verdict(row, case.attempt)
    try:
        if case.rule == "retry_now":
            ready = row is not None and alive(row) and row.lane_ready
            candidates = [(1, row.claim_expires_at_ms)] if ready and row is not None else []
            retry_targets("s", candidates, NOW)
        else:
            check_action(case.rule, "s", 1, row, NOW)
    except OperatorActionError as refused:
        return refused.reason
    return "done"
