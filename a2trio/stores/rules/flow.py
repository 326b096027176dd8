"""Flow limits across sessions: a handler's :class:`~a2trio.Concurrency` and
:class:`~a2trio.Throttle` (issue 33).

A row appended with a ``concurrency_key`` (resolved by the engine when the
event is appended, as its lane is) counts against its key's
``concurrency_limit``: a claim takes it only while fewer than that many rows
of the key, in any session, hold a live claim on the store's clock. A held
slot is the claim itself, so a crashed holder's slot frees when its lease
lapses, and a completion, failure, skip or renewal needs no slot bookkeeping
of its own (Redis, which cannot count across sessions in a script, keeps a
per-key set of live claims beside the rows and updates it with them).

Every backend serializes the claims of one key (the memory store and SQLite
by their one writer, Postgres by an advisory lock per key taken in key order
inside the claim's transaction, Redis by its scripts), so the count it reads
is the count it writes against. A row held back by its key waits, in index
order, without failing: the claim names its key in ``waiting`` so the caller
knows to look again once a slot frees, and its ``Busy`` answer's
``retry_at_ms`` is at latest when a slot of the key lapses.

A row appended with a ``throttle_key`` counts against its throttle: a claim
takes it only while fewer than ``throttle_limit`` attempts of the key
started (were claimed) in the last ``throttle_period_ms``, across sessions;
each claim of it records a start that counts until ``period`` after it. A
throttled row's wait has a known end (its throttle's earliest start's
expiry), which a ``Busy`` answer's ``retry_at_ms`` carries. The same key
serialization applies.

An append with a claim request may claim a concurrency-keyed row at insert
only while every alive row of its key, in any session, and every unsettled
row of the append with it fit its limit: then no row
of the key waits, so the new one overtakes none, and the count needs only the
key serialized. Postgres does (its group commit takes the keys' locks before
any session's); the memory store, SQLite and Redis leave keyed rows to
``claim_available``, one round trip later. A throttled row is never claimed
at insert: its start is recorded by the claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from .dispatch import claim_free, claimable
from .rows import Dispatch

__all__ = [
    "Keyed",
    "KeyedDispatch",
    "Selection",
    "claim_order",
    "claims_at_insert",
    "flow_retry_at",
    "flow_select",
    "has_room",
    "live_slot",
    "live_start",
]

_K = TypeVar("_K", bound="Keyed")


class Keyed(Protocol):
    """The columns of a row's concurrency key and throttle key."""

    @property
    def concurrency_key(self) -> str | None: ...
    @property
    def concurrency_limit(self) -> int | None: ...
    @property
    def throttle_key(self) -> str | None: ...
    @property
    def throttle_limit(self) -> int | None: ...


class KeyedDispatch(Dispatch, Keyed, Protocol):
    """The claim rules' columns and the row's keys."""


def has_room(limit: int | None, live: int) -> bool:
    """Whether a key with ``live`` live slots (claims of a concurrency key,
    starts in a throttle's window) takes one more under ``limit`` (None: the
    row has no such key, always room)."""
    return limit is None or live < limit


def live_slot(row: Dispatch, now_ms: int) -> bool:
    """Whether ``row`` holds a slot of its concurrency key now: alive and
    under a live claim (a claimed row heads its lane)."""
    return (
        row.processed_at_ms is None
        and row.failed_at_ms is None
        and not claim_free(row.claim_expires_at_ms, now_ms)
    )


def live_start(expires_at_ms: int, now_ms: int) -> bool:
    """Whether a recorded attempt start still counts against its throttle:
    it expires ``period`` after the start (a start expiring exactly now
    counts no more)."""
    return expires_at_ms > now_ms


def claims_at_insert(row: KeyedDispatch, now_ms: int) -> bool:
    """Whether an append with a claim request writes ``row`` claimed, on a
    store that claims no keyed row at insert: claimable, and no concurrency
    or throttle key (see the module docstring)."""
    return row.concurrency_key is None and row.throttle_key is None and claimable(row, now_ms)


class Selection(NamedTuple):
    """What a claim takes (:func:`flow_select`): the rows, and the keys that
    held rows back: ``waiting`` (full concurrency keys, freed when a slot
    ends) and ``throttled`` (throttles whose window is full), each sorted."""

    chosen: list[Any]
    waiting: list[str]
    throttled: list[str]


def claim_order(priority: int | None, index: int) -> tuple[int, int]:
    """The order a claim considers its candidates in: higher ``priority``
    first (None is 0), then index order. Lanes still hold: only a lane's
    head is a candidate."""
    return (-(priority or 0), index)


def flow_select(
    candidates: Iterable[_K],
    live: Mapping[str, int],
    started: Mapping[str, int],
    limit: int | None,
) -> Selection:
    """What a claim takes of ``candidates`` (the claimable rows not
    excluded, in :func:`claim_order`), given each concurrency key's ``live`` claims
    and each throttle key's ``started`` attempts in its window, across the
    store. Each keyed row takes the next slot of each of its keys, in that
    order (so a later row never overtakes an earlier one of its key); it
    fits when that slot is within each key's limit. The first ``limit``
    fitting rows are taken."""
    rank_c: dict[str, int] = {}
    rank_t: dict[str, int] = {}
    fitting: list[_K] = []
    waiting: set[str] = set()
    throttled: set[str] = set()
    for row in candidates:
        fits = True
        key = row.concurrency_key
        if key is not None:
            rank_c[key] = rank_c.get(key, 0) + 1
            if not has_room(row.concurrency_limit, live.get(key, 0) + rank_c[key] - 1):
                waiting.add(key)
                fits = False
        throttle = row.throttle_key
        if throttle is not None:
            rank_t[throttle] = rank_t.get(throttle, 0) + 1
            if not has_room(row.throttle_limit, started.get(throttle, 0) + rank_t[throttle] - 1):
                throttled.add(throttle)
                fits = False
        if fits:
            fitting.append(row)
    chosen = fitting if limit is None else fitting[:limit]
    return Selection(chosen, sorted(waiting), sorted(throttled))


def flow_retry_at(busy_at_ms: int | None, slot_expiries: Sequence[int | None]) -> int | None:
    """A ``Busy`` answer's ``retry_at_ms`` with keys waiting: the earliest of
    the session's own live claims' expiry (``busy_until``), each waiting
    key's earliest live slot's expiry and each throttle's earliest start's
    expiry (when its window next has room)."""
    return min((t for t in (busy_at_ms, *slot_expiries) if t is not None), default=None)
