"""The store conformance suite: ``a2trio.stores.base`` as executable checks.

Every backend passes these checks unchanged. Each one is a plain coroutine
function over a :data:`StoreFactory`, with no pytest in sight (like trio's
``check_two_way_stream``), so a third-party store runs them with any runner::

    from a2trio.stores.conformance import CHECKS, REQUIRES, capabilities

    has = trio.run(capabilities, open_my_store)
    for check in CHECKS:
        if REQUIRES.get(check.__name__, frozenset()) <= has:
            trio.run(check, open_my_store)

``open_my_store(clock)`` is an async context manager yielding a fresh, entered
store that stamps rows with ``clock`` (a :class:`ManualClock`). A factory that
also takes ``ids=`` (an :class:`~a2trio.ids.IdSource`, passed to the store)
gains the ``ids`` capability and runs
:func:`check_generated_ids_come_from_the_id_source`; every other check calls
it with the clock alone, so a clock-only factory keeps working (that check is
skipped).

The semantics are the seed's ``store-postgres.ts``, statement by statement.
Rules the checks keep, so that one database can serve them all:

* every session id carries a random suffix, so checks never see each other's
  rows (a factory may share one database between checks);
* store time moves only through :class:`ManualClock`, never by sleeping;
* live feeds and presence pushes are awaited under ``trio.fail_after(5)``,
  which covers a polling backend (sqlite polls every 25 ms) and Postgres
  ``NOTIFY`` alike.

A check fails with ``AssertionError`` naming what the store got wrong.

:data:`UNREACHABLE_CHECKS` take another factory, ``open_unreachable_store(clock)``,
yielding a store (not entered) that points at a backend that cannot be
reached (a port where nothing listens): every call raises
``A2Error(STORE_UNAVAILABLE)`` with the cause::

    for check in UNREACHABLE_CHECKS:
        trio.run(check, open_my_unreachable_store)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, cast
from uuid import uuid4

import msgspec
import trio
import trio.testing

from ..clock import Clock
from ..contract import MAX_DEPTH
from ..errors import A2Error, ErrorCode
from ..identifiers import MAX_ID_LENGTH
from ..ids import random_id
from .base import (
    AppendEvent,
    AppendResult,
    Busy,
    Claimed,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    EventCause,
    Feed,
    Inspection,
    OperatorActionError,
    OperatorActions,
    PresenceStore,
    RenewResult,
    Settled,
    Snapshot,
    SnapshotInfo,
    StateRead,
    Store,
    StoredEvent,
    StoredPresencePatch,
    SweepsClaimable,
)

__all__ = [
    "CHECKS",
    "REQUIRES",
    "UNREACHABLE_CHECKS",
    "CapabilityMissing",
    "ManualClock",
    "StoreFactory",
    "capabilities",
    "raises",
    "refused",
]

#: Yields a fresh, entered store stamping rows with the given clock. "Fresh"
#: means no rows in the sessions a check creates, not an empty database. It
#: may also take ``ids=`` (an :class:`~a2trio.ids.IdSource` or ``None``, for
#: the store's default): see :func:`capabilities`.
StoreFactory = Callable[[Clock], AbstractAsyncContextManager[Store]]

#: How long a check waits for a live delivery (feed row, presence patch).
FEED_DEADLINE_S = 5.0

_T0 = 1_700_000_000_000

#: Deadlines for cancelled calls, from "at once" past a few round trips, so
#: that some land inside a call on every backend (sqlite commits in ~0.3 ms).
_CANCEL_DELAYS_S = (0, 1e-4, 2e-4, 3e-4, 5e-4, 8e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 8e-3)


class ManualClock:
    """A :class:`~a2trio.clock.Clock` that only moves when told to.

    Args:
      now_ms: the starting epoch milliseconds.
    """

    def __init__(self, now_ms: int = _T0) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        """Move time forward by ``ms`` (never backwards: stores may rely on it).

        Raises:
          ValueError: ``ms`` is negative.
        """
        if ms < 0:
            raise ValueError(f"`ms` must be non-negative, not {ms}")
        self._now_ms += ms

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"


class CapabilityMissing(Exception):
    """The store lacks an optional capability a check needs (see
    :data:`REQUIRES`). Runners report the check as skipped, naming it."""


async def capabilities(open_store: StoreFactory) -> frozenset[str]:
    """The optional capabilities of the factory's stores, named as in
    :data:`REQUIRES`: ``presence``, ``presence push``, ``inspect``, ``sweep``,
    ``operator``, and ``ids`` when the factory takes ``ids=`` (by its signature).

    Lets a runner skip checks before running them. Opens one store.
    """
    async with open_store(ManualClock()) as store:
        found = {"ids"} if _takes_ids(open_store) else set()
        if store.presence is not None:
            found.add("presence")
            if store.presence.push:
                found.add("presence push")
        if store.inspect is not None:
            found.add("inspect")
        if isinstance(store, SweepsClaimable):
            found.add("sweep")
        if isinstance(store, OperatorActions):
            found.add("operator")
        return frozenset(found)


def _takes_ids(open_store: StoreFactory) -> bool:
    """Whether the factory's signature accepts ``open_store(clock, ids=...)``."""
    try:
        inspect.signature(open_store).bind(ManualClock(), ids=random_id)
    except (TypeError, ValueError):
        return False
    return True


@contextmanager
def raises(code: ErrorCode) -> Iterator[None]:
    """Assert that the block raises ``A2Error`` with ``code``."""
    try:
        yield
    except A2Error as exc:
        if exc.code is not code:
            raise AssertionError(f"expected A2Error({code}), got A2Error({exc.code})") from exc
    else:
        raise AssertionError(f"expected A2Error({code}), nothing was raised")


def _sid(name: str) -> str:
    return f"conformance-{name}-{uuid4().hex[:8]}"


def _uid(name: str) -> str:
    return f"{name}-{uuid4().hex[:12]}"


def _ev(
    type: str = "note",
    payload: Any = None,
    *,
    id: str | None = None,
    cause: EventCause | None = None,
    lane: str | None = None,
    settled: bool = False,
) -> AppendEvent:
    return AppendEvent(type, payload, id=id, cause=cause, lane=lane, settled=settled)


def _claimed(result: ClaimResult) -> list[StoredEvent]:
    assert isinstance(result, Claimed), f"expected Claimed, got {result!r}"
    return result.events


def _indexes(events: Sequence[StoredEvent]) -> list[int]:
    return [e.index for e in events]


async def _claim(store: Store, sid: str, holder: str = "h1", ttl_ms: int = 1_000) -> ClaimResult:
    return await store.claim_available(sid, holder=holder, ttl_ms=ttl_ms)


async def _append_n(store: Store, sid: str, n: int, **kw: Any) -> AppendResult:
    return await store.append(sid, [_ev(payload={"n": i}, **kw) for i in range(n)])


async def _unchanged(store: Store, sid: str, before: list[StoredEvent]) -> None:
    after = await store.read(sid)
    assert after == before, f"a rejected call changed session {sid!r}: {before!r} -> {after!r}"


class _Recorder:
    """A presence subscriber that records patches and wakes a waiting check."""

    def __init__(self) -> None:
        self.patches: list[StoredPresencePatch] = []
        self._grew = trio.Event()

    def __call__(self, patch: StoredPresencePatch) -> None:
        self.patches.append(patch)
        self._grew.set()

    async def wait_for(self, count: int, what: str) -> None:
        """Wait until ``count`` patches arrived (push delivery may lag ``set``)."""
        try:
            with trio.fail_after(FEED_DEADLINE_S):
                while len(self.patches) < count:
                    self._grew = trio.Event()
                    await self._grew.wait()
        except trio.TooSlowError:
            raise AssertionError(f"{what}: not delivered within {FEED_DEADLINE_S} s") from None


def _presence(store: Store) -> PresenceStore:
    if store.presence is None:
        raise CapabilityMissing("presence")
    return store.presence


def _inspect(store: Store) -> Inspection:
    if store.inspect is None:
        raise CapabilityMissing("inspect")
    return store.inspect


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


# -- append -------------------------------------------------------------------


async def check_append_assigns_contiguous_indexes(open_store: StoreFactory) -> None:
    """Indexes run from 1 per session; generated ids are distinct; rows are fresh."""
    clock = ManualClock()
    async with open_store(clock) as store:
        a, b = _sid("idx-a"), _sid("idx-b")
        first = await store.append(a, [_ev("x", {"i": 1}), _ev("y", {"i": 2})])
        only_b = await store.append(b, [_ev("x", {"i": 3})])
        clock.advance(10)
        second = await store.append(a, [_ev("z", {"i": 4}), _ev("z", {"i": 5})])
        assert _indexes(first.events) == [1, 2]
        assert _indexes(only_b.events) == [1]
        assert _indexes(second.events) == [3, 4]
        assert first.has_pending
        assert second.has_pending
        assert only_b.has_pending
        ids = [e.id for e in first.events + only_b.events + second.events]
        assert all(ids), f"empty generated ids: {ids}"
        assert len(set(ids)) == len(ids), f"generated ids not unique: {ids}"
        row = first.events[0]
        assert row == StoredEvent(
            id=row.id, type="x", payload={"i": 1}, index=1, session_id=a, created_at_ms=_T0
        ), f"a fresh row carries bookkeeping: {row!r}"
        assert second.events[0].created_at_ms == _T0 + 10
        stored = await store.read(a)
        assert stored == first.events + second.events
        assert await store.read(b) == only_b.events


async def check_append_supplied_ids_are_unique_across_the_store(open_store: StoreFactory) -> None:
    """A supplied id stored in another session is a collision, not a replay."""
    async with open_store(ManualClock()) as store:
        a, b = _sid("foreign-a"), _sid("foreign-b")
        taken = _uid("e")
        appended = await store.append(a, [_ev(id=taken)])
        assert appended.events[0].id == taken
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(b, [_ev(id=taken)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(b, [_ev(id=taken), _ev(id=_uid("fresh"))])
        assert await store.read(b) == []
        await _unchanged(store, a, appended.events)


async def check_generated_ids_come_from_the_id_source(open_store: StoreFactory) -> None:
    """Every id the store generates comes from its ``ids`` source: one call
    per event appended without an id, in batch order, and none otherwise
    (supplied ids, replays, empty batches, completions), so a deterministic
    source makes the store's ids deterministic."""
    if not _takes_ids(open_store):
        raise CapabilityMissing("ids")
    ids = _CountingIds()
    open_with_ids = cast(Callable[..., AbstractAsyncContextManager[Store]], open_store)
    async with open_with_ids(ManualClock(), ids=ids) as store:
        sid, other = _sid("ids"), _sid("ids-claim")
        fresh = await store.append(sid, [_ev("a"), _ev("b")])
        assert [e.id for e in fresh.events] == ids.given, (
            f"generated ids {[e.id for e in fresh.events]} are not the source's {ids.given}"
        )
        supplied = _uid("supplied")
        mixed = await store.append(sid, [_ev("c", id=supplied), _ev("d")])
        assert [e.id for e in mixed.events] == [supplied, ids.given[2]], (
            f"a mixed batch got {[e.id for e in mixed.events]}; the source gave {ids.given}"
        )
        await store.append(sid, [_ev("c", id=supplied)])
        await store.append(sid, [])
        assert len(ids.given) == 3, f"a replay or an empty batch drew ids: {ids.given}"
        stored = [e.id for e in await store.read(sid)]
        assert stored == [ids.given[0], ids.given[1], supplied, ids.given[2]], stored

        appended = await store.append(other, [_ev("job")], claim=ClaimRequest("h1", 1_000))
        [job] = appended.claimed
        assert job.id == ids.given[3], f"an append with a claim got {job.id!r}: {ids.given}"
        returned = _uid("returned")
        completed = await store.complete_attempt(
            other, index=job.index, attempt=job.attempt_count, events=[_ev("r", id=returned)]
        )
        assert completed.outcome == "completed", completed
        assert [e.id for e in completed.events] == [returned]
        assert len(ids.given) == 4, f"a completion drew ids: {ids.given}"


async def check_append_replays_a_stored_batch(open_store: StoreFactory) -> None:
    """A batch whose ids all exist returns the stored rows and writes nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("replay")
        x, y = _uid("x"), _uid("y")
        batch = [_ev("a", {"v": 1}, id=x), _ev("b", {"v": 2}, id=y)]
        original = await store.append(sid, batch)
        clock.advance(500)
        again = await store.append(sid, batch)
        assert again.events == original.events, "replay must return the stored rows"
        assert again.has_pending
        reversed_subset = await store.append(sid, [batch[1], batch[0]])
        assert [e.id for e in reversed_subset.events] == [y, x], "replay keeps the batch's order"
        # The replayed payload is ignored: the id names the stored event.
        different_payload = await store.append(sid, [_ev("a", {"v": 99}, id=x)])
        assert different_payload.events == [original.events[0]]
        await _unchanged(store, sid, original.events)

        settled_sid = _sid("replay-settled")
        z = _uid("z")
        settled = await store.append(settled_sid, [_ev("s", id=z, settled=True)])
        assert not settled.has_pending
        replayed = await store.append(settled_sid, [_ev("s", id=z, settled=True)])
        assert replayed.events == settled.events
        assert not replayed.has_pending, "replay reports the session's pending state"


async def check_append_rejects_partial_duplicates(open_store: StoreFactory) -> None:
    """Mixed, repeated and retyped ids are PARTIAL_DUPLICATE_BATCH; nothing is written."""
    async with open_store(ManualClock()) as store:
        sid = _sid("partial")
        x = _uid("x")
        stored = (await store.append(sid, [_ev("a", id=x)])).events
        fresh = _uid("fresh")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("a", id=x), _ev("a", id=fresh)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("a", id=fresh), _ev("a", id=x)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("a", id=x), _ev("a")])
        twice = _uid("twice")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("a", id=twice), _ev("a", id=twice)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("a", id=x), _ev("a", id=x)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev("retyped", id=x)])
        await _unchanged(store, sid, stored)
        # None of the rejected fresh ids was written: they append now, at index 2.
        later = await store.append(sid, [_ev("a", id=fresh), _ev("a", id=twice)])
        assert [(e.id, e.index) for e in later.events] == [(fresh, 2), (twice, 3)]


async def check_append_empty_batch_reports_pending(open_store: StoreFactory) -> None:
    """An empty batch writes nothing and says whether unprocessed events exist."""
    async with open_store(ManualClock()) as store:
        sid = _sid("empty")
        assert await store.append(sid, []) == AppendResult([], False)
        await store.append(sid, [_ev("s", settled=True)])
        assert await store.append(sid, []) == AppendResult([], False)
        await store.append(sid, [_ev("p")])
        assert await store.append(sid, []) == AppendResult([], True)
        assert len(await store.read(sid)) == 2


async def check_append_stores_settled_events_processed(open_store: StoreFactory) -> None:
    """Settled events are processed on arrival: never claimable, never pending."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("settled")
        clock.advance(7)
        result = await store.append(sid, [_ev("s", {"k": 1}, settled=True)])
        row = result.events[0]
        assert row.processed_at_ms == _T0 + 7, f"settled row not processed: {row!r}"
        assert row.processed_by_attempt is None
        assert row.attempt_count == 0
        assert not result.has_pending
        assert await store.read(sid) == [row]
        assert await _claim(store, sid) == Settled()
        mixed = await store.append(sid, [_ev("s", settled=True), _ev("p")])
        assert mixed.has_pending
        assert mixed.events[0].processed_at_ms == _T0 + 7
        assert mixed.events[1].processed_at_ms is None
        also_settled = await store.append(sid, [_ev("s", settled=True)])
        assert also_settled.has_pending, "has_pending covers the session, not just the batch"


async def check_append_cause_fence(open_store: StoreFactory) -> None:
    """A cause must name the parent's latest attempt, parent not dead-lettered."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("fence")
        await _append_n(store, sid, 2)
        await _claim(store, sid, ttl_ms=100)
        child = await store.append(sid, [_ev("c", cause=EventCause(1, 1, batch_size=2))])
        assert child.events[0].cause == EventCause(1, 1, batch_size=2)
        assert child.events[0].index == 3
        clock.advance(100)
        reclaimed = _claimed(await _claim(store, sid, holder="h2"))
        assert [(e.index, e.attempt_count) for e in reclaimed] == [(1, 2), (2, 2), (3, 1)]
        before = await store.read(sid)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [_ev("c", cause=EventCause(1, 1))])
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [_ev("free"), _ev("c", cause=EventCause(2, 1))])
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [_ev("c", cause=EventCause(1, 3))])
        await _unchanged(store, sid, before)
        current = await store.append(sid, [_ev("c", cause=EventCause(1, 2))])
        assert current.events[0].index == 4

        failed = await store.fail_attempt(sid, index=2, attempt=2, error="boom", max_failures=1)
        assert failed.outcome == "dead_lettered"
        before = await store.read(sid)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [_ev("c", cause=EventCause(2, 2))])
        await _unchanged(store, sid, before)


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
        sid = _sid("payload")
        appended = await store.append(sid, [_ev("p", p) for p in payloads])
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
        [stored] = (await store.append(key, [_ev("limits", payload, id=event_id)])).events
        assert (stored.session_id, stored.id) == (key, event_id)
        [read] = await store.read(key)
        assert (read.session_id, read.id, read.payload) == (key, event_id, payload)
        [live] = await _receive(feed, 1)
        assert (live.id, live.payload) == (event_id, payload)
        replayed = await store.append(key, [_ev("limits", payload, id=event_id)])
        assert [e.index for e in replayed.events] == [1], "the long id did not replay"


async def check_read_bounds(open_store: StoreFactory) -> None:
    """``read`` returns ``after_index < index <= through_index``, in order."""
    async with open_store(ManualClock()) as store:
        sid = _sid("read")
        await _append_n(store, sid, 5)
        assert _indexes(await store.read(sid)) == [1, 2, 3, 4, 5]
        assert _indexes(await store.read(sid, after_index=2)) == [3, 4, 5]
        assert _indexes(await store.read(sid, through_index=2)) == [1, 2]
        assert _indexes(await store.read(sid, after_index=1, through_index=3)) == [2, 3]
        assert _indexes(await store.read(sid, after_index=0, through_index=9)) == [1, 2, 3, 4, 5]
        assert await store.read(sid, after_index=5) == []
        assert await store.read(sid, after_index=3, through_index=3) == []
        assert await store.read(sid, after_index=4, through_index=2) == []
        assert await store.read(_sid("missing")) == []


async def check_append_with_claim(open_store: StoreFactory) -> None:
    """``append(claim=...)`` writes its claimable events claimed (attempt 1) and
    says whether other events are claimable; refused appends claim nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("append-claim")
        plain = await store.append(sid, [_ev(lane="a"), _ev(lane="a")])
        assert (plain.claimed, plain.others_claimable) == ([], False)
        assert all(r.attempt_count == 0 for r in await store.read(sid))
        clock.advance(7)
        # Claimable: the lane-less pending event; not the settled one, not the
        # one queued behind lane "a". Event 1 (lane "a"'s head) is another
        # claimable event, so the caller must still claim.
        result = await store.append(
            sid, [_ev(), _ev(settled=True), _ev(lane="a")], claim=ClaimRequest("h1", 1_000)
        )
        assert _indexes(result.claimed) == [3]
        assert result.others_claimable
        [row] = result.claimed
        assert (row.attempt_count, row.claim_holder) == (1, "h1")
        assert row.claim_expires_at_ms == _T0 + 7 + 1_000
        assert row.first_claimed_at_ms == row.last_claimed_at_ms == _T0 + 7
        assert [e.index for e in result.events] == [3, 4, 5]
        assert result.events[0] == row
        assert [r for r in await store.read(sid) if r.index == 3] == [row]
        # The claimed event is live: a claim takes only the lane's head.
        assert _indexes(_claimed(await _claim(store, sid, "h2"))) == [1]
        alone = await store.append(sid, [_ev()], claim=ClaimRequest("h1", 1_000))
        assert (_indexes(alone.claimed), alone.others_claimable) == ([6], False)
        # A replay writes nothing, so it claims nothing.
        fixed = _uid("fixed")
        await store.append(sid, [_ev(id=fixed)])
        again = await store.append(sid, [_ev(id=fixed)], claim=ClaimRequest("h3", 50))
        assert again.claimed == []
        assert again.others_claimable, "the first append of `fixed` left it claimable"
        # Refused appends write and claim nothing.
        before = await store.read(sid)
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.append(sid, [_ev(id=fixed), _ev()], claim=ClaimRequest("h4", 50))
        await _unchanged(store, sid, before)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await store.append(sid, [_ev(cause=EventCause(1, 2))], claim=ClaimRequest("h5", 50))
        await _unchanged(store, sid, before)
        # An empty batch only reports.
        assert (await store.append(sid, [], claim=ClaimRequest("h6", 50))).claimed == []


async def check_append_concurrent_writers(open_store: StoreFactory) -> None:
    """Concurrent appends to one session get distinct, gapless indexes, each
    batch contiguous; the same batch appended twice at once is stored once."""
    async with open_store(ManualClock()) as store:
        sid = _sid("writers")
        results: list[AppendResult] = []

        async def writer(n: int) -> None:
            batch = [_ev("w", {"writer": n, "i": i}) for i in range(3)]
            results.append(await store.append(sid, batch))

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(writer, n)
        for result in results:
            first = result.events[0].index
            assert _indexes(result.events) == [first, first + 1, first + 2], "a batch is split"
        rows = await store.read(sid)
        assert _indexes(rows) == list(range(1, 25))
        assert sorted((r.payload["writer"], r.payload["i"]) for r in rows) == [
            (n, i) for n in range(8) for i in range(3)
        ]

        twin = [_ev("t", id=_uid("twin")), _ev("t", id=_uid("twin"))]
        twins: list[AppendResult] = []

        async def twin_writer() -> None:
            twins.append(await store.append(sid, twin))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(twin_writer)
            nursery.start_soon(twin_writer)
        assert twins[0].events == twins[1].events, "a racing replay returns the stored rows"
        assert _indexes(await store.read(sid, after_index=24)) == [25, 26]


async def check_append_expected_index(open_store: StoreFactory) -> None:
    """A conditional append commits only at its expected index (else
    ``INDEX_CONFLICT``, nothing written); a stored batch replays whatever the
    index; of conditional writers racing at one index exactly one commits."""
    async with open_store(ManualClock()) as store:
        sid = _sid("expected")
        first = await store.append(sid, [_ev("a")], expected_index=0)
        assert _indexes(first.events) == [1]
        for stale in (0, 5):
            refused: A2Error | None = None
            try:
                await store.append(sid, [_ev("b")], expected_index=stale)
            except A2Error as exc:
                refused = exc
            assert refused is not None, f"an append expecting index {stale} at 1 committed"
            assert refused.code is ErrorCode.INDEX_CONFLICT, f"got {refused.code}"
            assert refused.details == {"expected": stale, "index": 1}, refused.details
        await _unchanged(store, sid, first.events)
        x = _uid("x")
        batch = [_ev("c", {"k": 0}, id=x), _ev("c", {"k": 1}, id=_uid("y"))]
        written = await store.append(sid, batch, expected_index=1)
        assert _indexes(written.events) == [2, 3]
        replayed = await store.append(sid, batch, expected_index=1)
        assert replayed.events == written.events, "a stored batch replays at any index"

        results: list[int] = []
        codes: list[ErrorCode] = []

        async def racer(n: int) -> None:
            try:
                result = await store.append(sid, [_ev("r", {"n": n})], expected_index=3)
            except A2Error as exc:
                codes.append(exc.code)
            else:
                results.append(result.events[0].index)

        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(racer, n)
        assert results == [4], f"racing conditional appends committed at {results}"
        assert codes == [ErrorCode.INDEX_CONFLICT] * 5, codes
        assert _indexes(await store.read(sid)) == [1, 2, 3, 4]


async def check_find_event(open_store: StoreFactory) -> None:
    """``find_event`` returns the stored row of an id in its session, and None
    for an unknown id or one stored in another session."""
    async with open_store(ManualClock()) as store:
        sid, other = _sid("find"), _sid("find-other")
        a, b = _uid("a"), _uid("b")
        await store.append(sid, [_ev("x"), _ev("found", {"v": [1, "two"]}, id=a)])
        await store.append(other, [_ev("y", id=b)])
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
        assert await store.find_event(sid, _uid("missing")) is None


async def check_trace_context_is_stored_with_the_event(open_store: StoreFactory) -> None:
    """An event's ``trace_context`` comes back, exactly, from every read: the
    append's rows (claimed at insert or not), a claim, ``read``, ``find_event``
    and a completion's returned events; a replay keeps the stored one."""
    traced = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    other = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",' + (
        '"tracestate":"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}'
    )
    async with open_store(ManualClock()) as store:
        sid = _sid("trace")
        fixed = _uid("traced")
        plain = await store.append(
            sid,
            [
                msgspec.structs.replace(_ev(id=fixed, lane="a"), trace_context=traced),
                _ev(lane="a"),
                msgspec.structs.replace(_ev(settled=True), trace_context=other),
            ],
        )
        assert [e.trace_context for e in plain.events] == [traced, None, other]
        assert [e.trace_context for e in await store.read(sid)] == [traced, None, other]
        found = await store.find_event(sid, fixed)
        assert found is not None, "a stored id was not found"
        assert found.trace_context == traced, found
        [claimed] = _claimed(await _claim(store, sid))
        assert (claimed.index, claimed.trace_context) == (1, traced)
        replayed = await store.append(
            sid, [msgspec.structs.replace(_ev(id=fixed, lane="a"), trace_context=other)]
        )
        assert [e.trace_context for e in replayed.events] == [traced], "a replay rewrote it"
        returned = _uid("returned")
        done = await store.complete_attempt(
            sid,
            index=1,
            attempt=1,
            events=[msgspec.structs.replace(_ev("r", id=returned), trace_context=other)],
        )
        assert [e.trace_context for e in done.events] == [other]
        assert (await store.read(sid))[-1].trace_context == other
        at_insert = await store.append(
            sid,
            [msgspec.structs.replace(_ev(), trace_context=traced)],
            claim=ClaimRequest("h2", 1_000),
        )
        [row] = at_insert.claimed
        assert row.trace_context == traced
        assert (await store.read(sid))[-1] == row


async def check_cancelled_calls_commit_all_or_nothing(open_store: StoreFactory) -> None:
    """An append or completion cancelled at any point either committed or did
    not, and retrying it with the same ids is safe."""
    async with open_store(ManualClock()) as store:
        sid = _sid("cancel")
        batches = [[_ev("c", {"b": b, "i": i}, id=_uid("c")) for i in range(3)] for b in range(12)]
        for delay, batch in zip(_CANCEL_DELAYS_S, batches, strict=True):
            with trio.move_on_after(delay):
                await store.append(sid, batch)
            retried = await store.append(sid, batch)
            assert [e.id for e in retried.events] == [e.id for e in batch]
        rows = await store.read(sid)
        assert _indexes(rows) == list(range(1, 37))
        assert [r.id for r in rows] == [e.id for batch in batches for e in batch]

        claimed = _claimed(await _claim(store, sid, ttl_ms=60_000))
        for delay, parent in zip(_CANCEL_DELAYS_S, claimed[:12], strict=True):
            returned = [_ev("r", {"of": parent.index}, id=_uid("r")) for _ in range(2)]
            with trio.move_on_after(delay):
                await store.complete_attempt(sid, index=parent.index, attempt=1, events=returned)
            done = await store.complete_attempt(sid, index=parent.index, attempt=1, events=returned)
            assert done.outcome == "completed"
            assert [e.id for e in done.events] == [e.id for e in returned]
        rows = await store.read(sid)
        assert _indexes(rows) == list(range(1, 37 + 24))
        assert all(r.processed_by_attempt == 1 for r in rows[:12])
        children = [r.cause.index for r in rows[36:] if r.cause is not None]
        assert children == [i for i in range(1, 13) for _ in range(2)]


async def check_aclose_is_idempotent(open_store: StoreFactory) -> None:
    """``aclose`` may be called twice, and before the factory leaves the store."""
    async with open_store(ManualClock()) as store:
        await _append_n(store, _sid("aclose"), 1)
        await store.aclose()
        await store.aclose()


async def check_aclose_inside_the_block_ends_only_the_stores_tasks(
    open_store: StoreFactory,
) -> None:
    """``aclose`` inside ``async with store`` (as the factory enters it), under
    a cancel scope and a feed of the block's own, never cancels the block: the
    code after it runs, and each later call raises ``STORE_UNAVAILABLE`` or
    works (a store that reopens on use), never anything else."""
    ran_on = False
    async with open_store(ManualClock()) as store:
        sid = _sid("early-close")
        await _append_n(store, sid, 1)
        with trio.fail_after(FEED_DEADLINE_S):
            async with store.stream(sid) as feed:
                assert _indexes(await _receive(feed, 1)) == [1]
                await store.aclose()
                await trio.lowlevel.checkpoint()
        for call in (
            lambda: store.read(sid),
            lambda: store.append(sid, [_ev("after close")]),
            lambda: store.claim_available(sid, holder="h", ttl_ms=1_000),
        ):
            try:
                await call()
            except A2Error as exc:
                if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                    raise AssertionError(f"after aclose: {exc!r}") from exc
        await store.aclose()
        ran_on = True
    assert ran_on, "aclose cancelled the block that entered the store"


# -- claims -------------------------------------------------------------------


async def check_claim_available(open_store: StoreFactory) -> None:
    """Claims every eligible event in order; live claims block, expired ones re-claim."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("claim")
        assert await _claim(store, sid) == Settled()
        await _append_n(store, sid, 3)
        clock.advance(5)
        first = _claimed(await _claim(store, sid, "h1", ttl_ms=1_000))
        assert _indexes(first) == [1, 2, 3]
        for row in first:
            assert row.attempt_count == 1
            assert row.claim_holder == "h1"
            assert row.claim_expires_at_ms == _T0 + 5 + 1_000
            assert row.first_claimed_at_ms == row.last_claimed_at_ms == _T0 + 5
        assert await store.read(sid) == first, "the claim is stored as returned"
        assert await _claim(store, sid, "h2") == Busy(_T0 + 5 + 1_000)
        clock.advance(999)
        assert await _claim(store, sid, "h2") == Busy(_T0 + 5 + 1_000)
        clock.advance(1)
        # A claim lapses exactly at its expiry.
        second = _claimed(await _claim(store, sid, "h2", ttl_ms=300))
        assert _indexes(second) == [1, 2, 3]
        for row in second:
            assert row.attempt_count == 2
            assert row.claim_holder == "h2"
            assert row.claim_expires_at_ms == _T0 + 1_005 + 300
            assert row.first_claimed_at_ms == _T0 + 5
            assert row.last_claimed_at_ms == _T0 + 1_005
        for index in (1, 2, 3):
            done = await store.complete_attempt(sid, index=index, attempt=2, events=[])
            assert done.outcome == "completed"
        assert await _claim(store, sid) == Settled()
        assert not (await store.append(sid, [])).has_pending


async def check_claim_limit(open_store: StoreFactory) -> None:
    """``limit`` claims at most that many, lowest indexes first; the rest stay
    claimable, and exclusions do not count against it."""
    async with open_store(ManualClock()) as store:
        sid = _sid("claim-limit")
        await _append_n(store, sid, 5)
        first = _claimed(await store.claim_available(sid, holder="h", ttl_ms=1_000, limit=2))
        assert _indexes(first) == [1, 2]
        rest = await store.claim_available(sid, holder="h", ttl_ms=1_000, exclude=[3], limit=1)
        assert _indexes(_claimed(rest)) == [4]
        assert _indexes(_claimed(await _claim(store, sid))) == [3, 5]


async def check_claim_concurrent_holders(open_store: StoreFactory) -> None:
    """Holders claiming at once never share an event."""
    async with open_store(ManualClock()) as store:
        sid = _sid("holders")
        await _append_n(store, sid, 12)
        won: dict[str, list[int]] = {}

        async def holder(name: str) -> None:
            result = await _claim(store, sid, name, ttl_ms=60_000)
            won[name] = _indexes(result.events) if isinstance(result, Claimed) else []

        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(holder, f"h{n}")
        claimed = sorted(i for indexes in won.values() for i in indexes)
        assert claimed == list(range(1, 13)), f"claims overlap or miss: {won}"
        rows = await store.read(sid)
        assert all(r.attempt_count == 1 for r in rows)
        assert {r.index: r.claim_holder for r in rows} == {
            i: name for name, indexes in won.items() for i in indexes
        }


async def check_claim_exclude_and_busy(open_store: StoreFactory) -> None:
    """``exclude`` skips indexes; an explicit expiry wins; Busy names the earliest."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("busy")
        await _append_n(store, sid, 3)
        one = _claimed(
            await store.claim_available(
                sid, holder="h1", ttl_ms=10, expires_at_ms=_T0 + 5_000, exclude=[2, 3]
            )
        )
        assert _indexes(one) == [1]
        assert one[0].claim_expires_at_ms == _T0 + 5_000
        two = _claimed(await store.claim_available(sid, holder="h2", ttl_ms=2_000, exclude=[3]))
        assert _indexes(two) == [2]
        assert two[0].claim_expires_at_ms == _T0 + 2_000
        # Index 3 is free but excluded, and excluded events never make a store Busy.
        assert await store.claim_available(sid, holder="h3", ttl_ms=1, exclude=[3]) == Busy(
            _T0 + 2_000
        )
        three = _claimed(await _claim(store, sid, "h3", ttl_ms=9_000))
        assert _indexes(three) == [3]
        assert await _claim(store, sid, "h4") == Busy(_T0 + 2_000)
        clock.advance(2_000)
        again = _claimed(await _claim(store, sid, "h4"))
        assert [(e.index, e.attempt_count) for e in again] == [(2, 2)]
        assert await _claim(store, sid, "h5") == Busy(_T0 + 3_000)

        idle = _sid("busy-excluded")
        await _append_n(store, idle, 1)
        assert await store.claim_available(idle, holder="h", ttl_ms=1, exclude=[1]) == Settled()


async def check_claim_lanes(open_store: StoreFactory) -> None:
    """Only a lane's oldest unprocessed event is claimable; completion hands on."""
    async with open_store(ManualClock()) as store:
        sid = _sid("lanes")
        await store.append(
            sid,
            [
                _ev("a", lane="x"),
                _ev("b", lane="x"),
                _ev("c", lane="y"),
                _ev("d"),
                _ev("s", lane="x", settled=True),
                _ev("e", lane="x"),
            ],
        )
        assert _indexes(_claimed(await _claim(store, sid))) == [1, 3, 4]
        assert (await store.complete_attempt(sid, index=1, attempt=1, events=[])).outcome == (
            "completed"
        )
        # The settled event 5 is processed, so it never holds the lane.
        assert _indexes(_claimed(await _claim(store, sid))) == [2]
        failed = await store.fail_attempt(sid, index=2, attempt=1, error="e", max_failures=5)
        assert failed.outcome == "failed"
        retried = _claimed(await _claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retried] == [(2, 2)]
        await store.complete_attempt(sid, index=2, attempt=2, events=[])
        assert _indexes(_claimed(await _claim(store, sid))) == [6]

        # A lane whose head completed is ready for a later append at once.
        await store.complete_attempt(sid, index=6, attempt=1, events=[])
        late = await store.append(sid, [_ev("f", lane="x")])
        assert _indexes(_claimed(await _claim(store, sid))) == [late.events[0].index]


async def check_claim_lane_hand_off_to_returned_events(open_store: StoreFactory) -> None:
    """A returned event in the parent's lane waits behind older lane events."""
    async with open_store(ManualClock()) as store:
        alone, queued = _sid("hand-alone"), _sid("hand-queued")
        await store.append(alone, [_ev("a", lane="x")])
        _claimed(await _claim(store, alone))
        child = _uid("child")
        done = await store.complete_attempt(
            alone, index=1, attempt=1, events=[_ev("c", id=child, lane="x")]
        )
        assert _indexes(done.events) == [2]
        assert _indexes(_claimed(await _claim(store, alone))) == [2]

        await store.append(queued, [_ev("a", lane="x"), _ev("b", lane="x")])
        _claimed(await _claim(store, queued))
        await store.complete_attempt(
            queued, index=1, attempt=1, events=[_ev("c", id=_uid("child"), lane="x")]
        )
        assert _indexes(_claimed(await _claim(store, queued))) == [2]
        await store.complete_attempt(queued, index=2, attempt=1, events=[])
        assert _indexes(_claimed(await _claim(store, queued))) == [3]


async def check_claim_dead_letters_block_their_lane(open_store: StoreFactory) -> None:
    """A dead letter is never claimable and stalls the rest of its lane."""
    async with open_store(ManualClock()) as store:
        sid = _sid("dead-lane")
        await store.append(sid, [_ev("a", lane="z"), _ev("b", lane="z"), _ev("free")])
        assert _indexes(_claimed(await _claim(store, sid))) == [1, 3]
        dead = await store.fail_attempt(sid, index=1, attempt=1, error="e", max_failures=1)
        assert dead.outcome == "dead_lettered"
        await store.complete_attempt(sid, index=3, attempt=1, events=[])
        assert await _claim(store, sid) == Settled()
        assert (await store.append(sid, [])).has_pending, "a stalled lane is still pending"


async def check_claimable_sessions(open_store: StoreFactory) -> None:
    """The sweep finds exactly the sessions a claim would take work from now:
    pending, claims expired, failures past their backoff; not live claims,
    processed or dead-lettered sessions, nor another prefix's."""
    clock = ManualClock()
    async with open_store(clock) as store:
        if not isinstance(store, SweepsClaimable):
            raise CapabilityMissing("sweep")
        prefix = f"sweep-{uuid4().hex[:8]}\x1f"
        pending, claimed, done, failed, dead = (prefix + n for n in "abcde")
        for key in (pending, claimed, done, failed, dead, f"other-{prefix}a"):
            await store.append(key, [_ev("work")])
        await store.append(done, [_ev("settled", settled=True)])
        _claimed(await _claim(store, claimed, ttl_ms=10_000))
        _claimed(await _claim(store, done))
        await store.complete_attempt(done, index=1, attempt=1, events=[])
        _claimed(await _claim(store, failed))
        await store.fail_attempt(failed, index=1, attempt=1, error="boom", max_failures=10)
        _claimed(await _claim(store, dead))
        await store.fail_attempt(dead, index=1, attempt=1, error="boom", max_failures=1)
        sweep = await store.claimable_sessions(prefix, limit=10)
        assert sweep == [pending], f"at once: {sweep!r}"
        clock.advance(1_000)  # the first failure's backoff has passed
        assert await store.claimable_sessions(prefix, limit=10) == [pending, failed]
        clock.advance(9_000)  # and the live claim has expired
        assert await store.claimable_sessions(prefix, limit=10) == [pending, claimed, failed]
        assert await store.claimable_sessions(prefix, limit=2) == [pending, claimed]
        _claimed(await _claim(store, failed))
        await store.fail_attempt(failed, index=1, attempt=2, error="boom", max_failures=10)
        clock.advance(1_000)  # the second failure waits 2 s
        assert failed not in await store.claimable_sessions(prefix, limit=10)
        clock.advance(1_000)
        assert failed in await store.claimable_sessions(prefix, limit=10)


async def check_renew_claims(open_store: StoreFactory) -> None:
    """Live claims of this holder renew; newer attempts supersede; expired ones neither."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("renew")
        await _append_n(store, sid, 4)
        _claimed(await _claim(store, sid, "h1", ttl_ms=1_000))
        assert await store.renew_claims(sid, holder="h1", claims=[], ttl_ms=1) == RenewResult(
            [], []
        )
        clock.advance(500)
        renewed = await store.renew_claims(
            sid,
            holder="h1",
            claims=[ClaimRef(2, 1), ClaimRef(1, 1), ClaimRef(99, 1)],
            ttl_ms=1_000,
        )
        assert renewed == RenewResult([1, 2], [])
        explicit = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(4, 1)], ttl_ms=1, expires_at_ms=_T0 + 9_000
        )
        assert explicit == RenewResult([4], [])
        wrong_holder = await store.renew_claims(
            sid, holder="h2", claims=[ClaimRef(3, 1)], ttl_ms=1_000
        )
        assert wrong_holder == RenewResult([], [])
        wrong_attempt = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(3, 0)], ttl_ms=1_000
        )
        assert wrong_attempt == RenewResult([], [3])
        rows = await store.read(sid)
        assert [r.claim_expires_at_ms for r in rows] == [
            _T0 + 1_500,
            _T0 + 1_500,
            _T0 + 1_000,
            _T0 + 9_000,
        ]
        clock.advance(500)
        # Claim 3 lapsed at exactly its expiry and nobody re-claimed it.
        lapsed = await store.renew_claims(sid, holder="h1", claims=[ClaimRef(3, 1)], ttl_ms=1_000)
        assert lapsed == RenewResult([], [])
        assert _indexes(_claimed(await _claim(store, sid, "h2"))) == [3]
        superseded = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(3, 1), ClaimRef(1, 1)], ttl_ms=1_000
        )
        assert superseded == RenewResult([1], [3])
        await store.complete_attempt(sid, index=1, attempt=1, events=[])
        processed = await store.renew_claims(
            sid, holder="h1", claims=[ClaimRef(1, 1)], ttl_ms=1_000
        )
        assert processed == RenewResult([], [])
        rows = await store.read(sid)
        assert rows[0].claim_expires_at_ms is None
        assert rows[2].claim_holder == "h2"
        assert rows[2].attempt_count == 2


# -- complete and fail --------------------------------------------------------


async def check_complete_attempt(open_store: StoreFactory) -> None:
    """Completion marks the parent and appends returned events after the frontier."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("complete")
        await _append_n(store, sid, 2)
        _claimed(await _claim(store, sid))
        await store.append(sid, [_ev("later")])
        clock.advance(40)
        r1, r2 = _uid("r1"), _uid("r2")
        returned = [
            _ev("out", {"k": [1, "é"]}, id=r1),
            _ev("quiet", id=r2, settled=True),
        ]
        done = await store.complete_attempt(sid, index=1, attempt=1, events=returned)
        assert done.outcome == "completed"
        assert [(e.id, e.index, e.type, e.payload) for e in done.events] == [
            (r1, 4, "out", {"k": [1, "é"]}),
            (r2, 5, "quiet", None),
        ]
        for row in done.events:
            assert row.cause == EventCause(1, 1), f"returned event cause: {row.cause!r}"
            assert row.created_at_ms == _T0 + 40
            assert row.session_id == sid
        assert done.events[0].processed_at_ms is None
        assert done.events[1].processed_at_ms == _T0 + 40
        rows = await store.read(sid)
        assert rows[3:] == done.events
        parent = rows[0]
        assert parent.processed_at_ms == _T0 + 40
        assert parent.processed_by_attempt == 1
        assert parent.returned_event_ids == [r1, r2]
        assert parent.claim_holder is None
        assert parent.claim_expires_at_ms is None
        assert rows[1].processed_at_ms is None, "completion touches only its event"

        clock.advance(10)
        _claimed(await _claim(store, sid))
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
        sid = _sid("complete-dup")
        ids = [_uid("a"), _uid("b")]
        await _append_n(store, sid, 3)
        _claimed(await _claim(store, sid))
        await store.complete_attempt(sid, index=1, attempt=1, events=[_ev(id=i) for i in ids])
        before = await store.read(sid)
        for other in ([_ev(id=ids[0])], [_ev(id=ids[1]), _ev(id=ids[0])], [], [_ev(id=_uid("c"))]):
            with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
                await store.complete_attempt(sid, index=1, attempt=1, events=other)
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(sid, index=2, attempt=1, events=[_ev(id=ids[0])])
        twice = _uid("twice")
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(
                sid, index=2, attempt=1, events=[_ev(id=twice), _ev(id=twice)]
            )
        foreign = _uid("foreign")
        await store.append(_sid("complete-dup-other"), [_ev(id=foreign)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(
                sid, index=3, attempt=1, events=[_ev(id=_uid("fresh")), _ev(id=foreign)]
            )
        await _unchanged(store, sid, before)
        assert before[1].processed_at_ms is None
        assert before[2].processed_at_ms is None


async def check_complete_attempt_replay_keeps_types(open_store: StoreFactory) -> None:
    """A repeat naming a stored id under another type is a collision (seed
    ``idempotentReplay``), not a replay."""
    async with open_store(ManualClock()) as store:
        sid = _sid("complete-type")
        await _append_n(store, sid, 1)
        _claimed(await _claim(store, sid))
        child = _uid("child")
        await store.complete_attempt(sid, index=1, attempt=1, events=[_ev("out", id=child)])
        with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
            await store.complete_attempt(sid, index=1, attempt=1, events=[_ev("other", id=child)])


async def check_complete_attempt_fences_zombies(open_store: StoreFactory) -> None:
    """An attempt that lost its claim completes nothing and writes nothing."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("zombie")
        await _append_n(store, sid, 3)
        unclaimed = await store.complete_attempt(sid, index=1, attempt=0, events=[])
        assert unclaimed.outcome == "superseded", "an unclaimed event cannot complete"
        _claimed(await _claim(store, sid, "h1", ttl_ms=100))
        clock.advance(100)
        _claimed(await _claim(store, sid, "h2", ttl_ms=100))
        before = await store.read(sid)
        zombie = await store.complete_attempt(sid, index=1, attempt=1, events=[_ev(id=_uid("z"))])
        assert zombie.outcome == "superseded"
        assert zombie.events == []
        await _unchanged(store, sid, before)
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
        await _unchanged(store, sid, before)


async def check_complete_attempt_drained_hint(open_store: StoreFactory) -> None:
    """``drained`` is never True while a live event is unprocessed (a store may
    always say False); dead letters and settled returns do not count."""
    async with open_store(ManualClock()) as store:
        sid = _sid("drained")
        await _append_n(store, sid, 3)
        assert _indexes(_claimed(await _claim(store, sid))) == [1, 2, 3]
        dead = await store.fail_attempt(sid, index=3, attempt=1, error="e", max_failures=1)
        assert dead.outcome == "dead_lettered"
        first = await store.complete_attempt(sid, index=1, attempt=1, events=[])
        assert not first.drained, "event 2 is still unprocessed"
        second = await store.complete_attempt(sid, index=2, attempt=1, events=[_ev(id=_uid("r"))])
        assert not second.drained, "the returned event is unprocessed"
        [returned] = _claimed(await _claim(store, sid))
        settled_reply = _ev("reply", id=_uid("s"), settled=True)
        last = await store.complete_attempt(
            sid, index=returned.index, attempt=1, events=[settled_reply]
        )
        if last.drained:
            rows = await store.read(sid)
            live = [r.index for r in rows if r.processed_at_ms is None and r.failed_at_ms is None]
            assert live == [], f"drained while {live} are unprocessed"
        assert await _claim(store, sid) == Settled()


async def check_fail_attempt(open_store: StoreFactory) -> None:
    """Failures release the claim, count, repeat idempotently and dead-letter at the limit."""
    clock = ManualClock()
    async with open_store(clock) as store:
        sid = _sid("fail")
        await _append_n(store, sid, 2)
        _claimed(await _claim(store, sid))
        clock.advance(3)
        first = await store.fail_attempt(sid, index=1, attempt=1, error="boom 1", max_failures=3)
        assert (first.outcome, first.failure_count) == ("failed", 1)
        row = (await store.read(sid))[0]
        assert row.claim_holder is None
        assert row.claim_expires_at_ms is None
        assert row.failure_count == 1
        assert row.failed_at_ms is None
        assert row.last_error == "boom 1"
        assert row.last_failed_at_ms == _T0 + 3
        assert row.last_failed_attempt == 1
        repeat = await store.fail_attempt(sid, index=1, attempt=1, error="boom 1", max_failures=3)
        assert (repeat.outcome, repeat.failure_count) == ("failed", 1)
        assert (await store.read(sid))[0] == row, "a repeated failure changes nothing"

        retry = _claimed(await _claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retry] == [(1, 2)], "released at once"
        stale = await store.fail_attempt(sid, index=1, attempt=1, error="old", max_failures=3)
        assert (stale.outcome, stale.failure_count) == ("superseded", 1)
        second = await store.fail_attempt(sid, index=1, attempt=2, error="boom 2", max_failures=3)
        assert (second.outcome, second.failure_count) == ("failed", 2)
        _claimed(await _claim(store, sid))
        clock.advance(4)
        third = await store.fail_attempt(sid, index=1, attempt=3, error="boom 3", max_failures=3)
        assert (third.outcome, third.failure_count) == ("dead_lettered", 3)
        dead = (await store.read(sid))[0]
        assert dead.failed_at_ms == _T0 + 7
        assert dead.last_error == "boom 3"
        assert dead.processed_at_ms is None
        assert dead.claim_holder is None
        again = await store.fail_attempt(sid, index=1, attempt=3, error="x", max_failures=3)
        assert (again.outcome, again.failure_count) == ("dead_lettered", 3)
        older = await store.fail_attempt(sid, index=1, attempt=2, error="x", max_failures=3)
        assert older.outcome == "superseded"
        assert (await store.read(sid))[0] == dead
        assert await _claim(store, sid) == Busy(_T0 + 1_000), "only event 2's claim is live"

        await store.complete_attempt(sid, index=2, attempt=1, events=[])
        done = await store.fail_attempt(sid, index=2, attempt=1, error="x", max_failures=3)
        assert (done.outcome, done.failure_count) == ("superseded", 0)


# -- snapshots ----------------------------------------------------------------


async def check_snapshots(open_store: StoreFactory) -> None:
    """read_state splits at the snapshot; put_snapshot never moves backwards."""
    async with open_store(ManualClock()) as store:
        sid = _sid("snap")
        appended = (await _append_n(store, sid, 4)).events
        empty = await store.read_state(sid, "r")
        assert empty.snapshot is None
        assert [(e.id, e.index, e.payload) for e in empty.events] == [
            (e.id, e.index, e.payload) for e in appended
        ]
        state = {"count": 2, "names": ["å", None], "ratio": 0.5}
        await store.put_snapshot(sid, "r", 2, state)
        after = await store.read_state(sid, "r")
        assert after.snapshot == Snapshot(2, state)
        assert _indexes(after.events) == [3, 4]
        assert [e.type for e in after.events] == ["note", "note"]
        await store.put_snapshot(sid, "r", 1, {"older": True})
        await store.put_snapshot(sid, "r", 2, {"same index": True})
        assert (await store.read_state(sid, "r")).snapshot == Snapshot(2, state)
        await store.put_snapshot(sid, "r", 4, {"count": 4})
        newest = await store.read_state(sid, "r")
        assert newest == StateRead(Snapshot(4, {"count": 4}), [])
        assert (await store.read_state(sid, "other")).snapshot is None
        assert (await store.read_state(_sid("missing"), "r")) == StateRead(None, [])


async def check_read_states(open_store: StoreFactory) -> None:
    """read_states aligns with the requested ids; missing sessions read empty."""
    async with open_store(ManualClock()) as store:
        a, b, missing = _sid("states-a"), _sid("states-b"), _sid("states-missing")
        await _append_n(store, a, 3)
        await _append_n(store, b, 2)
        await store.put_snapshot(b, "r", 1, [1])
        await store.put_snapshot(a, "elsewhere", 3, "x")
        reads = await store.read_states([b, missing, a], "r")
        assert len(reads) == 3
        assert reads[0].snapshot == Snapshot(1, [1])
        assert _indexes(reads[0].events) == [2]
        assert reads[1] == StateRead(None, [])
        assert reads[2].snapshot is None
        assert _indexes(reads[2].events) == [1, 2, 3]
        assert all(e.session_id == a for e in reads[2].events)
        assert await store.read_states([], "r") == []


# -- streams ------------------------------------------------------------------


async def _receive(feed: Feed[StoredEvent], n: int) -> list[StoredEvent]:
    got: list[StoredEvent] = []
    try:
        with trio.fail_after(FEED_DEADLINE_S):
            for _ in range(n):
                got.append(await feed.receive())
    except trio.TooSlowError:
        raise AssertionError(f"feed delivered {_indexes(got)}, expected {n} rows") from None
    return got


async def check_stream_catches_up_then_follows(open_store: StoreFactory) -> None:
    """A feed yields rows after ``start_after``, then later appends and returned events."""
    async with open_store(ManualClock()) as store:
        sid, other = _sid("stream"), _sid("stream-other")
        await _append_n(store, sid, 3)
        async with store.stream(sid, start_after=1) as feed:
            assert _indexes(await _receive(feed, 2)) == [2, 3]
            await store.append(other, [_ev("elsewhere")])
            await store.append(sid, [_ev("live", {"n": 4})])
            live = await _receive(feed, 1)
            assert [(e.index, e.type, e.payload) for e in live] == [(4, "live", {"n": 4})]
            _claimed(await _claim(store, sid))
            child = _uid("child")
            await store.complete_attempt(sid, index=2, attempt=1, events=[_ev("out", id=child)])
            returned = await _receive(feed, 1)
            assert [(e.index, e.id, e.cause) for e in returned] == [(5, child, EventCause(2, 1))]
        async with store.stream(sid, start_after=5) as tail:
            await store.append(sid, [_ev("after")])
            assert _indexes(await _receive(tail, 1)) == [6]


async def check_stream_concurrent_feeds(open_store: StoreFactory) -> None:
    """Two feeds on one session each see every row once, in order."""
    async with open_store(ManualClock()) as store:
        sid = _sid("stream-two")
        await _append_n(store, sid, 1)
        seen: dict[str, list[int]] = {"a": [], "b": []}

        async def follow(name: str, start_after: int) -> None:
            async with store.stream(sid, start_after=start_after) as feed:
                seen[name] = _indexes(await _receive(feed, 4 - start_after))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "a", 0)
            nursery.start_soon(follow, "b", 2)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(3):
                await store.append(sid, [_ev("x")])
        assert seen == {"a": [1, 2, 3, 4], "b": [3, 4]}


async def check_stream_close_stops_the_feed(open_store: StoreFactory) -> None:
    """Leaving the feed's block stops it promptly, even with rows undelivered."""
    async with open_store(ManualClock()) as store:
        sid = _sid("stream-close")
        # More rows than any reasonable buffer, so the pump is blocked when we leave.
        await store.append(sid, [_ev("x", i) for i in range(300)])
        with trio.fail_after(FEED_DEADLINE_S):
            async with store.stream(sid) as feed:
                assert _indexes(await _receive(feed, 1)) == [1]
        with trio.fail_after(FEED_DEADLINE_S):
            try:
                await feed.receive()
            except Exception:
                pass
            else:
                raise AssertionError("a closed feed still delivered a row")
        assert len((await store.append(sid, [_ev("after close")])).events) == 1


# -- presence -----------------------------------------------------------------


async def check_presence_last_writer_wins(open_store: StoreFactory) -> None:
    """Field-wise LWW on ``at_ms``: older writes lose, ties go to the incoming write."""
    async with open_store(ManualClock()) as store:
        presence = _presence(store)
        sid = _sid("lww")

        async def put(values: dict[str, Any], at_ms: int) -> StoredPresencePatch | None:
            return await presence.set(sid, "p1", values, seen=at_ms, at_ms=at_ms, ttl_ms=60_000)

        async def fields() -> dict[str, Any]:
            return {r.field: r.value for r in await presence.read(sid)}

        assert await put({}, 1) is None
        first = await put({"a": 1, "b": {"x": [1, 2]}}, 100)
        assert first == StoredPresencePatch("p1", {"a": 1, "b": {"x": [1, 2]}}, 100, 100)
        assert await put({"a": 9}, 50) is None
        assert await fields() == {"a": 1, "b": {"x": [1, 2]}}
        tie = await put({"a": 3, "b": "é"}, 100)
        assert tie == StoredPresencePatch("p1", {"a": 3, "b": "é"}, 100, 100)
        await put({"a": 7}, 200)
        partial = await put({"a": 8, "b": 8}, 150)
        assert partial == StoredPresencePatch("p1", {"b": 8}, 150, 150)
        assert await fields() == {"a": 7, "b": 8}
        rows = {r.field: (r.seen, r.at_ms) for r in await presence.read(sid)}
        assert rows == {"a": (200, 200), "b": (150, 150)}

        cleared = await put({"b": None}, 300)
        assert cleared == StoredPresencePatch("p1", {"b": None}, 300, 300)
        assert await fields() == {"a": 7}
        assert await put({"a": None}, 199) is None, "an older clear loses to a newer value"
        assert await fields() == {"a": 7}
        assert await put({"a": None}, 200) is not None, "a clear at the same at applies"
        assert await presence.read(sid) == []


async def check_presence_expiry_and_order(open_store: StoreFactory) -> None:
    """Rows expire exactly ``ttl_ms`` after the write on the store clock; reads sort."""
    clock = ManualClock()
    async with open_store(clock) as store:
        presence = _presence(store)
        sid = _sid("presence-ttl")
        # `at_ms` orders writes; it never anchors expiry.
        await presence.set(sid, "bob", {"z": 1, "a": 2}, seen=4, at_ms=5, ttl_ms=1_000)
        clock.advance(100)
        await presence.set(sid, "alice", {"m": True}, seen=9, at_ms=6, ttl_ms=1_000)
        rows = await presence.read(sid)
        assert [(r.participant, r.field) for r in rows] == [
            ("alice", "m"),
            ("bob", "a"),
            ("bob", "z"),
        ]
        assert [(r.value, r.seen, r.at_ms, r.expires_at_ms) for r in rows] == [
            (True, 9, 6, _T0 + 1_100),
            (2, 4, 5, _T0 + 1_000),
            (1, 4, 5, _T0 + 1_000),
        ]
        assert await presence.read(_sid("presence-other")) == []
        clock.advance(899)
        assert len(await presence.read(sid)) == 3
        clock.advance(1)
        assert [(r.participant, r.field) for r in await presence.read(sid)] == [("alice", "m")]
        clock.advance(100)
        assert await presence.read(sid) == []


async def check_presence_subscribe(open_store: StoreFactory) -> None:
    """Push-tier stores deliver applied patches to subscribers until unsubscribed."""
    async with open_store(ManualClock()) as store:
        presence = _presence(store)
        if not presence.push:
            raise CapabilityMissing("presence push")
        sid, other = _sid("presence-sub"), _sid("presence-sub-other")
        gone, stays = _Recorder(), _Recorder()
        unsubscribe_gone = presence.subscribe(sid, gone)
        unsubscribe_stays = presence.subscribe(sid, stays)
        try:
            await presence.set(other, "p", {"f": 0}, seen=1, at_ms=1, ttl_ms=60_000)
            patch = await presence.set(sid, "p", {"f": 1}, seen=1, at_ms=10, ttl_ms=60_000)
            assert patch is not None
            await gone.wait_for(1, "a pushed patch")
            await stays.wait_for(1, "a pushed patch")
            assert gone.patches == [patch], "only this session's applied patch is pushed"
            assert stays.patches == [patch]
            assert await presence.set(sid, "p", {"f": 2}, seen=1, at_ms=5, ttl_ms=60_000) is None
            unsubscribe_gone()
            last = await presence.set(sid, "p", {"f": 3}, seen=2, at_ms=20, ttl_ms=60_000)
            # Patches arrive in order, so once `stays` has the last one, `gone`
            # would have had it too.
            await stays.wait_for(2, "the second patch")
            assert stays.patches == [patch, last], "an unapplied write is never pushed"
            assert gone.patches == [patch], "an unsubscribed listener still received patches"
        finally:
            unsubscribe_stays()


# -- inspection ---------------------------------------------------------------


async def check_inspect_list_sessions(open_store: StoreFactory) -> None:
    """Sessions by prefix, ordered by id, paged by cursor, with their counters."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        prefix = _sid("insp") + "/"
        a, b, c = prefix + "a", prefix + "b", prefix + "c"
        await _append_n(store, c, 1)
        await _append_n(store, a, 4)
        clock.advance(10)
        await _append_n(store, b, 2)
        await _append_n(store, prefix.rstrip("/") + "-outside", 1)
        _claimed(await _claim(store, a, ttl_ms=100))
        clock.advance(20)
        await store.fail_attempt(a, index=1, attempt=1, error="e", max_failures=1)
        clock.advance(5)
        await store.complete_attempt(a, index=2, attempt=1, events=[])
        clock.advance(100)
        _claimed(await _claim(store, a))
        clock.advance(15)
        await store.fail_attempt(a, index=3, attempt=2, error="e", max_failures=5)

        page = await inspect.list_sessions(prefix=prefix, limit=2)
        assert [s.session_id for s in page.sessions] == [a, b]
        assert page.cursor == b
        rest = await inspect.list_sessions(prefix=prefix, limit=2, cursor=page.cursor)
        assert [s.session_id for s in rest.sessions] == [c]
        assert rest.cursor is None
        exact = await inspect.list_sessions(prefix=prefix, limit=3)
        assert len(exact.sessions) == 3
        assert exact.cursor is None
        summary = page.sessions[0]
        assert (summary.event_count, summary.pending_count, summary.failed_count) == (4, 2, 1)
        # Events 1-2 were claimed once, 3-4 twice; 1 dead-lettered, 3 failed once.
        assert (summary.attempt_count, summary.failure_count) == (6, 2), f"counters: {summary!r}"
        assert summary.first_event_at_ms == _T0
        assert summary.updated_at_ms == _T0 + 150, "the latest of every row's timestamps"
        assert page.sessions[1].updated_at_ms == _T0 + 10
        assert page.sessions[1].pending_count == 2
        assert (await inspect.list_sessions(prefix=prefix + "zz", limit=5)).sessions == []


async def check_inspect_read_events_and_snapshots(open_store: StoreFactory) -> None:
    """Event pages stop at min(through_index, frontier); snapshots list by reducer."""
    clock = ManualClock()
    async with open_store(clock) as store:
        inspect = _inspect(store)
        sid = _sid("insp-events")
        await _append_n(store, sid, 5)
        page = await inspect.read_events(sid, after_index=1, limit=2)
        assert _indexes(page.events) == [2, 3]
        assert page.through_index == 5
        bounded = await inspect.read_events(sid, after_index=2, limit=10, through_index=4)
        assert _indexes(bounded.events) == [3, 4]
        assert bounded.through_index == 4
        beyond = await inspect.read_events(sid, after_index=0, limit=10, through_index=99)
        assert _indexes(beyond.events) == [1, 2, 3, 4, 5]
        assert beyond.through_index == 5
        assert await store.read(sid) == beyond.events
        missing = await inspect.read_events(_sid("insp-none"), after_index=0, limit=10)
        assert missing.events == []
        assert missing.through_index == 0

        await store.put_snapshot(sid, "zeta", 2, 1)
        clock.advance(50)
        await store.put_snapshot(sid, "alpha", 3, 2)
        clock.advance(50)
        await store.put_snapshot(sid, "zeta", 1, "ignored")
        assert await inspect.list_snapshots(sid) == [
            SnapshotInfo("alpha", 3, _T0 + 50),
            SnapshotInfo("zeta", 2, _T0),
        ]
        await store.put_snapshot(sid, "zeta", 5, "moved")
        assert (await inspect.list_snapshots(sid))[1] == SnapshotInfo("zeta", 5, _T0 + 100)
        assert await inspect.list_snapshots(_sid("insp-none")) == []


# -- operator actions -----------------------------------------------------------


def _operator(store: Store) -> OperatorActions:
    if not isinstance(store, OperatorActions):
        raise CapabilityMissing("operator")
    return store


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
        sid = _sid("redrive")
        await store.append(sid, [_ev("a", lane="z"), _ev("b", lane="z")])
        _claimed(await _claim(store, sid))
        await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=1)
        before = await store.read(sid)
        with refused("no_event"):
            await ops.redrive(sid, 3, by="op", reason="r")
        with refused("not_dead_lettered"):
            await ops.redrive(sid, 2, by="op", reason="r")
        await _unchanged(store, sid, before)
        clock.advance(5)
        action = await ops.redrive(sid, 1, by="alice", reason="fixed the bug")
        assert (action.action, action.session_id, action.index) == ("redrive", sid, 1)
        assert (action.by, action.reason, action.at_ms) == ("alice", "fixed the bug", _T0 + 5)
        row = (await store.read(sid))[0]
        assert (row.failure_count, row.failed_at_ms, row.processed_at_ms) == (0, None, None)
        assert row.last_error == "boom", "the error history stays"
        with refused("not_dead_lettered"):
            await ops.redrive(sid, 1, by="op", reason="twice")
        retry = _claimed(await _claim(store, sid))
        assert [(e.index, e.attempt_count) for e in retry] == [(1, 2)], "claimable at once"
        await store.complete_attempt(sid, index=1, attempt=2, events=[])
        assert _indexes(_claimed(await _claim(store, sid))) == [2], "the lane moved on"
        actions = await ops.read_actions(sid, after_index=0, through_index=2)
        assert actions == [action], actions


async def check_operator_skip(open_store: StoreFactory) -> None:
    """A skip marks an unprocessed event processed by no attempt and hands
    its lane on; a live claim refuses it, and the zombie of an expired one
    is superseded."""
    clock = ManualClock()
    async with open_store(clock) as store:
        ops = _operator(store)
        sid = _sid("skip")
        await store.append(sid, [_ev("a", lane="z"), _ev("b", lane="z"), _ev("c")])
        assert _indexes(_claimed(await _claim(store, sid))) == [1, 3]
        before = await store.read(sid)
        with refused("claimed"):
            await ops.skip(sid, 1, by="op", reason="r")
        with refused("no_event"):
            await ops.skip(sid, 4, by="op", reason="r")
        await _unchanged(store, sid, before)
        clock.advance(1_000)  # the claims lapsed
        skipped = await ops.skip(sid, 1, by="bob", reason="poison")
        assert (skipped.action, skipped.index, skipped.by) == ("skip", 1, "bob")
        row = (await store.read(sid))[0]
        assert row.processed_at_ms == _T0 + 1_000
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
        claimed = _claimed(await _claim(store, sid))
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
        sid = _sid("retry-now")
        with refused("nothing_to_retry"):
            await ops.retry_now(sid, by="op", reason="r")
        await store.append(sid, [_ev("a"), _ev("b"), _ev("c", lane="z"), _ev("d", lane="z")])
        _claimed(await _claim(store, sid))
        with refused("claimed"):
            await ops.retry_now(sid, by="op", reason="r")
        await store.fail_attempt(sid, index=1, attempt=1, error="boom", max_failures=10)
        await store.fail_attempt(sid, index=2, attempt=1, error="boom", max_failures=1)
        before = await store.read(sid)
        clock.advance(1)
        actions = await ops.retry_now(sid, by="carol", reason="deployed a fix")
        assert [(a.action, a.index, a.by, a.at_ms) for a in actions] == [
            ("retry_now", 1, "carol", _T0 + 1)
        ], "the failed event, in its backoff; not the dead letter nor the live claim"
        await _unchanged(store, sid, before)
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
            await _append_n(store, key, 3)
            _claimed(await _claim(store, key))
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


# -- an unreachable backend ---------------------------------------------------

#: How long one call to an unreachable backend may take to fail (a refused
#: connection fails at once; this covers a loaded machine).
UNREACHABLE_DEADLINE_S = 20.0


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """Assert that the block raises ``A2Error(STORE_UNAVAILABLE)`` with the
    driver's failure as ``__cause__``: never the bare driver error, nor an
    exception group holding it."""
    try:
        with trio.fail_after(UNREACHABLE_DEADLINE_S):
            yield
    except A2Error as exc:
        if exc.code is not ErrorCode.STORE_UNAVAILABLE:
            raise AssertionError(f"{what}: expected STORE_UNAVAILABLE, got {exc!r}") from exc
        if exc.__cause__ is None:
            raise AssertionError(f"{what}: STORE_UNAVAILABLE without its cause") from exc
    except trio.TooSlowError:
        raise AssertionError(f"{what}: still waiting after {UNREACHABLE_DEADLINE_S} s") from None
    except Exception as exc:
        raise AssertionError(f"{what}: raised {exc!r}, not A2Error(STORE_UNAVAILABLE)") from exc
    else:
        raise AssertionError(f"{what}: worked against an unreachable backend")


async def check_every_call_fails_unavailable_when_unreachable(
    open_unreachable_store: StoreFactory,
) -> None:
    """Every public call on a store whose backend cannot be reached (the
    factory's stores point where nothing answers) raises
    ``A2Error(STORE_UNAVAILABLE)`` with the cause, cancelled or not: outside
    ``async with store`` (each call on a connection of its own), then inside,
    where the store's own tasks fail too and none of their failures escapes,
    the block's exit and ``aclose`` included.

    The factory is not the one of :data:`CHECKS`: it yields a store it has
    not entered (see :data:`UNREACHABLE_CHECKS`).
    """
    async with open_unreachable_store(ManualClock()) as store:
        await _every_call_unavailable(store)
        async with store:
            await _every_call_unavailable(store)
            # Let the store's own tasks (listeners, subscribers) meet the outage.
            await trio.testing.wait_all_tasks_blocked()
        await store.aclose()


async def _every_call_unavailable(store: Store) -> None:
    """Each public call: plainly (``STORE_UNAVAILABLE``), then cancelled at
    a few points (cancelled, or ``STORE_UNAVAILABLE``)."""
    for what, call in _every_call(store):
        with _unavailable(what):
            await call()
        for delay in _CANCEL_DELAYS_S[:6]:
            with _unavailable_or_waiting(f"{what}, cancelled after {delay} s"):
                with trio.move_on_after(delay):
                    await call()
    # A feed may ride out an outage (it retries its reads), but whatever it
    # raises, at its first read or when left, is STORE_UNAVAILABLE.
    with _unavailable_or_waiting("stream"):
        async with store.stream(_sid("unreachable")) as feed:
            with trio.move_on_after(FEED_DEADLINE_S / 5):
                await feed.receive()


def _every_call(store: Store) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    """The store's public calls (its optional capabilities' included), each
    on a new session."""
    sid = _sid("unreachable")
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("append", lambda: store.append(sid, [_ev()])),
        ("append with a claim", lambda: store.append(sid, [_ev()], claim=ClaimRequest("h", 1))),
        ("find_event", lambda: store.find_event(sid, "e")),
        ("read", lambda: store.read(sid)),
        ("claim_available", lambda: store.claim_available(sid, holder="h", ttl_ms=1_000)),
        (
            "renew_claims",
            lambda: store.renew_claims(sid, holder="h", claims=[ClaimRef(1, 1)], ttl_ms=1_000),
        ),
        (
            "complete_attempt",
            lambda: store.complete_attempt(sid, index=1, attempt=1, events=[_ev(id=_uid("r"))]),
        ),
        (
            "fail_attempt",
            lambda: store.fail_attempt(sid, index=1, attempt=1, error="e", max_failures=3),
        ),
        ("read_state", lambda: store.read_state(sid, "r")),
        ("read_states", lambda: store.read_states([sid, _sid("unreachable")], "r")),
        ("put_snapshot", lambda: store.put_snapshot(sid, "r", 1, {"n": 1})),
    ]
    if isinstance(store, SweepsClaimable):
        sweeps = store
        calls.append(("claimable_sessions", lambda: sweeps.claimable_sessions("c", limit=10)))
    if isinstance(store, OperatorActions):
        ops = store
        calls += [
            ("dead_letters", lambda: ops.dead_letters("c", limit=10)),
            ("redrive", lambda: ops.redrive(sid, 1, by="op", reason="r")),
            ("skip", lambda: ops.skip(sid, 1, by="op", reason="r")),
            ("retry_now", lambda: ops.retry_now(sid, by="op", reason="r")),
            ("read_actions", lambda: ops.read_actions(sid, after_index=0, through_index=9)),
        ]
    presence = store.presence
    if presence is not None:
        calls += [
            (
                "presence.set",
                lambda: presence.set(sid, "p", {"f": 1}, seen=1, at_ms=1, ttl_ms=1_000),
            ),
            ("presence.read", lambda: presence.read(sid)),
        ]
    inspection = store.inspect
    if inspection is not None:
        calls += [
            ("inspect.list_sessions", lambda: inspection.list_sessions(prefix="c", limit=10)),
            (
                "inspect.read_events",
                lambda: inspection.read_events(sid, after_index=0, limit=10),
            ),
            ("inspect.list_snapshots", lambda: inspection.list_snapshots(sid)),
        ]
    return calls


@contextmanager
def _unavailable_or_waiting(what: str) -> Iterator[None]:
    """Like :func:`_unavailable`, but a block that ends without raising passes."""
    try:
        with trio.fail_after(UNREACHABLE_DEADLINE_S):
            yield
    except A2Error as exc:
        if exc.code is not ErrorCode.STORE_UNAVAILABLE or exc.__cause__ is None:
            raise AssertionError(f"{what}: expected STORE_UNAVAILABLE with a cause") from exc
    except trio.TooSlowError:
        raise AssertionError(f"{what}: still waiting after {UNREACHABLE_DEADLINE_S} s") from None
    except Exception as exc:
        raise AssertionError(f"{what}: raised {exc!r}, not A2Error(STORE_UNAVAILABLE)") from exc


CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_append_assigns_contiguous_indexes,
    check_append_supplied_ids_are_unique_across_the_store,
    check_generated_ids_come_from_the_id_source,
    check_append_replays_a_stored_batch,
    check_append_rejects_partial_duplicates,
    check_append_empty_batch_reports_pending,
    check_append_stores_settled_events_processed,
    check_append_cause_fence,
    check_append_payload_round_trip,
    check_identifiers_and_values_at_the_limits,
    check_append_with_claim,
    check_append_concurrent_writers,
    check_append_expected_index,
    check_find_event,
    check_trace_context_is_stored_with_the_event,
    check_cancelled_calls_commit_all_or_nothing,
    check_aclose_is_idempotent,
    check_aclose_inside_the_block_ends_only_the_stores_tasks,
    check_read_bounds,
    check_claim_available,
    check_claim_limit,
    check_claim_concurrent_holders,
    check_claim_exclude_and_busy,
    check_claim_lanes,
    check_claim_lane_hand_off_to_returned_events,
    check_claim_dead_letters_block_their_lane,
    check_claimable_sessions,
    check_renew_claims,
    check_complete_attempt,
    check_complete_attempt_rejects_a_different_batch,
    check_complete_attempt_replay_keeps_types,
    check_complete_attempt_fences_zombies,
    check_complete_attempt_drained_hint,
    check_fail_attempt,
    check_snapshots,
    check_read_states,
    check_stream_catches_up_then_follows,
    check_stream_concurrent_feeds,
    check_stream_close_stops_the_feed,
    check_presence_last_writer_wins,
    check_presence_expiry_and_order,
    check_presence_subscribe,
    check_inspect_list_sessions,
    check_inspect_read_events_and_snapshots,
    check_operator_redrive,
    check_operator_skip,
    check_operator_retry_now,
    check_operator_dead_letters,
]
"""Every check, in the order of ``base.py``'s obligations."""

UNREACHABLE_CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_every_call_fails_unavailable_when_unreachable,
]
"""The checks run with another factory, ``open_unreachable_store(clock)``: it
yields a fresh store, not entered, whose backend cannot be reached (a port
where nothing listens, a path that cannot be opened), and closes it on exit.
A store without a backend to lose (memory) has none."""

#: The optional capabilities each check needs, by check name. A check run on a
#: store without them raises :class:`CapabilityMissing`.
REQUIRES: dict[str, frozenset[str]] = {
    check_presence_last_writer_wins.__name__: frozenset({"presence"}),
    check_presence_expiry_and_order.__name__: frozenset({"presence"}),
    check_presence_subscribe.__name__: frozenset({"presence", "presence push"}),
    check_inspect_list_sessions.__name__: frozenset({"inspect"}),
    check_inspect_read_events_and_snapshots.__name__: frozenset({"inspect"}),
    check_claimable_sessions.__name__: frozenset({"sweep"}),
    check_generated_ids_come_from_the_id_source.__name__: frozenset({"ids"}),
    check_operator_redrive.__name__: frozenset({"operator"}),
    check_operator_skip.__name__: frozenset({"operator"}),
    check_operator_retry_now.__name__: frozenset({"operator"}),
    check_operator_dead_letters.__name__: frozenset({"operator"}),
}
