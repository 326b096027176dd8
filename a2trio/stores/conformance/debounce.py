"""Debounced appends (issue 33): ``AppendEvent(delay_ms=..., debounce_key=...)``
settles the session's earlier events of its type and key as skipped, in the
append's transaction (``rules.debounces``), and waits out its delay; so does
a completion's returned event, in the completion's transaction."""

from __future__ import annotations

from ..base import AppendEvent, Settled, Store, StoredEvent
from .kit import (
    T0,
    ManualClock,
    StoreFactory,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    new_uid,
)

__all__ = [
    "check_debounce_applies_to_returned_events",
    "check_debounce_hands_lanes_on_and_replays",
    "check_debounce_leaves_running_events_alone",
    "check_debounce_skips_earlier_events_of_its_key",
]


def _bounce(
    key: str, *, type: str = "note", lane: str | None = None, id: str | None = None
) -> AppendEvent:
    return AppendEvent(type, {"key": key}, id=id, lane=lane, delay_ms=1_000, debounce_key=key)


def _skipped_by(row: StoredEvent, by: int, *, attempts: int = 0) -> None:
    assert row.processed_at_ms is not None, f"#{row.index} was not skipped: {row!r}"
    assert row.debounced_by == by, f"#{row.index} skipped by {row.debounced_by}, not {by}"
    assert (row.attempt_count, row.processed_by_attempt) == (attempts, None), row
    assert (row.claim_holder, row.claim_expires_at_ms) == (None, None), row


def _alive(row: StoredEvent) -> None:
    assert row.processed_at_ms is None, f"#{row.index} was skipped: {row!r}"
    assert row.debounced_by is None, row


async def _rows(store: Store, sid: str) -> list[StoredEvent]:
    return await store.read(sid)


async def check_debounce_skips_earlier_events_of_its_key(open_store: StoreFactory) -> None:
    """A debounced append skips the earlier alive events of its type and key
    (not another key's, not another type's), stores its key and its
    not-before, and is claimed only once that comes."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("debounce")
        await store.append(sid, [_bounce("a"), _bounce("b"), _bounce("a", type="other")])
        clock.advance(10)
        later = await store.append(sid, [_bounce("a")])
        [row4] = later.events
        assert (row4.index, row4.debounce_key) == (4, "a"), row4
        assert row4.not_before_ms == T0 + 10 + 1_000, row4
        one, two, three, four = await _rows(store, sid)
        _skipped_by(one, 4)
        assert one.processed_at_ms == T0 + 10, one
        _alive(two)
        _alive(three)
        assert four == row4, f"read {four!r}, appended {row4!r}"
        clock.advance(999)
        # The first three waited 1_000 ms from T0: #2 and #3 are due, #4 not.
        assert indexes_of(claimed_events(await claim(store, sid))) == [2, 3]
        clock.advance(1)
        assert indexes_of(claimed_events(await claim(store, sid, holder="h2"))) == [4]
        skipped = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert skipped.outcome == "superseded", f"a skipped event completed: {skipped!r}"


async def check_debounce_leaves_running_events_alone(open_store: StoreFactory) -> None:
    """An earlier event under a live claim is not skipped (its attempt runs
    on); a lapsed claim is no longer running, and a dead letter stays."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("debounce-running")
        await store.append(sid, [_bounce("a")])
        clock.advance(1_000)
        claimed_events(await claim(store, sid, ttl_ms=5_000))
        await store.append(sid, [_bounce("a")])
        one, two = await _rows(store, sid)
        _alive(one)
        _alive(two)
        done = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert done.outcome == "completed", done
        clock.advance(1_000)
        claimed_events(await claim(store, sid, ttl_ms=100))
        clock.advance(100)
        await store.append(sid, [_bounce("a")])
        _skipped_by((await _rows(store, sid))[1], 3, attempts=1)
        clock.advance(1_000)
        claimed_events(await claim(store, sid))
        failed = await store.fail_attempt(sid, index=3, attempt=1, error="x", max_failures=1)
        assert failed.outcome == "dead_lettered", failed
        await store.append(sid, [_bounce("a")])
        assert (await _rows(store, sid))[2].failed_at_ms is not None, "a dead letter was skipped"


async def check_debounce_hands_lanes_on_and_replays(open_store: StoreFactory) -> None:
    """A skipped lane head hands its lane on; the later of two events of one
    key in one batch skips the earlier; a replayed batch skips nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("debounce-lane")
        await store.append(sid, [_bounce("a", lane="l"), ev(lane="l")])
        first = new_uid("bounce")
        batch = [_bounce("a", lane="l", id=first), _bounce("a", lane="l", id=new_uid("bounce"))]
        await store.append(sid, batch)
        one, two, three, four = await _rows(store, sid)
        _skipped_by(one, 3)
        _alive(two)
        _skipped_by(three, 4)
        _alive(four)
        assert indexes_of(claimed_events(await claim(store, sid))) == [2], "the lane stayed"
        await store.complete_attempt(sid, index=2, attempt=1, events=[])
        assert isinstance(await claim(store, sid), Settled), "claimed before its delay"
        clock.advance(1_000)
        replay = await store.append(sid, batch)
        assert indexes_of(replay.events) == [3, 4], replay
        _alive((await _rows(store, sid))[3])
        assert indexes_of(claimed_events(await claim(store, sid))) == [4]


async def check_debounce_applies_to_returned_events(open_store: StoreFactory) -> None:
    """A completion's debounced returned event skips the earlier alive events
    of its type and key and waits out its delay, as an append's does; the
    completed trigger is never skipped, even of the same type and key with
    its claim lapsed; a replayed completion skips nothing more."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("debounce-returned")
        await store.append(sid, [_bounce("a"), _bounce("b")])
        clock.advance(1_000)
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 2]
        clock.advance(500)
        # Under #1's live claim: #4 leaves it alone.
        await store.append(sid, [_bounce("a", type="other"), _bounce("a")])
        clock.advance(600)
        # #1's claim has lapsed (untaken): its attempt still completes it, and
        # its returned event of #1's own type and key skips #4, not #1.
        returned = [_bounce("a", id=new_uid("returned"))]
        done = await store.complete_attempt(sid, index=1, attempt=1, events=returned)
        assert done.outcome == "completed", done
        [row5] = done.events
        assert (row5.index, row5.debounce_key) == (5, "a"), row5
        assert row5.not_before_ms == T0 + 2_100 + 1_000, row5
        one, two, three, four, five = await _rows(store, sid)
        assert (one.processed_by_attempt, one.debounced_by) == (1, None), one
        _alive(two)
        _alive(three)
        _skipped_by(four, 5)
        assert five == row5, f"read {five!r}, returned {row5!r}"
        again = await store.complete_attempt(sid, index=1, attempt=1, events=returned)
        assert indexes_of(again.events) == [5], again
        _alive((await _rows(store, sid))[4])
        assert indexes_of(claimed_events(await claim(store, sid, "h2", 10_000))) == [2]
        clock.advance(400)
        assert indexes_of(claimed_events(await claim(store, sid, holder="h3"))) == [3]
        clock.advance(600)
        assert indexes_of(claimed_events(await claim(store, sid, holder="h4"))) == [5]
