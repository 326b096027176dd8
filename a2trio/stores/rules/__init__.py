"""Every seed rule of the event lifecycle, written once (h11's ``_state.py``
is the model: everything that decides an event's fate lives here).

An event row is *alive* (unprocessed, not dead-lettered), *ripe* (no stored
not-before instant still to come), *claimable* (alive, first in its lane, no
live claim, ripe), *due* (no failure backoff to wait out),
*fenced* (its attempt lost the row), *failed* (waiting out a backoff) or
*dead* (a dead letter, which still blocks its lane). The rules are pure
functions over the bookkeeping columns of one row (:class:`Bookkeeping`,
:class:`Dispatch`), and :data:`CASES` is their table: a named row before, a
request, the verdict. ``tests/test_verdicts.py`` plays the table through the
functions; ``a2trio.stores.conformance.verdicts`` plays it through each
backend's public API, so a backend whose spelling of a rule drifts fails by
the rule's name.

Who decides where: the memory store makes every decision by calling these
functions, and so does SQLite (in process: no round trip to save) over the
rows its transaction reads, but for the predicates that select rows through
a partial index and a few decisions one statement makes cheaper. Postgres
and Redis decide inside one statement or script (a round trip saved per
operation). Each rule decided in SQL or Lua is spelled once per language as
a named fragment whose numbers come from the constants here
(:data:`RETRY_FIRST_MS`, :data:`RETRY_MAX_DOUBLINGS`, :data:`RETRY_CAP_MS`),
and the message-building rules (replays, fences, refusals) apply to what
the statement returns.
"""

from __future__ import annotations

from .actions import (
    check_action,
    retry_targets,
)
from .dispatch import (
    EVENT_RETRY,
    RETRY_CAP_MS,
    RETRY_FIRST_MS,
    RETRY_MAX_DOUBLINGS,
    RenewVerdict,
    alive,
    busy_until,
    claim_free,
    claimable,
    debounces,
    drained,
    due,
    hands_on,
    held,
    next_in_lane,
    ready_at_insert,
    renew_verdict,
    retry_backoff_ms,
    ripe,
    sweepable,
)
from .fences import (
    MAX_FAILED_ATTEMPTS,
    CompleteVerdict,
    FailVerdict,
    ReleaseVerdict,
    check_cause,
    complete_verdict,
    fail_verdict,
    has_pending,
    holds_claim,
    journals,
    no_event,
    release_verdict,
    replayed_batch,
    replayed_completion,
    replays_completion,
    returned_id_taken,
    returned_ids,
    stale_index,
    superseded_attempt,
    supplied_ids,
)
from .flow import (
    Keyed,
    KeyedDispatch,
    Selection,
    claim_order,
    claims_at_insert,
    flow_retry_at,
    flow_select,
    has_room,
    live_slot,
    live_start,
)
from .retention import (
    HeldClaim,
    Holding,
    check_expected,
    check_finished,
    check_read,
    check_trim,
    check_unclaimed,
    live_claim,
    needs_first_index,
    trim_point,
)
from .rows import (
    ActionTarget,
    Bookkeeping,
    Claim,
    Completion,
    Debounced,
    Dispatch,
    Laned,
    Retrying,
)
from .table import (
    CASES,
    DEFER_MS,
    LEASE_MS,
    NOW,
    STATES,
    Case,
    Facts,
    Rule,
    decide,
)
from .waits import NEVER_MS, WakeVerdict, Waking, check_wake, wake_verdict, wakes

__all__ = [
    "CASES",
    "DEFER_MS",
    "EVENT_RETRY",
    "LEASE_MS",
    "MAX_FAILED_ATTEMPTS",
    "NEVER_MS",
    "NOW",
    "RETRY_CAP_MS",
    "RETRY_FIRST_MS",
    "RETRY_MAX_DOUBLINGS",
    "STATES",
    "ActionTarget",
    "Bookkeeping",
    "Case",
    "Claim",
    "CompleteVerdict",
    "Completion",
    "Debounced",
    "Dispatch",
    "Facts",
    "FailVerdict",
    "HeldClaim",
    "Holding",
    "Keyed",
    "KeyedDispatch",
    "Laned",
    "ReleaseVerdict",
    "RenewVerdict",
    "Retrying",
    "Rule",
    "Selection",
    "WakeVerdict",
    "Waking",
    "alive",
    "busy_until",
    "check_action",
    "check_cause",
    "check_expected",
    "check_finished",
    "check_read",
    "check_trim",
    "check_unclaimed",
    "check_wake",
    "claim_free",
    "claim_order",
    "claimable",
    "claims_at_insert",
    "complete_verdict",
    "debounces",
    "decide",
    "drained",
    "due",
    "fail_verdict",
    "flow_retry_at",
    "flow_select",
    "hands_on",
    "has_pending",
    "has_room",
    "held",
    "holds_claim",
    "journals",
    "live_claim",
    "live_slot",
    "live_start",
    "needs_first_index",
    "next_in_lane",
    "no_event",
    "ready_at_insert",
    "release_verdict",
    "renew_verdict",
    "replayed_batch",
    "replayed_completion",
    "replays_completion",
    "retry_backoff_ms",
    "retry_targets",
    "returned_id_taken",
    "returned_ids",
    "ripe",
    "stale_index",
    "superseded_attempt",
    "supplied_ids",
    "sweepable",
    "trim_point",
    "wake_verdict",
    "wakes",
]
