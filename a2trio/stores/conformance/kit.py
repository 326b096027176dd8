"""What every check shares: the factory type, the clock, capability discovery,
the assertions, and the helpers that name sessions and build rows.

The helpers are public within the package, for the check modules;
``a2trio.stores.conformance`` re-exports the names a runner needs
(:class:`ManualClock`, :data:`StoreFactory`, :func:`capabilities`, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any
from uuid import uuid4

import trio

from ...clock import Clock
from ...errors import A2Error, ErrorCode
from ...ids import random_id
from ..base import (
    AppendEvent,
    AppendResult,
    Claimed,
    ClaimResult,
    EventCause,
    Feed,
    Store,
    StoredEvent,
)

__all__ = [
    "CANCEL_DELAYS_S",
    "FEED_DEADLINE_S",
    "T0",
    "CapabilityMissing",
    "ManualClock",
    "StoreFactory",
    "append_n",
    "capabilities",
    "claim",
    "claimed_events",
    "ev",
    "indexes_of",
    "new_sid",
    "new_uid",
    "raises",
    "receive",
    "takes_ids",
    "unchanged",
]


#: Yields a fresh, entered store stamping rows with the given clock. "Fresh"
#: means no rows in the sessions a check creates, not an empty database. It
#: may also take ``ids=`` (an :class:`~a2trio.ids.IdSource` or ``None``, for
#: the store's default): see :func:`capabilities`.
StoreFactory = Callable[[Clock], AbstractAsyncContextManager[Store]]

#: How long a check waits for a live delivery (feed row, presence patch).
FEED_DEADLINE_S = 5.0

#: Where a :class:`ManualClock` starts (epoch ms): checks assert stored times from it.
T0 = 1_700_000_000_000

#: Deadlines for cancelled calls, from "at once" past a few round trips, so
#: that some land inside a call on every backend (sqlite commits in ~0.3 ms).
CANCEL_DELAYS_S = (0, 1e-4, 2e-4, 3e-4, 5e-4, 8e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 8e-3)


class ManualClock:
    """A :class:`~a2trio.clock.Clock` that only moves when told to.

    Args:
      now_ms: the starting epoch milliseconds.
    """

    def __init__(self, now_ms: int = T0) -> None:
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
    ``operator``, ``retention``, ``transactions``, ``journal``, and ``ids``
    when the factory takes ``ids=`` (by its signature).

    Lets a runner skip checks before running them. Opens one store.
    """
    async with open_store(ManualClock()) as store:
        found = {"ids"} if takes_ids(open_store) else set()
        if store.presence is not None:
            found.add("presence")
            if store.presence.push:
                found.add("presence push")
        if store.inspect is not None:
            found.add("inspect")
        if store.sweep is not None:
            found.add("sweep")
        if store.operator is not None:
            found.add("operator")
        if store.retention is not None:
            found.add("retention")
        if store.transactions is not None:
            found.add("transactions")
        if store.journal is not None:
            found.add("journal")
        return frozenset(found)


def takes_ids(open_store: StoreFactory) -> bool:
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


def new_sid(name: str) -> str:
    """A session id of its own: the random suffix keeps checks sharing a database apart."""
    return f"conformance-{name}-{uuid4().hex[:8]}"


def new_uid(name: str) -> str:
    """An event id (or prefix) no other check uses."""
    return f"{name}-{uuid4().hex[:12]}"


def ev(
    type: str = "note",
    payload: Any = None,
    *,
    id: str | None = None,
    cause: EventCause | None = None,
    lane: str | None = None,
    settled: bool = False,
) -> AppendEvent:
    """An event to append: a ``note`` with no payload unless told otherwise."""
    return AppendEvent(type, payload, id=id, cause=cause, lane=lane, settled=settled)


def claimed_events(result: ClaimResult) -> list[StoredEvent]:
    """The events of a claim that must have been ``Claimed``."""
    assert isinstance(result, Claimed), f"expected Claimed, got {result!r}"
    return result.events


def indexes_of(events: Sequence[StoredEvent]) -> list[int]:
    """The rows' indexes, in order."""
    return [e.index for e in events]


async def claim(store: Store, sid: str, holder: str = "h1", ttl_ms: int = 1_000) -> ClaimResult:
    """``claim_available`` with the checks' usual holder and ttl."""
    return await store.claim_available(sid, holder=holder, ttl_ms=ttl_ms)


async def append_n(store: Store, sid: str, n: int, **kw: Any) -> AppendResult:
    """Append ``n`` notes with payloads ``{"n": 0}``, ``{"n": 1}``, ... in one batch."""
    return await store.append(sid, [ev(payload={"n": i}, **kw) for i in range(n)])


async def unchanged(store: Store, sid: str, before: list[StoredEvent]) -> None:
    """Assert that the session still reads ``before`` (a rejected call wrote nothing)."""
    after = await store.read(sid)
    assert after == before, f"a rejected call changed session {sid!r}: {before!r} -> {after!r}"


async def receive(feed: Feed[StoredEvent], n: int) -> list[StoredEvent]:
    """The feed's next ``n`` rows, within :data:`FEED_DEADLINE_S`."""
    got: list[StoredEvent] = []
    try:
        with trio.fail_after(FEED_DEADLINE_S):
            for _ in range(n):
                got.append(await feed.receive())
    except trio.TooSlowError:
        raise AssertionError(f"feed delivered {indexes_of(got)}, expected {n} rows") from None
    return got
