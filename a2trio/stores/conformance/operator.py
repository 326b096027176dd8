"""The ``operator`` capability: redrive, skip, retry now and the dead-letter
list, each recorded; refusals change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from uuid import uuid4

from ..base import OperatorActionError, OperatorActions, Store, StoredEvent
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    unchanged,
)

__all__ = [
    "check_operator_dead_letters",
    "check_operator_redrive",
    "check_operator_retry_now",
    "check_operator_skip",
    "refused",
]


def _operator(store: Store) -> OperatorActions:
    if store.operator is None:
        raise CapabilityMissing("operator")
    return store.operator


@contextmanager
def refused(reason: str) -> Iterator[None]:
    """Assert that the block raises :class:`OperatorActionError` for ``reason``."""
    try:
        yield
    except OperatorActionError as exc:
        if exc.reason != reason:
            raise AssertionError(f"expected refusal {reason!r}, got {exc.reason!r}") from exc
    else:
        raise AssertionError(f"expected refusal {reason!r}, nothing was raised")


async def check_operator_redrive(open_store: StoreFactory) -> None:
    """A redrive resets a dead letter's failures, keeps its error, unblocks
    its lane and is recorded; other targets are refused and change nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        ops = _operator(store)
        sid = new_sid("redrive")
        await store.append(sid, [ev("a", lane="z"), ev("b", lane="z")])
        claimed_events(await claim(store, sid))
        await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=1)
        before = await store.read(sid)
        with refused("no_event"):
            await ops.redrive(sid, 3, by="op", reason="r")
        with refused("not_dead_lettered"):
            await ops.redrive(sid, 2, by="op", reason="r")
        await unchanged(store, sid, before)
        clock.advance(5)
        action = await ops.redrive(sid, 1, by="alice", reason="fixed the bug")
        assert (action.action, action.session_id, action.index) == ("redrive", sid, 1)
        assert (action.by, action.reason, action.at_ms) == ("alice", "fixed the bug", T0 + 5)
        row = (await store.read(sid))[0]
        assert (row.failure_count, row.failed_at_ms, row.processed_at_ms) == (0, None, None)
        assert row.last_error == "boom", "the error history stays"
        with refused("not_dead_lettered"):
            await ops.redrive(sid, 1, by="op", reason="twice")
        retry = claimed_events(await claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retry] == [(1, 2)], "claimable at once"
        await store.complete_attempt(sid, index=1, attempt=2, events=[])
        assert indexes_of(claimed_events(await claim(store, sid))) == [2], "the lane moved on"
        actions = await ops.read_actions(sid, after_index=0, through_index=2)
        assert actions == [action], actions


async def check_operator_skip(open_store: StoreFactory) -> None:
    """A skip marks an unprocessed event processed by no attempt and hands
    its lane on; a live claim refuses it, and the zombie of an expired one
    is superseded."""
    clock = ManualClock()
    async with open_store(clock) as store:
        ops = _operator(store)
        sid = new_sid("skip")
        await store.append(sid, [ev("a", lane="z"), ev("b", lane="z"), ev("c")])
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 3]
        before = await store.read(sid)
        with refused("claimed"):
            await ops.skip(sid, 1, by="op", reason="r")
        with refused("no_event"):
            await ops.skip(sid, 4, by="op", reason="r")
        await unchanged(store, sid, before)
        clock.advance(1_000)  # the claims lapsed
        skipped = await ops.skip(sid, 1, by="bob", reason="poison")
        assert (skipped.action, skipped.index, skipped.by) == ("skip", 1, "bob")
        row = (await store.read(sid))[0]
        assert row.processed_at_ms == T0 + 1_000
        assert (row.processed_by_attempt, row.claim_holder, row.claim_expires_at_ms) == (
            None,
            None,
            None,
        )
        zombie = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert zombie.outcome == "superseded"
        failed = await store.fail_attempt(sid, index=1, attempt=1, error="x", max_failures=3)
        assert failed.outcome == "superseded"
        with refused("settled"):
            await ops.skip(sid, 1, by="op", reason="twice")
        claimed = claimed_events(await claim(store, sid))
        assert [(e.index, e.attempt_count) for e in claimed] == [(2, 1), (3, 2)], "lane handed on"
        await store.fail_attempt(sid, index=2, attempt=1, error="boom", max_failures=1)
        await ops.skip(sid, 2, by="bob", reason="dead too")
        assert (await store.read(sid))[1].failed_at_ms is None, "skipped: no longer dead"
        await store.complete_attempt(sid, index=3, attempt=2, events=[])
        assert not (await store.append(sid, [])).has_pending
        with refused("settled"):
            await ops.skip(sid, 3, by="op", reason="done")
        actions = await ops.read_actions(sid, after_index=0, through_index=3)
        assert [(a.action, a.index) for a in actions] == [("skip", 1), ("skip", 2)]
        assert await ops.read_actions(sid, after_index=1, through_index=3) == actions[1:]


async def check_operator_retry_now(open_store: StoreFactory) -> None:
    """Retry-now records every event a claim would take now, backoff
    ignored, and changes no row; a session whose work is all under live
    claims, or that has none, is refused."""
    clock = ManualClock()
    async with open_store(clock) as store:
        ops = _operator(store)
        sid = new_sid("retry-now")
        with refused("nothing_to_retry"):
            await ops.retry_now(sid, by="op", reason="r")
        await store.append(sid, [ev("a"), ev("b"), ev("c", lane="z"), ev("d", lane="z")])
        claimed_events(await claim(store, sid))
        with refused("claimed"):
            await ops.retry_now(sid, by="op", reason="r")
        await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=10)
        await store.fail_attempt(sid, index=2, attempt=1, error="boom", max_failures=1)
        before = await store.read(sid)
        clock.advance(1)
        actions = await ops.retry_now(sid, by="carol", reason="deployed a fix")
        assert [(a.action, a.index, a.by, a.at_ms) for a in actions] == [
            ("retry_now", 1, "carol", T0 + 1)
        ], "the failed event, in its backoff; not the dead letter nor the live claim"
        await unchanged(store, sid, before)
        clock.advance(1_000)
        again = await ops.retry_now(sid, by="carol", reason="r")
        assert [a.index for a in again] == [1, 3], "3's claim lapsed; 4 waits in its lane"
        recorded = await ops.read_actions(sid, after_index=0, through_index=4)
        assert [a.index for a in recorded] == [1, 1, 3]


async def check_operator_dead_letters(open_store: StoreFactory) -> None:
    """Dead letters of one prefix, by (session key, index), paged with
    ``after``; redriven and skipped ones leave the list."""
    async with open_store(ManualClock()) as store:
        ops = _operator(store)
        prefix = f"dead-{uuid4().hex[:8]}\x1f"
        first, second = prefix + "a", prefix + "b"
        for key in (first, second, f"other-{prefix}a"):
            await append_n(store, key, 3)
            claimed_events(await claim(store, key))
            for index in (1, 3):
                await store.fail_attempt(key, index=index, attempt=1, error="e", max_failures=1)

        def where(rows: list[StoredEvent]) -> list[tuple[str, int]]:
            return [(row.session_id, row.index) for row in rows]

        everything = [(first, 1), (first, 3), (second, 1), (second, 3)]
        assert where(await ops.dead_letters(prefix, limit=10)) == everything
        page = await ops.dead_letters(prefix, limit=3)
        assert where(page) == everything[:3]
        rest = await ops.dead_letters(prefix, limit=3, after=(page[-1].session_id, page[-1].index))
        assert where(rest) == everything[3:]
        assert rest[0].failed_at_ms is not None
        assert rest[0].last_error == "e"
        await ops.redrive(first, 1, by="op", reason="r")
        await ops.skip(second, 3, by="op", reason="r")
        assert where(await ops.dead_letters(prefix, limit=10)) == [(first, 3), (second, 1)]
