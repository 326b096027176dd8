"""The verdict rules of ``a2trio.stores.rules``: each rule alone, then the
same refusals, word for word, from every backend that applies them."""

from __future__ import annotations

import importlib
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

import pytest
import trio

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores import rules as verdicts
from a2trio.stores.base import AppendEvent, EventCause, FailResult, StoredEvent
from a2trio.stores.conformance import ManualClock, StoreFactory


class Row(NamedTuple):
    """The columns the fences read, as a backend supplies them (``Bookkeeping``)."""

    processed_at_ms: int | None = None
    failed_at_ms: int | None = None
    attempt_count: int = 1
    claim_holder: str | None = "h1"
    failure_count: int = 0
    last_failed_attempt: int | None = None


def _stored(event_id: str, session_id: str = "s", cause: EventCause | None = None) -> StoredEvent:
    return StoredEvent(event_id, "t", None, 1, session_id, 0, cause)


def _refused(
    code: ErrorCode, message: str
) -> AbstractContextManager[pytest.ExceptionInfo[A2Error]]:
    return pytest.raises(A2Error, match=rf"^{code}: {re.escape(message)}$")


# -- the rules ----------------------------------------------------------------


def test_supplied_ids_refuse_an_id_twice() -> None:
    assert verdicts.supplied_ids([AppendEvent("t", None, id="a"), AppendEvent("t", None)]) == ["a"]
    with _refused(
        ErrorCode.PARTIAL_DUPLICATE_BATCH, "batch contains the same event id more than once"
    ):
        verdicts.supplied_ids([AppendEvent("t", None, id="a"), AppendEvent("t", None, id="a")])


def test_a_whole_batch_replays_in_batch_order() -> None:
    events = [AppendEvent("t", None, id="b"), AppendEvent("t", None, id="a")]
    assert verdicts.replayed_batch("s", events, [_stored("a"), _stored("b")]) == [
        _stored("b"),
        _stored("a"),
    ]


def test_a_partial_or_foreign_batch_is_refused() -> None:
    events = [AppendEvent("t", None, id=i) for i in ("z", "y", "x")]
    with _refused(
        ErrorCode.PARTIAL_DUPLICATE_BATCH, "batch mixes 1 already-appended and 2 fresh events"
    ):
        verdicts.replayed_batch("s", events, [_stored("y")])
    # The least foreign id is named, whatever order the rows come in.
    foreign = [_stored("x"), _stored("z", "other"), _stored("y", "other")]
    with _refused(
        ErrorCode.PARTIAL_DUPLICATE_BATCH, "event id 'y' already exists in another session"
    ):
        verdicts.replayed_batch("s", events, foreign)


def test_check_cause_fences_the_attempt() -> None:
    verdicts.check_cause("s", EventCause(1, 1), Row())
    with pytest.raises(ValueError, match=r"^no event at index 4 in session 's'$"):
        verdicts.check_cause("s", EventCause(4, 1), None)
    message = "attempt 1 no longer owns event 1 in session 's'"
    with _refused(ErrorCode.SUPERSEDED_ATTEMPT, message):
        verdicts.check_cause("s", EventCause(1, 1), Row(attempt_count=2))
    with _refused(ErrorCode.SUPERSEDED_ATTEMPT, message):
        verdicts.check_cause("s", EventCause(1, 1), Row(failed_at_ms=5))


def test_has_pending_covers_the_session_and_the_batch() -> None:
    settled = AppendEvent("t", None, settled=True)
    assert not verdicts.has_pending(False, [settled])
    assert verdicts.has_pending(True, [settled])
    assert verdicts.has_pending(False, [settled, AppendEvent("t", None)])


def test_returned_ids_need_ids_once_each() -> None:
    assert verdicts.returned_ids([AppendEvent("t", None, id="a")]) == ["a"]
    with pytest.raises(ValueError, match=r"^returned events need ids \(the server derives them\)$"):
        verdicts.returned_ids([AppendEvent("t", None)])
    with _refused(
        ErrorCode.PARTIAL_DUPLICATE_BATCH,
        "returned event batch contains the same event id more than once",
    ):
        verdicts.returned_ids([AppendEvent("t", None, id="a"), AppendEvent("t", None, id="a")])


@pytest.mark.parametrize(
    ("row", "holds"),
    [
        (Row(), True),
        (Row(processed_at_ms=5), False),
        (Row(failed_at_ms=5), False),
        (Row(attempt_count=2), False),
        (Row(claim_holder=None), False),
    ],
)
def test_holds_claim(row: Row, holds: bool) -> None:
    assert verdicts.holds_claim(row, 1) is holds


def test_a_processed_event_replays_only_for_its_attempt_and_ids() -> None:
    assert verdicts.replays_completion(1, ["a"], 1, ["a"])
    assert not verdicts.replays_completion(1, ["a"], 2, ["a"])
    message = "completed attempt does not match the returned event batch"
    for stored_ids in (["b"], [], None):
        with _refused(ErrorCode.PARTIAL_DUPLICATE_BATCH, message):
            verdicts.replays_completion(1, ["a"], 1, stored_ids)


def test_a_replayed_completion_must_match_the_committed_rows() -> None:
    events = [AppendEvent("t", None, id="b"), AppendEvent("t", None, id="a")]
    mine = [_stored("a", cause=EventCause(3, 1)), _stored("b", cause=EventCause(3, 1))]
    assert verdicts.replayed_completion("s", 3, 1, events, mine) == [mine[1], mine[0]]
    message = "returned event retry does not match the committed batch"
    for stored in (
        mine[:1],
        [mine[0], _stored("b", cause=EventCause(3, 2))],
        [mine[0], _stored("b", "other", EventCause(3, 1))],
        [mine[0], _stored("b")],
    ):
        with _refused(ErrorCode.PARTIAL_DUPLICATE_BATCH, message):
            verdicts.replayed_completion("s", 3, 1, events, stored)


@pytest.mark.parametrize(
    ("row", "result", "record"),
    [
        # The holder records: failed, then dead-lettered at the limit (3).
        (Row(failure_count=1), FailResult("failed", 2), True),
        (Row(failure_count=2), FailResult("dead_lettered", 3), True),
        # Everyone else writes nothing and reports the recorded outcome.
        (Row(processed_at_ms=5, claim_holder=None), FailResult("superseded", 0), False),
        (Row(attempt_count=2, failure_count=1), FailResult("superseded", 1), False),
        (
            Row(failed_at_ms=5, claim_holder=None, failure_count=3),
            FailResult("dead_lettered", 3),
            False,
        ),
        (
            Row(claim_holder=None, failure_count=1, last_failed_attempt=1),
            FailResult("failed", 1),
            False,
        ),
        (Row(claim_holder=None), FailResult("superseded", 0), False),
    ],
)
def test_fail_verdict(row: Row, result: FailResult, record: bool) -> None:
    assert verdicts.fail_verdict(row, 1, 3) == verdicts.FailVerdict(result, record)


# -- every backend, word for word ----------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest) -> StoreFactory:
    module = importlib.import_module(f"tests.backends.{request.param}")
    if request.param == "postgres":
        # Skips here, in a sync fixture, so the reason survives (pytest-trio
        # drops it when raised inside an async test).
        trio.run(module.database_dsn)
    factory: StoreFactory = module.open_store
    return factory


async def _refusal(call: Callable[[], Awaitable[object]]) -> str:
    try:
        await call()
    except (A2Error, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("nothing was refused")


async def test_every_backend_refuses_alike(open_store: StoreFactory) -> None:
    ev = AppendEvent
    async with open_store(ManualClock()) as store:
        await store.append("s", [ev("t", None, id="p1"), ev("t", None)])
        await store.append("other", [ev("t", None, id="far")])
        await store.claim_available("s", holder="h1", ttl_ms=100)
        await store.complete_attempt("s", index=1, attempt=1, events=[ev("t", None, id="c1")])

        def append(*events: AppendEvent) -> Callable[[], Awaitable[object]]:
            return lambda: store.append("s", list(events))

        def complete(index: int, *events: AppendEvent) -> Callable[[], Awaitable[object]]:
            return lambda: store.complete_attempt("s", index=index, attempt=1, events=events)

        refusals = [
            await _refusal(call)
            for call in (
                append(ev("t", None, id="n"), ev("t", None, id="n")),
                append(ev("t", None, id="p1"), ev("t", None)),
                append(ev("t", None, id="far"), ev("t", None, id="p1")),
                append(ev("u", None, id="p1")),
                append(ev("t", None, cause=EventCause(9, 1))),
                append(ev("t", None, cause=EventCause(2, 2))),
                complete(9, ev("t", None, id="n")),
                complete(2, ev("t", None)),
                complete(2, ev("t", None, id="n"), ev("t", None, id="n")),
                complete(2, ev("t", None, id="far")),
                complete(1, ev("t", None, id="c1"), ev("t", None, id="n")),
                complete(1, ev("u", None, id="c1")),
            )
        ]
    assert refusals == [
        "A2Error: PARTIAL_DUPLICATE_BATCH: batch contains the same event id more than once",
        "A2Error: PARTIAL_DUPLICATE_BATCH: batch mixes 1 already-appended and 1 fresh events",
        "A2Error: PARTIAL_DUPLICATE_BATCH: event id 'far' already exists in another session",
        "A2Error: PARTIAL_DUPLICATE_BATCH: event id 'p1' is already stored with type 't', not 'u'",
        "ValueError: no event at index 9 in session 's'",
        "A2Error: SUPERSEDED_ATTEMPT: attempt 2 no longer owns event 2 in session 's'",
        "ValueError: no event at index 9 in session 's'",
        "ValueError: returned events need ids (the server derives them)",
        "A2Error: PARTIAL_DUPLICATE_BATCH: returned event batch contains the same event id"
        " more than once",
        "A2Error: PARTIAL_DUPLICATE_BATCH: returned event batch contains an already-appended"
        " event id",
        "A2Error: PARTIAL_DUPLICATE_BATCH: completed attempt does not match the returned event"
        " batch",
        "A2Error: PARTIAL_DUPLICATE_BATCH: event id 'c1' is already stored with type 't', not 'u'",
    ]


async def test_a_superseded_attempt_replays_its_appends(open_store: StoreFactory) -> None:
    """The duplicate verdict comes before the attempt fence (store-postgres.ts
    ``append``): a handler append retried after its attempt lost the event
    replays instead of raising ``SUPERSEDED_ATTEMPT`` (Postgres used to raise)."""
    clock = ManualClock()
    async with open_store(clock) as store:
        await store.append("s", [AppendEvent("t", None)])
        await store.claim_available("s", holder="h1", ttl_ms=100)
        child = AppendEvent("c", None, id="child", cause=EventCause(1, 1))
        first = await store.append("s", [child])
        clock.advance(100)
        await store.claim_available("s", holder="h2", ttl_ms=100)
        again = await store.append("s", [child])
        assert [(e.id, e.index) for e in again.events] == [("child", first.events[0].index)]
        with _refused(
            ErrorCode.SUPERSEDED_ATTEMPT, "attempt 1 no longer owns event 1 in session 's'"
        ):
            await store.append("s", [AppendEvent("c", None, id="late", cause=EventCause(1, 1))])
        assert len(await store.read("s")) == 2


# -- the table of cases -------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    verdicts.CASES,
    ids=[f"{c.rule}-{c.before}-{c.attempt}-{c.holder}" for c in verdicts.CASES],
)
def test_the_rules_give_every_case_of_the_table_its_verdict(case: verdicts.Case) -> None:
    assert verdicts.decide(case) == case.verdict


def test_the_table_covers_every_rule_and_state() -> None:
    rules = {c.rule for c in verdicts.CASES}
    assert rules == {
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
    }
    assert {c.before for c in verdicts.CASES} == set(verdicts.STATES)
    # Unique requests: a case written twice with two verdicts would pass one.
    requests = [(c.rule, c.before, c.attempt, c.holder, c.max_failures) for c in verdicts.CASES]
    assert len(requests) == len(set(requests))


def test_the_backoff_doubles_to_its_cap() -> None:
    assert [verdicts.retry_backoff_ms(n) for n in range(9)] == [
        0,
        1_000,
        2_000,
        4_000,
        8_000,
        16_000,
        32_000,
        60_000,
        60_000,
    ]


def test_the_sql_and_lua_shift_agrees_with_the_backoff() -> None:
    # SQL and Lua spell the backoff as `first << min(n - 1, doublings)`, capped:
    # the shift must reach the cap, or they would stop short of it.
    first, doublings, cap = rules_numbers = (
        verdicts.RETRY_FIRST_MS,
        verdicts.RETRY_MAX_DOUBLINGS,
        verdicts.RETRY_CAP_MS,
    )
    assert first << (doublings - 1) < cap <= first << doublings, rules_numbers
    for n in range(1, 12):
        assert verdicts.retry_backoff_ms(n) == min(first << min(n - 1, doublings), cap)
