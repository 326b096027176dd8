"""Flow limits across sessions: a handler's :class:`~a2trio.Concurrency` (issue 33).

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

An append never claims a keyed row at insert (:func:`claims_at_insert`): the
claim at insert writes under the session's lock only, and taking key locks
there too would order them against the group commit's session locks. A
keyed row is claimed by ``claim_available``, one round trip later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from .dispatch import claim_free, claimable
from .rows import Dispatch

__all__ = [
    "Keyed",
    "KeyedDispatch",
    "claims_at_insert",
    "flow_retry_at",
    "flow_select",
    "has_room",
    "live_slot",
]

_K = TypeVar("_K", bound="Keyed")


class Keyed(Protocol):
    """The columns of a row's concurrency key."""

    @property
    def concurrency_key(self) -> str | None: ...
    @property
    def concurrency_limit(self) -> int | None: ...


class KeyedDispatch(Dispatch, Keyed, Protocol):
    """The claim rules' columns and the row's key."""


def has_room(limit: int | None, live: int) -> bool:
    """Whether a key with ``live`` live claims takes one more under ``limit``
    (None: the row has no key, always room)."""
    return limit is None or live < limit


def live_slot(row: Dispatch, now_ms: int) -> bool:
    """Whether ``row`` holds a slot of its key now: alive and under a live
    claim (a claimed row heads its lane)."""
    return (
        row.processed_at_ms is None
        and row.failed_at_ms is None
        and not claim_free(row.claim_expires_at_ms, now_ms)
    )


def claims_at_insert(row: KeyedDispatch, now_ms: int) -> bool:
    """Whether an append with a claim request writes ``row`` claimed:
    claimable, and no concurrency key (see the module docstring)."""
    return row.concurrency_key is None and claimable(row, now_ms)


def flow_select(
    candidates: Iterable[_K], live: Mapping[str, int], limit: int | None
) -> tuple[list[_K], list[str]]:
    """What a claim takes of ``candidates`` (the claimable rows not
    excluded, in index order), given each candidate key's ``live`` claims
    across the store: every unkeyed row, and a keyed row while its key has
    room (the rows this claim takes counting), at most ``limit`` in all;
    beside them the keys that held a row back (sorted)."""
    taken: dict[str, int] = {}
    chosen: list[_K] = []
    waiting: set[str] = set()
    for row in candidates:
        if limit is not None and len(chosen) >= limit:
            break
        key = row.concurrency_key
        if key is not None:
            count = live.get(key, 0) + taken.get(key, 0)
            if not has_room(row.concurrency_limit, count):
                waiting.add(key)
                continue
            taken[key] = taken.get(key, 0) + 1
        chosen.append(row)
    return chosen, sorted(waiting)


def flow_retry_at(busy_at_ms: int | None, slot_expiries: Sequence[int | None]) -> int | None:
    """A ``Busy`` answer's ``retry_at_ms`` with keys waiting: the earliest of
    the session's own live claims' expiry (``busy_until``) and each waiting
    key's earliest live slot's expiry."""
    return min((t for t in (busy_at_ms, *slot_expiries) if t is not None), default=None)
