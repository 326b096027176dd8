"""Backscroll: older slices of a session's log, merged into one ordered feed.

The seed's ``loadHistory``: each call fetches a bounded slice below a
frontier through the history lane (``GET ?gte=&lte=``) and merges it into
the session's :class:`History`, de-duplicated by index and ordered. By
default each call walks backward ``limit`` events from the oldest one loaded
(from the live frontier the first time). Calls serialize per session, so a
double call never fetches one range twice: the second one pages on from
where the first one left off. ``complete`` means the feed reaches index 1
(or the log below is empty): nothing older is left.

Live events of a followed session merge into the same feed, so ``events`` is
what this client has seen of the log, backscroll and live. The feed is
display data: it never feeds a local fold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import msgspec
import trio

from .. import wire

__all__ = ["DEFAULT_HISTORY_LIMIT", "Backscroll", "History"]

#: Events per ``load_history`` call unless told (the seed's default page).
DEFAULT_HISTORY_LIMIT: Final = 50

#: ``fetch(gte, lte)``: the events of that inclusive range, from the history lane.
Fetch = Callable[[int, int], Awaitable[list[wire.WireEvent]]]


class Backscroll(msgspec.Struct, frozen=True):
    """What one ``load_history`` call fetched, and where the feed stands.

    Attributes:
      events: the events of this page, oldest first (possibly empty).
      complete: the feed now reaches index 1 (or the log below is empty).
      oldest_loaded: the lowest index in the feed, ``None`` while it is empty.
    """

    events: tuple[wire.WireEvent, ...]
    complete: bool
    oldest_loaded: int | None


class History:
    """One session's merged feed; the client keeps one per session it loaded.

    Attributes:
      session_id: the session.
      loading: a load is in flight.
      complete: nothing older than the feed is left.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.loading = False
        self.complete = False
        self._by_index: dict[int, wire.WireEvent] = {}
        self._lock = trio.Lock()

    @property
    def events(self) -> list[wire.WireEvent]:
        """Every event in the feed, ordered by index, each once."""
        return [self._by_index[i] for i in sorted(self._by_index)]

    @property
    def oldest_loaded(self) -> int | None:
        """The lowest index in the feed, ``None`` while it is empty."""
        return min(self._by_index, default=None)

    def merge(self, events: Iterable[wire.WireEvent | wire.EventFrame]) -> None:
        """Add events (live or fetched); one already present is kept as it is."""
        for event in events:
            if event.index not in self._by_index:
                if isinstance(event, wire.EventFrame):
                    event = wire.wire_event(event)
                self._by_index[event.index] = event
        if 1 in self._by_index:
            self.complete = True

    async def load(
        self, fetch: Fetch, frontier: int | None, before: int | None, limit: int
    ) -> Backscroll:
        """Fetch up to ``limit`` events below ``before`` and merge them.

        Args:
          fetch: the history lane.
          frontier: the live index when nothing is loaded (``None``: not followed).
          before: the exclusive upper bound; by default the oldest loaded
            event, else ``frontier + 1``.
          limit: the most events to fetch, at least 1.

        Raises:
          ValueError: a bad ``before`` or ``limit``, or no bound to page from
            (nothing loaded, not followed, no ``before``).
          A2Error: the history lane refused or failed (nothing merged).

        Cancellation: serialized per session; a cancelled load merges nothing.
        """
        if type(limit) is not int or limit < 1:
            raise ValueError(f"`limit` must be a positive int, got {limit!r}")
        if before is not None and (type(before) is not int or before < 1):
            raise ValueError(f"`before` must be a positive int or None, got {before!r}")
        async with self._lock:
            if before is None:
                before = self.oldest_loaded
            if before is None and frontier is not None:
                before = frontier + 1
            if before is None:
                raise ValueError(
                    f"nothing of {self.session_id!r} is loaded or followed: pass `before`"
                )
            if before <= 1:
                self.complete = True
                return Backscroll((), True, self.oldest_loaded)
            gte, lte = max(1, before - limit), before - 1
            self.loading = True
            try:
                events = await fetch(gte, lte)
            finally:
                self.loading = False
            self.merge(events)
            if gte == 1:
                self.complete = True
            return Backscroll(tuple(events), self.complete, self.oldest_loaded)
