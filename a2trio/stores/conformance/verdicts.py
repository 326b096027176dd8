"""The rule table played through a backend: every case of
:data:`a2trio.stores.rules.CASES`, its state built and its request made
through the store's public API only, so a backend whose spelling of a rule
(an SQL predicate, a Lua function) drifts from ``rules`` fails by the rule's
name and the state it started from.

One session per case; the :class:`ManualClock` moves only forward, by the
lease, the backoff or the delay a state needs (``rules.LEASE_MS``,
``RETRY_FIRST_MS``, ``DEFER_MS``).
"""

from __future__ import annotations

from uuid import uuid4

from .. import rules
from ..base import (
    AppendEvent,
    Claimed,
    ClaimRef,
    OperatorActionError,
    OperatorActions,
    Store,
)
from .kit import CapabilityMissing, ManualClock, StoreFactory

__all__ = [
    "check_rule_table_claims_and_outcomes",
    "check_rule_table_operator_actions",
    "check_rule_table_sweep",
]

_LANE = "l"
#: The lane head's claim in the lane states: live through the whole case.
_HEAD_LEASE_MS = 600_000


class _Target:
    """The session and index a case acts on, on ``store`` under ``clock``."""

    def __init__(self, store: Store, clock: ManualClock, case: rules.Case) -> None:
        self.store = store
        self.clock = clock
        self.session_id = f"conformance-rules-{case.rule}-{case.before}-{uuid4().hex[:8]}"
        self.index = 1


async def _claim(target: _Target, holder: str) -> None:
    result = await target.store.claim_available(
        target.session_id, holder=holder, ttl_ms=rules.LEASE_MS, limit=1
    )
    assert isinstance(result, Claimed), f"building a state: claim by {holder!r} got {result!r}"


async def _build(target: _Target, state: str, *, keyed: bool) -> None:
    """Bring ``target``'s row into ``state`` of :data:`rules.STATES` (with
    ``keyed``, of debounce key ``k``, as the table's rows are)."""
    store, sid = target.store, target.session_id
    key = "k" if keyed else None
    if state in ("waiting", "handed_on", "behind_dead"):
        lane = [
            AppendEvent("note", {"n": n}, lane=_LANE, debounce_key=key if n == 2 else None)
            for n in (1, 2)
        ]
        await store.append(sid, lane)
        head = await store.claim_available(sid, holder="h0", ttl_ms=_HEAD_LEASE_MS, limit=1)
        assert isinstance(head, Claimed), f"building {state!r}: the lane head claim got {head!r}"
        if state == "handed_on":
            await store.complete_attempt(sid, index=1, attempt=1, events=[])
        elif state == "behind_dead":
            await store.fail_attempt(sid, index=1, attempt=1, error="head", max_failures=1)
        target.index = 2
        return
    await store.append(sid, [AppendEvent("note", {"n": 1}, debounce_key=key)])
    if state == "missing":
        target.index = 2
        return
    if state == "new":
        return
    await _claim(target, "h1")
    if state in ("lapsed", "reclaimed"):
        target.clock.advance(rules.LEASE_MS)
        if state == "reclaimed":
            await _claim(target, "h2")
    elif state in ("failed", "failed_due"):
        await store.fail_attempt(sid, index=1, attempt=1, error="built", max_failures=10)
        if state == "failed_due":
            target.clock.advance(rules.RETRY_FIRST_MS)
    elif state == "dead":
        await store.fail_attempt(sid, index=1, attempt=1, error="built", max_failures=1)
    elif state in ("deferred", "deferred_due"):
        released = await store.release_attempt(sid, index=1, attempt=1, delay_ms=rules.DEFER_MS)
        assert released.outcome == "released", f"building {state!r}: the release got {released!r}"
        if state == "deferred_due":
            target.clock.advance(rules.DEFER_MS)
    elif state == "backing_off":
        await store.fail_attempt(
            sid, index=1, attempt=1, error="built", max_failures=10, retry_after_ms=rules.DEFER_MS
        )
        target.clock.advance(rules.RETRY_FIRST_MS)
    elif state == "processed":
        await store.complete_attempt(sid, index=1, attempt=1, events=[])
    else:
        assert state == "claimed", f"no recipe for state {state!r}"


async def _failure_count(target: _Target) -> int | None:
    rows = await target.store.read(target.session_id)
    return rows[target.index - 1].failure_count if target.index <= len(rows) else None


async def _processed(target: _Target) -> bool:
    rows = await target.store.read(target.session_id)
    return target.index <= len(rows) and rows[target.index - 1].processed_at_ms is not None


def _operator(store: Store) -> OperatorActions:
    if store.operator is None:
        raise CapabilityMissing("operator")
    return store.operator


async def _answer(target: _Target, case: rules.Case) -> str:
    """What the store answers ``case``'s request, in the table's words."""
    store, sid, index = target.store, target.session_id, target.index
    if case.rule == "claim":
        result = await store.claim_available(sid, holder=case.holder, ttl_ms=rules.LEASE_MS)
        taken = isinstance(result, Claimed) and index in [e.index for e in result.events]
        return "claimed" if taken else "passed"
    if case.rule == "debounce":
        later = await store.append(sid, [AppendEvent("note", None, debounce_key="k", delay_ms=1)])
        row = (await store.read(sid))[index - 1]
        skipped = row.processed_at_ms is not None and row.debounced_by == later.events[0].index
        return "skipped" if skipped else "passed"
    if case.rule == "sweep":
        if store.sweep is None:
            raise CapabilityMissing("sweep")
        return "swept" if sid in await store.sweep.claimable_sessions(sid, limit=10) else "passed"
    if case.rule == "renew":
        renewal = await store.renew_claims(
            sid, holder=case.holder, claims=[ClaimRef(index, case.attempt)], ttl_ms=rules.LEASE_MS
        )
        if index in renewal.renewed:
            return "renewed"
        return "superseded" if index in renewal.superseded else "lost"
    try:
        if case.rule == "complete":
            was_processed = await _processed(target)
            done = await store.complete_attempt(sid, index=index, attempt=case.attempt, events=[])
            if done.outcome == "completed" and was_processed:
                return "replay"
            return done.outcome
        if case.rule == "fail":
            before = await _failure_count(target)
            failed = await store.fail_attempt(
                sid,
                index=index,
                attempt=case.attempt,
                error="table",
                max_failures=case.max_failures,
            )
            recorded = await _failure_count(target) != before
            return failed.outcome + (" + recorded" if recorded else "")
        if case.rule == "release":
            released = await store.release_attempt(
                sid, index=index, attempt=case.attempt, delay_ms=rules.DEFER_MS
            )
            return released.outcome
    except ValueError as missing:
        if isinstance(missing, OperatorActionError):
            raise
        return "no_event"
    operator = _operator(store)
    try:
        if case.rule == "redrive":
            await operator.redrive(sid, index, by="conformance", reason="the rule table")
        elif case.rule == "skip":
            await operator.skip(sid, index, by="conformance", reason="the rule table")
        else:
            await operator.retry_now(sid, by="conformance", reason="the rule table")
    except OperatorActionError as refused:
        return refused.reason
    return "done"


async def _play(open_store: StoreFactory, rule_names: set[str]) -> None:
    clock = ManualClock()
    wrong: list[str] = []
    async with open_store(clock) as store:
        for case in rules.CASES:
            if case.rule not in rule_names:
                continue
            target = _Target(store, clock, case)
            await _build(target, case.before, keyed=case.rule == "debounce")
            got = await _answer(target, case)
            if got != case.verdict:
                wrong.append(
                    f"rule {case.rule!r} from {case.before!r} (attempt {case.attempt},"
                    f" holder {case.holder!r}): the table says {case.verdict!r},"
                    f" the store answered {got!r}"
                )
    assert not wrong, "the store departs from a2trio.stores.rules:\n  " + "\n  ".join(wrong)


async def check_rule_table_claims_and_outcomes(open_store: StoreFactory) -> None:
    """Claims, renewals, completions, failures, releases and debounced
    appends decide every case of the rule table as :mod:`a2trio.stores.rules`
    does (the stored not-before and its boundary included)."""
    await _play(open_store, {"claim", "renew", "complete", "fail", "release", "debounce"})


async def check_rule_table_sweep(open_store: StoreFactory) -> None:
    """``claimable_sessions`` finds exactly the sessions the table's sweep
    cases say (the failure backoff and its boundary included)."""
    await _play(open_store, {"sweep"})


async def check_rule_table_operator_actions(open_store: StoreFactory) -> None:
    """Redrive, skip and retry-now refuse and act as the table says."""
    await _play(open_store, {"redrive", "skip", "retry_now"})
