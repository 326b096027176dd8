"""The ``retention`` capability (issue 35): a session exported whole, erased
with everything derived from it, trimmed below a snapshot, never under a
live claim; a refusal removes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from ...errors import A2Error, ErrorCode
from ..base import Claimed, ClaimRequest, Retention, RetentionError, Store
from .kit import (
    CANCEL_DELAYS_S,
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    claim,
    claimed_events,
    ev,
    new_sid,
    new_uid,
    raises,
    receive,
    unchanged,
)

__all__ = [
    "check_retention_cancelled_removals_are_all_or_nothing",
    "check_retention_erase_is_refused_while_claimed",
    "check_retention_erase_races_a_claim",
    "check_retention_export_and_erase",
    "check_retention_trim",
    "check_retention_trim_keeps_work_and_the_last_event",
    "rejected",
]


def _retention(store: Store) -> Retention:
    if store.retention is None:
        raise CapabilityMissing("retention")
    return store.retention


@contextmanager
def rejected(reason: str) -> Iterator[None]:
    """Assert that the block raises :class:`RetentionError` for ``reason``."""
    try:
        yield
    except RetentionError as exc:
        if exc.reason != reason:
            raise AssertionError(f"expected refusal {reason!r}, got {exc.reason!r}") from exc
    else:
        raise AssertionError(f"expected refusal {reason!r}, nothing was raised")


async def _fill(store: Store, sid: str, first_id: str) -> None:
    """Events of every kind (settled, processed, dead, open), a snapshot,
    an operator action and, where the store has presence, a presence row."""
    await store.append(
        sid,
        [
            ev("a", {"n": 1}, id=first_id),
            ev("s", settled=True),
            ev("b", {"n": 2}),
            ev("c", lane="z"),
            ev("d", lane="z"),
        ],
    )
    assert [e.index for e in claimed_events(await claim(store, sid))] == [1, 3, 4]
    await store.complete_attempt(sid, index=1, attempt=1, events=[ev("r", id=new_uid("r"))])
    await store.fail_attempt(sid, index=3, attempt=1, error="boom", max_failures=1)
    await store.fail_attempt(sid, index=4, attempt=1, error="later", max_failures=1)
    await store.put_snapshot(sid, "count", 2, {"count": 2})
    if store.operator is not None:
        await store.operator.redrive(sid, 3, by="op", reason="first look")
    if store.presence is not None:
        await store.presence.set(sid, "p1", {"cursor": 3}, seen=1, at_ms=T0, ttl_ms=60_000)


async def check_retention_export_and_erase(open_store: StoreFactory) -> None:
    """An export holds the session's events with their bookkeeping, its
    snapshots and actions; an erasure removes all of it (and the presence
    rows, and the ids: appended again they are new), leaves other sessions
    alone, refuses an unexpected index and repeats as zeros."""
    clock = ManualClock()
    async with open_store(clock) as store:
        retention = _retention(store)
        sid = new_sid("erase")
        neighbour = sid + "x"  # shares the key as a prefix: must survive
        first_id = new_uid("erase-first")
        await _fill(store, sid, first_id)
        await _fill(store, neighbour, new_uid("erase-neighbour"))
        clock.advance(5_000)  # every claim lapsed
        archive = await retention.export(sid)
        stored = await store.read(sid)
        assert (archive.session_id, archive.index) == (sid, 6), archive
        assert archive.events == stored, "the export holds the rows as a read returns them"
        assert [(s.reducer_name, s.index, s.state) for s in archive.snapshots] == [
            ("count", 2, {"count": 2})
        ]
        if store.operator is not None:
            assert [(a.action, a.index, a.by) for a in archive.actions] == [("redrive", 3, "op")]
        empty = await retention.export(new_sid("never"))
        assert (empty.index, empty.events, empty.snapshots, empty.actions) == (0, [], [], [])

        with rejected("changed"):
            await retention.erase(sid, expected_index=5)
        await unchanged(store, sid, stored)
        clock.advance(1)
        erased = await retention.erase(sid, expected_index=6)
        assert (erased.session_id, erased.events, erased.snapshots, erased.at_ms) == (
            sid,
            6,
            1,
            T0 + 5_001,
        ), erased
        assert erased.actions == (1 if store.operator is not None else 0), erased
        assert erased.presence == (1 if store.presence is not None else 0), erased

        assert await store.read(sid) == []
        assert await store.find_event(sid, first_id) is None
        state = await store.read_state(sid, "count")
        assert (state.snapshot, state.events) == (None, [])
        assert not (await store.append(sid, [])).has_pending
        if store.presence is not None:
            assert await store.presence.read(sid) == []
        if store.operator is not None:
            assert await store.operator.read_actions(sid, after_index=0, through_index=9) == []
            dead = await store.operator.dead_letters(sid, limit=10)
            assert [(d.session_id, d.index) for d in dead] == [(neighbour, 4)], dead
        if store.inspect is not None:
            page = await store.inspect.list_sessions(prefix=sid, limit=10)
            assert [s.session_id for s in page.sessions] == [neighbour]
            assert await store.inspect.list_snapshots(sid) == []
        if store.sweep is not None:
            assert sid not in await store.sweep.claimable_sessions(sid, limit=10)

        again = await retention.erase(sid)
        assert (again.events, again.snapshots, again.actions, again.presence) == (0, 0, 0, 0)
        reborn = await store.append(sid, [ev("a", id=first_id)])
        assert [(e.index, e.id, e.attempt_count) for e in reborn.events] == [(1, first_id, 0)]
        assert len(await store.read(neighbour)) == 6, "the neighbour kept its events"
        assert (await store.read_state(neighbour, "count")).snapshot is not None


async def check_retention_erase_is_refused_while_claimed(open_store: StoreFactory) -> None:
    """A live claim on any of the session's events (claimed by a claim or
    at its append) refuses an erasure, removing nothing; once it lapses on
    the store's clock, the erasure goes through."""
    clock = ManualClock()
    async with open_store(clock) as store:
        retention = _retention(store)
        sid = new_sid("erase-claimed")
        await store.append(sid, [ev("a"), ev("b", lane="z"), ev("c", lane="z")])
        claimed_events(await claim(store, sid, ttl_ms=1_000))
        await store.complete_attempt(sid, index=1, attempt=1, events=[])
        before = await store.read(sid)
        with rejected("claimed"):
            await retention.erase(sid)
        await unchanged(store, sid, before)
        clock.advance(999)
        with rejected("claimed"):
            await retention.erase(sid)
        clock.advance(1)  # the claim expires exactly now: free
        assert (await retention.erase(sid)).events == 3

        other = new_sid("erase-claimed-append")
        await store.append(other, [ev("a")], claim=ClaimRequest("h2", 500))
        with rejected("claimed"):
            await retention.erase(other)
        assert len(await store.read(other)) == 1
        clock.advance(500)
        assert (await retention.erase(other)).events == 1


async def _trim_point_of(store: Store, sid: str) -> int:
    """0 when a read from the session's start is answered, else the trim
    point its ``TRIMMED`` refusal names."""
    try:
        await store.read(sid)
    except A2Error as exc:
        if exc.code is not ErrorCode.TRIMMED:
            raise
        return int(exc.details["trimmedThrough"])
    return 0


async def check_retention_trim(open_store: StoreFactory) -> None:
    """A trim removes the processed events at or below a reducer's snapshot
    (never the last one) and forgets their ids and journaled steps; a read that starts below the
    trim point raises ``TRIMMED``, one after it reads on, and the state from
    the snapshot still folds; a repeat removes nothing; refused without a
    snapshot, under a live claim, or over an unprocessed event."""
    clock = ManualClock()
    async with open_store(clock) as store:
        retention = _retention(store)
        sid = new_sid("trim")
        first_id = new_uid("trim-first")
        await store.append(
            sid,
            [
                ev("a", {"n": 1}, id=first_id, settled=True),
                ev("b", settled=True),
                ev("c"),
                ev("d", settled=True),
                ev("e", settled=True),
                ev("f"),
            ],
        )
        assert [e.index for e in claimed_events(await claim(store, sid))] == [3, 6]
        if store.journal is not None:
            await store.journal.write_step(sid, index=3, attempt=1, name="s", result=b"1")
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        await store.put_snapshot(sid, "count", 4, {"count": 4})
        before = await store.read(sid)
        with rejected("claimed"):
            await retention.trim(sid, "count")
        await unchanged(store, sid, before)
        clock.advance(1_000)  # the claim on 6 lapsed
        with rejected("no_snapshot"):
            await retention.trim(sid, "other")
        trimmed = await retention.trim(sid, "count")
        assert (trimmed.session_id, trimmed.reducer_name) == (sid, "count")
        assert (trimmed.through_index, trimmed.events, trimmed.at_ms) == (4, 4, T0 + 1_000)

        for after, through in ((None, None), (0, None), (3, None), (None, 2), (2, 5)):
            with raises(ErrorCode.TRIMMED):
                await store.read(sid, after_index=after, through_index=through)
        assert await _trim_point_of(store, sid) == 4
        assert [e.index for e in await store.read(sid, after_index=4)] == [5, 6]
        assert await store.read(sid, after_index=4) == before[4:], "the rest as it was"
        assert await store.read(sid, after_index=4, through_index=4) == []
        assert await store.read(sid, after_index=9, through_index=12) == []
        assert await store.find_event(sid, first_id) is None, "its id is forgotten"
        if store.journal is not None:
            assert await store.journal.read_journal(sid, 3) == [], "its journal went with it"

        state = await store.read_state(sid, "count")
        assert state.snapshot is not None
        assert state.snapshot.index == 4
        assert [e.index for e in state.events] == [5, 6]
        [also, fresh] = await store.read_states([sid, new_sid("trim-none")], "count")
        assert (also.snapshot, [e.index for e in also.events]) == (state.snapshot, [5, 6])
        assert (fresh.snapshot, fresh.events) == (None, [])
        with raises(ErrorCode.TRIMMED):
            await store.read_state(sid, "other")  # no snapshot: it would fold from 0
        await store.put_snapshot(sid, "low", 2, {"count": 2})
        with raises(ErrorCode.TRIMMED):
            await store.read_state(sid, "low")
        with raises(ErrorCode.TRIMMED):
            async with store.stream(sid, start_after=2) as feed:
                await receive(feed, 1)
        async with store.stream(sid, start_after=4) as feed:
            assert [e.index for e in await receive(feed, 2)] == [5, 6]

        again = await retention.trim(sid, "count")
        assert (again.through_index, again.events) == (4, 0), "a repeat removes nothing"
        lower = await retention.trim(sid, "low")
        assert (lower.through_index, lower.events) == (4, 0), "a lower point removes nothing"
        if store.inspect is not None:
            page = await store.inspect.read_events(sid, after_index=0, limit=10)
            assert ([e.index for e in page.events], page.through_index) == ([5, 6], 6)
            [summary] = (await store.inspect.list_sessions(prefix=sid, limit=10)).sessions
            assert summary.event_count == 2, summary
        reborn = await store.append(sid, [ev("a", id=first_id)])
        assert [(e.index, e.id) for e in reborn.events] == [(7, first_id)], "indexes go on"
        erased = await retention.erase(sid)
        assert erased.events == 3, erased
        assert await store.read(sid) == [], "an erased session is no longer trimmed"
        assert [e.index for e in (await store.append(sid, [ev("a")])).events] == [1]


async def check_retention_trim_keeps_work_and_the_last_event(open_store: StoreFactory) -> None:
    """A trim never removes an unprocessed event (alive or dead) at or below
    its point (refused, nothing removed) nor the session's last event (its
    point stops one short of it)."""
    clock = ManualClock()
    async with open_store(clock) as store:
        retention = _retention(store)
        sid = new_sid("trim-work")
        await store.append(sid, [ev("a"), ev("b", settled=True), ev("c", settled=True)])
        await store.put_snapshot(sid, "count", 3, {"count": 3})
        before = await store.read(sid)
        with rejected("unprocessed"):
            await retention.trim(sid, "count")
        await unchanged(store, sid, before)
        claimed_events(await claim(store, sid))
        await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=1)
        clock.advance(1)
        with rejected("unprocessed"):
            await retention.trim(sid, "count")  # a dead letter has work left too
        if store.operator is not None and store.inspect is not None:
            assert len(await store.inspect.read_failures(sid, [1])) == 1
            await store.operator.skip(sid, 1, by="op", reason="given up")
            trimmed = await retention.trim(sid, "count")
            assert (trimmed.through_index, trimmed.events) == (2, 2)
            assert await store.inspect.read_failures(sid, [1]) == [], "its failures went with it"
        last = new_sid("trim-last")
        await store.append(last, [ev("a", settled=True), ev("b", settled=True)])
        await store.put_snapshot(last, "count", 2, {"count": 2})
        trimmed = await retention.trim(last, "count")
        assert (trimmed.through_index, trimmed.events) == (1, 1)
        assert [e.index for e in await store.read(last, after_index=1)] == [2]
        state = await store.read_state(last, "count")
        assert (state.snapshot is not None, state.events) == (True, [])


async def check_retention_cancelled_removals_are_all_or_nothing(open_store: StoreFactory) -> None:
    """An erasure or a trim cancelled at any point removed everything it
    would have or nothing (never part of a session), and running it again
    finishes the job."""
    async with open_store(ManualClock()) as store:
        retention = _retention(store)
        for n, delay in enumerate(CANCEL_DELAYS_S):
            sid = new_sid(f"cancel-erase-{n}")
            ids = [new_uid("cancel-erase") for _ in range(20)]
            await store.append(sid, [ev("a", {"i": i}, id=ids[i], settled=True) for i in range(20)])
            await store.put_snapshot(sid, "count", 20, {"count": 20})
            with trio.move_on_after(delay):
                await retention.erase(sid)
            rows = await store.read(sid)
            found = [await store.find_event(sid, i) is not None for i in ids]
            snapshot = (await store.read_state(sid, "count")).snapshot
            if rows:
                assert (len(rows), all(found), snapshot is not None) == (20, True, True), delay
            else:
                assert (any(found), snapshot) == (False, None), f"half erased after {delay} s"
            await retention.erase(sid)
            assert await store.read(sid) == []

            trimmed = new_sid(f"cancel-trim-{n}")
            await store.append(trimmed, [ev("a", settled=True) for _ in range(20)])
            await store.put_snapshot(trimmed, "count", 15, {"count": 15})
            with trio.move_on_after(delay):
                await retention.trim(trimmed, "count")
            kept = await store.read(trimmed, after_index=15)
            assert [e.index for e in kept] == list(range(16, 21)), delay
            point = await _trim_point_of(store, trimmed)
            assert point in (0, 15), f"half trimmed after {delay} s: {point}"
            if point == 0:
                assert len(await store.read(trimmed)) == 20, f"half trimmed after {delay} s"
            assert (await retention.trim(trimmed, "count")).through_index == 15


async def check_retention_erase_races_a_claim(open_store: StoreFactory) -> None:
    """An erasure and a claim racing on one session: either the claim took
    the event and the erasure was refused, or the erasure went first and
    the claim found nothing; never a claimed event erased under its
    attempt."""
    async with open_store(ManualClock()) as store:
        retention = _retention(store)
        for n in range(20):
            sid = new_sid(f"erase-race-{n}")
            await store.append(sid, [ev("a"), ev("b")])
            took: list[bool] = []
            erasure: list[str] = []

            async def claimer(sid: str = sid, took: list[bool] = took) -> None:
                took.append(isinstance(await claim(store, sid, ttl_ms=60_000), Claimed))

            async def eraser(sid: str = sid, erasure: list[str] = erasure) -> None:
                try:
                    await retention.erase(sid)
                except RetentionError as exc:
                    erasure.append(exc.reason)
                else:
                    erasure.append("erased")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(claimer)
                nursery.start_soon(eraser)
            expected = ["claimed"] if took == [True] else ["erased"]
            assert erasure == expected, f"round {n}: claimed {took}, erasure {erasure}"
