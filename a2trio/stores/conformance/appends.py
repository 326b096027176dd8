"""Append and read: indexes, ids (supplied, generated, replayed, colliding),
settled events, the cause fence, payloads and identifiers kept exactly, a claim
at insert, concurrent and conditional writers, ``read``, ``find_event`` and the
trace context."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, cast
from uuid import uuid4

import msgspec
import trio

from ...contract import MAX_DEPTH
from ...errors import A2Error, ErrorCode
from ...identifiers import MAX_ID_LENGTH
from ..base import AppendResult, ClaimRequest, EventCause, Settled, Store, StoredEvent
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
    new_uid,
    raises,
    receive,
    takes_ids,
    unchanged,
)

__all__ = [
    "check_append_assigns_contiguous_indexes",
    "check_append_cause_fence",
    "check_append_concurrent_writers",
    "check_append_empty_batch_reports_pending",
    "check_append_expected_index",
    "check_append_payload_round_trip",
    "check_append_rejects_partial_duplicates",
    "check_append_replays_a_stored_batch",
    "check_append_stores_settled_events_processed",
    "check_append_supplied_ids_are_unique_across_the_store",
    "check_append_with_claim",
    "check_find_event",
    "check_generated_ids_come_from_the_id_source",
    "check_identifiers_and_values_at_the_limits",
    "check_read_bounds",
    "check_trace_context_is_stored_with_the_event",
]


class _CountingIds:
    """An :class:`~a2trio.ids.IdSource` handing out ``gen-<run>-1``,
    ``gen-<run>-2``, ... and recording them (``<run>`` keeps checks that share
    one database apart)."""

    def __init__(self) -> None:
        self._run = uuid4().hex[:8]
        self.given: list[str] = []

    def __call__(self) -> str:
        self.given.append(f"gen-{self._run}-{len(self.given) + 1}")
        return self.given[-1]


async def check_append_assigns_contiguous_indexes(open_store: StoreFactory) -> None:
    """Indexes run from 1 per session; generated ids are distinct; rows are fresh."""
    clock = ManualClock()
    async with open_store(clock) as store:
        a, b = new_sid("idx-a"), new_sid("idx-b")
        first = await store.append(a, [ev("x", {"i": 1}), ev("y", {"i": 2})])
        only_b = await store.append(b, [ev("x", {"i": 3})])
        clock.advance(10)
        second = await store.append(a, [ev("z", {"i": 4}), ev("z", {"i": 5})])
        assert indexes_of(first.events) == [1, 2]
        assert indexes_of(only_b.events) == [1]
        assert indexes_of(second.events) == [3, 4]
        assert first.has_pending
        assert second.has_pending
        assert only_b.has_pending
        ids = [e.id for e in first.events + only_b.events + second.events]
        assert all(ids), f"empty generated ids: {ids}"
        assert len(set(ids)) == len(ids), f"generated ids not unique: {ids}"
        row = first.events[0]
        assert row == StoredEvent(
            id=row.id, type="x", payload={"i": 1}, index=1, session_id=a, created_at_ms=T0
        ), f"a fresh row carries bookkeeping: {row!r}"
        assert second.events[0].created_at_ms == T0 + 10
        stored = await store.read(a)
        assert stored == first.events + second.events
        assert await store.read(b) == only_b.events


async def check_append_supplied_ids_are_unique_across_the_store(open_store: StoreFactory) -> None:
    """A supplied id stored in another session is a collision, not a replay."""
    async with open_store(ManualClock()) as store:
        a, b = new_sid("foreign-a"), new_sid("foreign-b")
        taken = new_uid("e")
        appended = await store.append(a, [ev(id=taken)])
        assert appended.events[0].id == taken
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(b, [ev(id=taken)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(b, [ev(id=taken), ev(id=new_uid("fresh"))])
        assert await store.read(b) == []
        await unchanged(store, a, appended.events)


async def check_generated_ids_come_from_the_id_source(open_store: StoreFactory) -> None:
    """Every id the store generates comes from its ``ids`` source: one call
    per event appended without an id, in batch order, and none otherwise
    (supplied ids, replays, empty batches, completions), so a deterministic
    source makes the store's ids deterministic."""
    if not takes_ids(open_store):
        raise CapabilityMissing("ids")
    ids = _CountingIds()
    open_with_ids = cast(Callable[..., AbstractAsyncContextManager[Store]], open_store)
    async with open_with_ids(ManualClock(), ids=ids) as store:
        sid, other = new_sid("ids"), new_sid("ids-claim")
        fresh = await store.append(sid, [ev("a"), ev("b")])
        assert [e.id for e in fresh.events] == ids.given, (
            f"generated ids {[e.id for e in fresh.events]} are not the source's {ids.given}"
        )
        supplied = new_uid("supplied")
        mixed = await store.append(sid, [ev("c", id=supplied), ev("d")])
        assert [e.id for e in mixed.events] == [supplied, ids.given[2]], (
            f"a mixed batch got {[e.id for e in mixed.events]}; the source gave {ids.given}"
        )
        await store.append(sid, [ev("c", id=supplied)])
        await store.append(sid, [])
        assert len(ids.given) == 3, f"a replay or an empty batch drew ids: {ids.given}"
        stored = [e.id for e in await store.read(sid)]
        assert stored == [ids.given[0], ids.given[1], supplied, ids.given[2]], stored

        appended = await store.append(other, [ev("job")], claim=ClaimRequest("h1", 1_000))
        [job] = appended.claimed
        assert job.id == ids.given[3], f"an append with a claim got {job.id!r}: {ids.given}"
        returned = new_uid("returned")
        completed = await store.complete_attempt(
            other, index=job.index, attempt=job.attempt_count, events=[ev("r", id=returned)]
        )
        assert completed.outcome == "completed", completed
        assert [e.id for e in completed.events] == [returned]
        assert len(ids.given) == 4, f"a completion drew ids: {ids.given}"


async def check_append_replays_a_stored_batch(open_store: StoreFactory) -> None:
    """A batch whose ids all exist returns the stored rows and writes nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("replay")
        x, y = new_uid("x"), new_uid("y")
        batch = [ev("a", {"v": 1}, id=x), ev("b", {"v": 2}, id=y)]
        original = await store.append(sid, batch)
        clock.advance(500)
        again = await store.append(sid, batch)
        assert again.events == original.events, "replay must return the stored rows"
        assert again.has_pending
        reversed_subset = await store.append(sid, [batch[1], batch[0]])
        assert [e.id for e in reversed_subset.events] == [y, x], "replay keeps the batch's order"
        # The replayed payload is ignored: the id names the stored event.
        different_payload = await store.append(sid, [ev("a", {"v": 99}, id=x)])
        assert different_payload.events == [original.events[0]]
        await unchanged(store, sid, original.events)

        settled_sid = new_sid("replay-settled")
        z = new_uid("z")
        settled = await store.append(settled_sid, [ev("s", id=z, settled=True)])
        assert not settled.has_pending
        replayed = await store.append(settled_sid, [ev("s", id=z, settled=True)])
        assert replayed.events == settled.events
        assert not replayed.has_pending, "replay reports the session's pending state"


async def check_append_rejects_partial_duplicates(open_store: StoreFactory) -> None:
    """Mixed, repeated and retyped ids are PARTIAL_DUPLICATE_BATCH; nothing is written."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("partial")
        x = new_uid("x")
        stored = (await store.append(sid, [ev("a", id=x)])).events
        fresh = new_uid("fresh")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("a", id=x), ev("a", id=fresh)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("a", id=fresh), ev("a", id=x)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("a", id=x), ev("a")])
        twice = new_uid("twice")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("a", id=twice), ev("a", id=twice)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("a", id=x), ev("a", id=x)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev("retyped", id=x)])
        await unchanged(store, sid, stored)
        # None of the rejected fresh ids was written: they append now, at index 2.
        later = await store.append(sid, [ev("a", id=fresh), ev("a", id=twice)])
        assert [(e.id, e.index) for e in later.events] == [(fresh, 2), (twice, 3)]


async def check_append_empty_batch_reports_pending(open_store: StoreFactory) -> None:
    """An empty batch writes nothing and says whether unprocessed events exist."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("empty")
        assert await store.append(sid, []) == AppendResult([], False)
        await store.append(sid, [ev("s", settled=True)])
        assert await store.append(sid, []) == AppendResult([], False)
        await store.append(sid, [ev("p")])
        assert await store.append(sid, []) == AppendResult([], True)
        assert len(await store.read(sid)) == 2


async def check_append_stores_settled_events_processed(open_store: StoreFactory) -> None:
    """Settled events are processed on arrival: never claimable, never pending."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("settled")
        clock.advance(7)
        result = await store.append(sid, [ev("s", {"k": 1}, settled=True)])
        row = result.events[0]
        assert row.processed_at_ms == T0 + 7, f"settled row not processed: {row!r}"
        assert row.processed_by_attempt is None
        assert row.attempt_count == 0
        assert not result.has_pending
        assert await store.read(sid) == [row]
        assert await claim(store, sid) == Settled()
        mixed = await store.append(sid, [ev("s", settled=True), ev("p")])
        assert mixed.has_pending
        assert mixed.events[0].processed_at_ms == T0 + 7
        assert mixed.events[1].processed_at_ms is None
        also_settled = await store.append(sid, [ev("s", settled=True)])
        assert also_settled.has_pending, "has_pending covers the session, not just the batch"


async def check_append_cause_fence(open_store: StoreFactory) -> None:
    """A cause must name the parent's latest attempt, parent not dead-lettered."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("fence")
        await append_n(store, sid, 2)
        await claim(store, sid, ttl_ms=100)
        child = await store.append(sid, [ev("c", cause=EventCause(1, 1, batch_size=2))])
        assert child.events[0].cause == EventCause(1, 1, batch_size=2)
        assert child.events[0].index == 3
        clock.advance(100)
        reclaimed = claimed_events(await claim(store, sid, holder="h2"))
        assert [(e.index, e.attempt_count) for e in reclaimed] == [(1, 2), (2, 2), (3, 1)]
        before = await store.read(sid)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [ev("c", cause=EventCause(1, 1))])
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [ev("free"), ev("c", cause=EventCause(2, 1))])
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [ev("c", cause=EventCause(1, 3))])
        await unchanged(store, sid, before)
        current = await store.append(sid, [ev("c", cause=EventCause(1, 2))])
        assert current.events[0].index == 4

        failed = await store.fail_attempt(sid, index=2, attempt=2, error="boom", max_failures=1)
        assert failed.outcome == "dead_lettered"
        before = await store.read(sid)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [ev("c", cause=EventCause(2, 2))])
        await unchanged(store, sid, before)


async def check_append_payload_round_trip(open_store: StoreFactory) -> None:
    """Payloads come back exactly: nesting, unicode, big ints, floats, null."""
    payloads: list[Any] = [
        {
            "nested": {"list": [1, [2, [3, {"deep": True}]]], "empty": {}, "none": []},
            "unicode": 'héllo 日本語 🎉 "quoted" back\\slash\nnewline\ttab',
            "ключ": "значение",
            "big": 2**63 - 1,
            "negative": -(2**63),
            "beyond_double": 2**53 + 1,
            "floats": [0.1, -2.5, 1.0, 123456.789],
            "zero": 0,
            "flags": [True, False],
            "null": None,
        },
        None,
        [1, "two", None, {"three": 3.5}],
        "just a string",
        42,
        -0.25,
        False,
    ]
    async with open_store(ManualClock()) as store:
        sid = new_sid("payload")
        appended = await store.append(sid, [ev("p", p) for p in payloads])
        assert [e.payload for e in appended.events] == payloads
        read = await store.read(sid)
        for payload, row in zip(payloads, read, strict=True):
            assert row.payload == payload, f"payload changed: {payload!r} -> {row.payload!r}"
            assert type(row.payload) is type(payload), f"type changed for {payload!r}"
        floats = read[0].payload["floats"]
        assert all(type(f) is float for f in floats), f"floats came back as {floats!r}"
        state = (await store.read_state(sid, "r")).events
        assert [e.payload for e in state] == payloads


async def check_identifiers_and_values_at_the_limits(open_store: StoreFactory) -> None:
    """What the engine admits is kept exactly (issue 17): session keys and event
    ids of ``MAX_ID_LENGTH`` four-byte characters (live feeds included: a
    Postgres NOTIFY carries the key), and payloads with every control character
    but NUL, in strings and keys, nested ``MAX_DEPTH - 1`` levels deep."""
    wide = "\U0001f642"  # four bytes in UTF-8
    suffix = uuid4().hex
    key = "contract\x1f" + wide * (MAX_ID_LENGTH - len(suffix)) + suffix
    event_id = wide * (MAX_ID_LENGTH - len(suffix)) + suffix
    controls = "".join(map(chr, [*range(1, 0x20), *range(0x7F, 0xA0)]))
    deep: Any = "bottom"
    for n in range(MAX_DEPTH - 2):
        deep = [deep] if n % 2 else {"k": deep}
    payload = {"text": controls, controls: "a key of controls", "deep": deep}
    async with open_store(ManualClock()) as store, store.stream(key) as feed:
        [stored] = (await store.append(key, [ev("limits", payload, id=event_id)])).events
        assert (stored.session_id, stored.id) == (key, event_id)
        [read] = await store.read(key)
        assert (read.session_id, read.id, read.payload) == (key, event_id, payload)
        [live] = await receive(feed, 1)
        assert (live.id, live.payload) == (event_id, payload)
        replayed = await store.append(key, [ev("limits", payload, id=event_id)])
        assert [e.index for e in replayed.events] == [1], "the long id did not replay"


async def check_read_bounds(open_store: StoreFactory) -> None:
    """``read`` returns ``after_index < index <= through_index``, in order."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("read")
        await append_n(store, sid, 5)
        assert indexes_of(await store.read(sid)) == [1, 2, 3, 4, 5]
        assert indexes_of(await store.read(sid, after_index=2)) == [3, 4, 5]
        assert indexes_of(await store.read(sid, through_index=2)) == [1, 2]
        assert indexes_of(await store.read(sid, after_index=1, through_index=3)) == [2, 3]
        assert indexes_of(await store.read(sid, after_index=0, through_index=9)) == [1, 2, 3, 4, 5]
        assert await store.read(sid, after_index=5) == []
        assert await store.read(sid, after_index=3, through_index=3) == []
        assert await store.read(sid, after_index=4, through_index=2) == []
        assert await store.read(new_sid("missing")) == []


async def check_append_with_claim(open_store: StoreFactory) -> None:
    """``append(claim=...)`` writes its claimable events claimed (attempt 1) and
    says whether other events are claimable; refused appends claim nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = new_sid("append-claim")
        plain = await store.append(sid, [ev(lane="a"), ev(lane="a")])
        assert (plain.claimed, plain.others_claimable) == ([], False)
        assert all(r.attempt_count == 0 for r in await store.read(sid))
        clock.advance(7)
        # Claimable: the lane-less pending event; not the settled one, not the
        # one queued behind lane "a". Event 1 (lane "a"'s head) is another
        # claimable event, so the caller must still claim.
        result = await store.append(
            sid, [ev(), ev(settled=True), ev(lane="a")], claim=ClaimRequest("h1", 1_000)
        )
        assert indexes_of(result.claimed) == [3]
        assert result.others_claimable
        [row] = result.claimed
        assert (row.attempt_count, row.claim_holder) == (1, "h1")
        assert row.claim_expires_at_ms == T0 + 7 + 1_000
        assert row.first_claimed_at_ms == row.last_claimed_at_ms == T0 + 7
        assert [e.index for e in result.events] == [3, 4, 5]
        assert result.events[0] == row
        assert [r for r in await store.read(sid) if r.index == 3] == [row]
        # The claimed event is live: a claim takes only the lane's head.
        assert indexes_of(claimed_events(await claim(store, sid, "h2"))) == [1]
        alone = await store.append(sid, [ev()], claim=ClaimRequest("h1", 1_000))
        assert (indexes_of(alone.claimed), alone.others_claimable) == ([6], False)
        # A replay writes nothing, so it claims nothing.
        fixed = new_uid("fixed")
        await store.append(sid, [ev(id=fixed)])
        again = await store.append(sid, [ev(id=fixed)], claim=ClaimRequest("h3", 50))
        assert again.claimed == []
        assert again.others_claimable, "the first append of `fixed` left it claimable"
        # Refused appends write and claim nothing.
        before = await store.read(sid)
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [ev(id=fixed), ev()], claim=ClaimRequest("h4", 50))
        await unchanged(store, sid, before)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [ev(cause=EventCause(1, 2))], claim=ClaimRequest("h5", 50))
        await unchanged(store, sid, before)
        # An empty batch only reports.
        assert (await store.append(sid, [], claim=ClaimRequest("h6", 50))).claimed == []


async def check_append_concurrent_writers(open_store: StoreFactory) -> None:
    """Concurrent appends to one session get distinct, gapless indexes, each
    batch contiguous; the same batch appended twice at once is stored once."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("writers")
        results: list[AppendResult] = []

        async def writer(n: int) -> None:
            batch = [ev("w", {"writer": n, "i": i}) for i in range(3)]
            results.append(await store.append(sid, batch))

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(writer, n)
        for result in results:
            first = result.events[0].index
            assert indexes_of(result.events) == [first, first + 1, first + 2], "a batch is split"
        rows = await store.read(sid)
        assert indexes_of(rows) == list(range(1, 25))
        assert sorted((r.payload["writer"], r.payload["i"]) for r in rows) == [
            (n, i) for n in range(8) for i in range(3)
        ]

        twin = [ev("t", id=new_uid("twin")), ev("t", id=new_uid("twin"))]
        twins: list[AppendResult] = []

        async def twin_writer() -> None:
            twins.append(await store.append(sid, twin))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(twin_writer)
            nursery.start_soon(twin_writer)
        assert twins[0].events == twins[1].events, "a racing replay returns the stored rows"
        assert indexes_of(await store.read(sid, after_index=24)) == [25, 26]


async def check_append_expected_index(open_store: StoreFactory) -> None:
    """A conditional append commits only at its expected index (else
    ``INDEX_CONFLICT``, nothing written); a stored batch replays whatever the
    index; of conditional writers racing at one index exactly one commits."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("expected")
        first = await store.append(sid, [ev("a")], expected_index=0)
        assert indexes_of(first.events) == [1]
        for stale in (0, 5):
            refused: A2Error | None = None
            try:
                await store.append(sid, [ev("b")], expected_index=stale)
            except A2Error as exc:
                refused = exc
            assert refused is not None, f"an append expecting index {stale} at 1 committed"
            assert refused.code is ErrorCode.INDEX_CONFLICT, f"got {refused.code}"
            assert refused.details == {"expected": stale, "index": 1}, refused.details
        await unchanged(store, sid, first.events)
        x = new_uid("x")
        batch = [ev("c", {"k": 0}, id=x), ev("c", {"k": 1}, id=new_uid("y"))]
        written = await store.append(sid, batch, expected_index=1)
        assert indexes_of(written.events) == [2, 3]
        replayed = await store.append(sid, batch, expected_index=1)
        assert replayed.events == written.events, "a stored batch replays at any index"

        results: list[int] = []
        codes: list[ErrorCode] = []

        async def racer(n: int) -> None:
            try:
                result = await store.append(sid, [ev("r", {"n": n})], expected_index=3)
            except A2Error as exc:
                codes.append(exc.code)
            else:
                results.append(result.events[0].index)

        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(racer, n)
        assert results == [4], f"racing conditional appends committed at {results}"
        assert codes == [ErrorCode.INDEX_CONFLICT] * 5, codes
        assert indexes_of(await store.read(sid)) == [1, 2, 3, 4]


async def check_find_event(open_store: StoreFactory) -> None:
    """``find_event`` returns the stored row of an id in its session, and None
    for an unknown id or one stored in another session."""
    async with open_store(ManualClock()) as store:
        sid, other = new_sid("find"), new_sid("find-other")
        a, b = new_uid("a"), new_uid("b")
        await store.append(sid, [ev("x"), ev("found", {"v": [1, "two"]}, id=a)])
        await store.append(other, [ev("y", id=b)])
        row = await store.find_event(sid, a)
        assert row is not None, "a stored id was not found"
        assert (row.id, row.type, row.payload, row.index, row.session_id) == (
            a,
            "found",
            {"v": [1, "two"]},
            2,
            sid,
        ), row
        assert await store.find_event(sid, b) is None, "found another session's id"
        assert await store.find_event(sid, new_uid("missing")) is None


async def check_trace_context_is_stored_with_the_event(open_store: StoreFactory) -> None:
    """An event's ``trace_context`` comes back, exactly, from every read: the
    append's rows (claimed at insert or not), a claim, ``read``, ``find_event``
    and a completion's returned events; a replay keeps the stored one."""
    traced = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    other = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",' + (
        '"tracestate":"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}'
    )
    async with open_store(ManualClock()) as store:
        sid = new_sid("trace")
        fixed = new_uid("traced")
        plain = await store.append(
            sid,
            [
                msgspec.structs.replace(ev(id=fixed, lane="a"), trace_context=traced),
                ev(lane="a"),
                msgspec.structs.replace(ev(settled=True), trace_context=other),
            ],
        )
        assert [e.trace_context for e in plain.events] == [traced, None, other]
        assert [e.trace_context for e in await store.read(sid)] == [traced, None, other]
        found = await store.find_event(sid, fixed)
        assert found is not None, "a stored id was not found"
        assert found.trace_context == traced, found
        [claimed] = claimed_events(await claim(store, sid))
        assert (claimed.index, claimed.trace_context) == (1, traced)
        replayed = await store.append(
            sid, [msgspec.structs.replace(ev(id=fixed, lane="a"), trace_context=other)]
        )
        assert [e.trace_context for e in replayed.events] == [traced], "a replay rewrote it"
        returned = new_uid("returned")
        done = await store.complete_attempt(
            sid,
            index=1,
            attempt=1,
            events=[msgspec.structs.replace(ev("r", id=returned), trace_context=other)],
        )
        assert [e.trace_context for e in done.events] == [other]
        assert (await store.read(sid))[-1].trace_context == other
        at_insert = await store.append(
            sid,
            [msgspec.structs.replace(ev(), trace_context=traced)],
            claim=ClaimRequest("h2", 1_000),
        )
        [row] = at_insert.claimed
        assert row.trace_context == traced
        assert (await store.read(sid))[-1] == row
