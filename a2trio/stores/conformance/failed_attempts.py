"""Each event's failed attempts (issue 36): the history ``fail_attempt``
records beside the row's last error, and ``inspect.read_failures`` reads.

A failure that records writes its attempt, error, time, holder and claim
time in the same transaction; a repeat, a superseded attempt or a completion
writes none; an operator's redrive keeps the history; a store keeps the
latest :data:`~a2trio.stores.rules.MAX_FAILED_ATTEMPTS` of an event; an
erasure takes them with the session.
"""

from __future__ import annotations

from .. import rules
from ..base import ClaimRequest, FailedAttempt, Inspection, Store
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    new_sid,
)

__all__ = [
    "check_failed_attempts_are_bounded",
    "check_failed_attempts_are_erased_with_their_session",
    "check_failed_attempts_are_recorded_with_each_failure",
]


def _inspect(store: Store) -> Inspection:
    if store.inspect is None:
        raise CapabilityMissing("inspect")
    return store.inspect


async def check_failed_attempts_are_recorded_with_each_failure(open_store: StoreFactory) -> None:
    """Every failure that records adds its attempt to the event's history
    (error, time, holder, claim time), oldest first; repeats, superseded
    attempts and completions add nothing; a redrive keeps the history."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        sid = new_sid("failed-attempts")
        await append_n(store, sid, 3)
        assert await inspect.read_failures(sid, [1, 2, 3]) == [], "nothing failed yet"
        claimed_events(await claim(store, sid, holder="worker-a"))
        clock.advance(7)
        await store.fail_attempt(sid, index=1, attempt=1, error="boom 1", max_failures=3)
        await store.fail_attempt(sid, index=1, attempt=1, error="again", max_failures=3)
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        clock.advance(10)
        claimed_events(await claim(store, sid, holder="worker-b"))
        await store.fail_attempt(sid, index=1, attempt=1, error="stale", max_failures=3)
        clock.advance(5)
        await store.fail_attempt(sid, index=2, attempt=1, error="two", max_failures=3)
        await store.fail_attempt(sid, index=1, attempt=2, error="boom 2", max_failures=3)
        first = FailedAttempt(1, 1, "boom 1", T0 + 7, "worker-a", T0)
        second = FailedAttempt(1, 2, "boom 2", T0 + 22, "worker-b", T0 + 17)
        other = FailedAttempt(2, 1, "two", T0 + 22, "worker-a", T0)
        found = await inspect.read_failures(sid, [3, 2, 1, 2])
        assert found == [first, second, other], f"by index, then attempt: {found!r}"
        assert await inspect.read_failures(sid, [1]) == [first, second]
        assert await inspect.read_failures(sid, [3]) == [], "a completion records no failure"
        assert await inspect.read_failures(sid, []) == []
        assert await inspect.read_failures(new_sid("failed-none"), [1]) == []

        claimed_events(await claim(store, sid, holder="worker-c"))
        clock.advance(1)
        dead = await store.fail_attempt(sid, index=1, attempt=3, error="boom 3", max_failures=3)
        assert dead.outcome == "dead_lettered"
        third = FailedAttempt(1, 3, "boom 3", T0 + 23, "worker-c", T0 + 22)
        await store.fail_attempt(sid, index=1, attempt=3, error="repeat", max_failures=3)
        assert await inspect.read_failures(sid, [1]) == [first, second, third]
        if store.operator is not None:
            await store.operator.redrive(sid, 1, by="op", reason="fixed")
            assert await inspect.read_failures(sid, [1]) == [first, second, third], (
                "a redrive keeps the history"
            )

        claimed = new_sid("failed-attempts-claimed")
        clock.advance(100)
        await store.append(claimed, [ev()], claim=ClaimRequest("worker-d", 1_000))
        clock.advance(2)
        await store.fail_attempt(claimed, index=1, attempt=1, error="at once", max_failures=3)
        assert await inspect.read_failures(claimed, [1]) == [
            FailedAttempt(1, 1, "at once", T0 + 125, "worker-d", T0 + 123)
        ], "an event claimed by its append records its claim time too"


async def check_failed_attempts_are_bounded(open_store: StoreFactory) -> None:
    """A store keeps the latest ``rules.MAX_FAILED_ATTEMPTS`` failed attempts
    of an event, dropping the oldest; other events keep theirs."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        sid = new_sid("failed-bounded")
        await append_n(store, sid, 2)
        most = rules.MAX_FAILED_ATTEMPTS
        failures = most + 3
        for attempt in range(1, failures + 1):
            claimed_events(await claim(store, sid))
            clock.advance(1)
            await store.fail_attempt(
                sid, index=1, attempt=attempt, error=f"e{attempt}", max_failures=failures + 1
            )
            if attempt == 1:
                await store.fail_attempt(sid, index=2, attempt=1, error="kept", max_failures=9)
        kept = await inspect.read_failures(sid, [1, 2])
        assert [(f.index, f.attempt) for f in kept] == [
            *((1, attempt) for attempt in range(4, failures + 1)),
            (2, 1),
        ], f"the latest {most} of event 1, and event 2's own: {kept!r}"
        assert kept[-2].error == f"e{failures}"
        row = (await store.read(sid))[0]
        assert row.failure_count == failures, "the bound is the history's, not the count's"


async def check_failed_attempts_are_erased_with_their_session(open_store: StoreFactory) -> None:
    """Erasing a session (``store.retention``) erases its failed attempts
    too; another session keeps its own."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        if store.retention is None:
            raise CapabilityMissing("retention")
        gone, kept = new_sid("failed-erased"), new_sid("failed-kept")
        for sid in (gone, kept):
            await store.append(sid, [ev()], claim=ClaimRequest("worker", 1_000))
            await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=3)
        await store.retention.erase(gone)
        assert await inspect.read_failures(gone, [1]) == [], "erased with its session"
        await store.append(gone, [ev()])
        assert await inspect.read_failures(gone, [1]) == [], "a new event 1 has no history"
        assert [f.error for f in await inspect.read_failures(kept, [1])] == ["boom"]
