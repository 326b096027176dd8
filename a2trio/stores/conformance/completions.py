"""Outcomes: ``complete_attempt`` (returned events, replays, collisions, the
fence against zombies, the ``drained`` hint) and ``fail_attempt``."""

from __future__ import annotations

from ...errors import ErrorCode
from ..base import Busy, EventCause, Settled
from .kit import (
    T0,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    new_uid,
    raises,
    unchanged,
)

__all__ = [
    "check_complete_attempt",
    "check_complete_attempt_drained_hint",
    "check_complete_attempt_fences_zombies",
    "check_complete_attempt_rejects_a_different_batch",
    "check_complete_attempt_replay_keeps_types",
    "check_fail_attempt",
]


async def check_complete_attempt(open_store: StoreFactory) -> None:
    """Completion marks the parent and appends returned events after the frontier."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("complete")
        await append_n(store, sid, 2)
        claimed_events(await claim(store, sid))
        await store.append(sid, [ev("later")])
        clock.advance(40)
        r1, r2 = new_uid("r1"), new_uid("r2")
        returned = [
            ev("out", {"k": [1, "é"]}, id=r1),
            ev("quiet", id=r2, settled=True),
        ]
        done = await store.complete_attempt(sid, index=1, attempt=1, events=returned)
        assert done.outcome == "completed"
        assert [(e.id, e.index, e.type, e.payload) for e in done.events] == [
            (r1, 4, "out", {"k": [1, "é"]}),
            (r2, 5, "quiet", None),
        ]
        for row in done.events:
            assert row.cause == EventCause(1, 1), f"returned event cause: {row.cause!r}"
            assert row.created_at_ms == T0 + 40
            assert row.session_id == sid
        assert done.events[0].processed_at_ms is None
        assert done.events[1].processed_at_ms == T0 + 40
        rows = await store.read(sid)
        assert rows[3:] == done.events
        parent = rows[0]
        assert parent.processed_at_ms == T0 + 40
        assert parent.processed_by_attempt == 1
        assert parent.returned_event_ids == [r1, r2]
        assert parent.claim_holder is None
        assert parent.claim_expires_at_ms is None
        assert rows[1].processed_at_ms is None, "completion touches only its event"

        clock.advance(10)
        claimed_events(await claim(store, sid))
        replay = await store.complete_attempt(sid, index=1, attempt=1, events=returned)
        assert replay.outcome == "completed"
        assert replay.events == (await store.read(sid))[3:5], "a repeat replays the rows"
        assert len(await store.read(sid)) == 5, "a repeat writes nothing"
        empty = await store.complete_attempt(sid, index=2, attempt=1, events=[])
        assert empty.outcome == "completed"
        assert empty.events == []
        again = await store.complete_attempt(sid, index=2, attempt=1, events=[])
        assert again.outcome == "completed"
        assert again.events == []


async def check_complete_attempt_rejects_a_different_batch(open_store: StoreFactory) -> None:
    """A repeat with other ids, or returning stored ids, is PARTIAL_DUPLICATE_BATCH."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("complete-dup")
        ids = [new_uid("a"), new_uid("b")]
        await append_n(store, sid, 3)
        claimed_events(await claim(store, sid))
        await store.complete_attempt(sid, index=1, attempt=1, events=[ev(id=i) for i in ids])
        before = await store.read(sid)
        for other in ([ev(id=ids[0])], [ev(id=ids[1]), ev(id=ids[0])], [], [ev(id=new_uid("c"))]):
            with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
                await store.complete_attempt(sid, index=1, attempt=1, events=other)
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(sid, index=2, attempt=1, events=[ev(id=ids[0])])
        twice = new_uid("twice")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(
                sid, index=2, attempt=1, events=[ev(id=twice), ev(id=twice)]
            )
        foreign = new_uid("foreign")
        await store.append(new_sid("complete-dup-other"), [ev(id=foreign)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(
                sid, index=3, attempt=1, events=[ev(id=new_uid("fresh")), ev(id=foreign)]
            )
        await unchanged(store, sid, before)
        assert before[1].processed_at_ms is None
        assert before[2].processed_at_ms is None


async def check_complete_attempt_replay_keeps_types(open_store: StoreFactory) -> None:
    """A repeat naming a stored id under another type is a collision (seed
    ``idempotentReplay``), not a replay."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("complete-type")
        await append_n(store, sid, 1)
        claimed_events(await claim(store, sid))
        child = new_uid("child")
        await store.complete_attempt(sid, index=1, attempt=1, events=[ev("out", id=child)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(sid, index=1, attempt=1, events=[ev("other", id=child)])


async def check_complete_attempt_fences_zombies(open_store: StoreFactory) -> None:
    """An attempt that lost its claim completes nothing and writes nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("zombie")
        await append_n(store, sid, 3)
        unclaimed = await store.complete_attempt(sid, index=1, attempt=0, events=[])
        assert unclaimed.outcome == "superseded", "an unclaimed event cannot complete"
        claimed_events(await claim(store, sid, "h1", ttl_ms=100))
        clock.advance(100)
        claimed_events(await claim(store, sid, "h2", ttl_ms=100))
        before = await store.read(sid)
        zombie = await store.complete_attempt(sid, index=1, attempt=1, events=[ev(id=new_uid("z"))])
        assert zombie.outcome == "superseded"
        assert zombie.events == []
        await unchanged(store, sid, before)
        current = await store.complete_attempt(sid, index=1, attempt=2, events=[])
        assert current.outcome == "completed"
        late = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert late.outcome == "superseded", "a processed event names its own attempt"

        released = await store.fail_attempt(sid, index=2, attempt=2, error="e", max_failures=9)
        assert released.outcome == "failed"
        after_fail = await store.complete_attempt(sid, index=2, attempt=2, events=[])
        assert after_fail.outcome == "superseded", "a failed attempt released its claim"
        dead = await store.fail_attempt(sid, index=3, attempt=2, error="e", max_failures=1)
        assert dead.outcome == "dead_lettered"
        before = await store.read(sid)
        assert (await store.complete_attempt(sid, index=3, attempt=2, events=[])).outcome == (
            "superseded"
        )
        await unchanged(store, sid, before)


async def check_complete_attempt_drained_hint(open_store: StoreFactory) -> None:
    """``drained`` is never True while a live event is unprocessed (a store may
    always say False); dead letters and settled returns do not count."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("drained")
        await append_n(store, sid, 3)
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 2, 3]
        dead = await store.fail_attempt(sid, index=3, attempt=1, error="e", max_failures=1)
        assert dead.outcome == "dead_lettered"
        first = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert not first.drained, "event 2 is still unprocessed"
        second = await store.complete_attempt(sid, index=2, attempt=1, events=[ev(id=new_uid("r"))])
        assert not second.drained, "the returned event is unprocessed"
        [returned] = claimed_events(await claim(store, sid))
        settled_reply = ev("reply", id=new_uid("s"), settled=True)
        last = await store.complete_attempt(
            sid, index=returned.index, attempt=1, events=[settled_reply]
        )
        if last.drained:
            rows = await store.read(sid)
            live = [r.index for r in rows if r.processed_at_ms is None and r.failed_at_ms is None]
            assert live == [], f"drained while {live} are unprocessed"
        assert await claim(store, sid) == Settled()


async def check_fail_attempt(open_store: StoreFactory) -> None:
    """Failures release the claim, count, repeat idempotently and dead-letter at the limit."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("fail")
        await append_n(store, sid, 2)
        claimed_events(await claim(store, sid))
        clock.advance(3)
        first = await store.fail_attempt(sid, index=1, attempt=1, error="boom 1", max_failures=3)
        assert (first.outcome, first.failure_count) == ("failed", 1)
        row = (await store.read(sid))[0]
        assert row.claim_holder is None
        assert row.claim_expires_at_ms is None
        assert row.failure_count == 1
        assert row.failed_at_ms is None
        assert row.last_error == "boom 1"
        assert row.last_failed_at_ms == T0 + 3
        assert row.last_failed_attempt == 1
        repeat = await store.fail_attempt(sid, index=1, attempt=1, error="boom 1", max_failures=3)
        assert (repeat.outcome, repeat.failure_count) == ("failed", 1)
        assert (await store.read(sid))[0] == row, "a repeated failure changes nothing"

        retry = claimed_events(await claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retry] == [(1, 2)], "released at once"
        stale = await store.fail_attempt(sid, index=1, attempt=1, error="old", max_failures=3)
        assert (stale.outcome, stale.failure_count) == ("superseded", 1)
        second = await store.fail_attempt(sid, index=1, attempt=2, error="boom 2", max_failures=3)
        assert (second.outcome, second.failure_count) == ("failed", 2)
        claimed_events(await claim(store, sid))
        clock.advance(4)
        third = await store.fail_attempt(sid, index=1, attempt=3, error="boom 3", max_failures=3)
        assert (third.outcome, third.failure_count) == ("dead_lettered", 3)
        dead = (await store.read(sid))[0]
        assert dead.failed_at_ms == T0 + 7
        assert dead.last_error == "boom 3"
        assert dead.processed_at_ms is None
        assert dead.claim_holder is None
        again = await store.fail_attempt(sid, index=1, attempt=3, error="x", max_failures=3)
        assert (again.outcome, again.failure_count) == ("dead_lettered", 3)
        older = await store.fail_attempt(sid, index=1, attempt=2, error="x", max_failures=3)
        assert older.outcome == "superseded"
        assert (await store.read(sid))[0] == dead
        assert await claim(store, sid) == Busy(T0 + 1_000), "only event 2's claim is live"

        await store.complete_attempt(sid, index=2, attempt=1, events=[])
        done = await store.fail_attempt(sid, index=2, attempt=1, error="x", max_failures=3)
        assert (done.outcome, done.failure_count) == ("superseded", 0)
