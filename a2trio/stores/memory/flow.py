"""The memory store's flow bookkeeping (``rules.flow``): the open rows of
each concurrency key across sessions, whose live claims are its slots, and
the attempt starts of each throttle."""

from __future__ import annotations

from .. import rules
from .rows import Row

__all__ = ["Flows"]


class Flows:
    """Per concurrency key, its unprocessed rows (:attr:`keyed`, which an
    erasure prunes); per throttle, its starts as the instants they stop
    counting (start + period), oldest first."""

    def __init__(self) -> None:
        self.keyed: dict[str, dict[tuple[str, int], Row]] = {}
        self._starts: dict[str, list[int]] = {}

    def add(self, session_id: str, row: Row) -> None:
        """An unprocessed row was written."""
        if row.concurrency_key is not None:
            self.keyed.setdefault(row.concurrency_key, {})[(session_id, row.index)] = row

    def slots(self, key: str, now: int) -> list[Row]:
        """The rows holding a live slot of ``key`` (processed ones forgotten)."""
        keyed = self.keyed.get(key, {})
        for done in [k for k, r in keyed.items() if r.processed_at_ms is not None]:
            del keyed[done]
        return [r for r in keyed.values() if rules.live_slot(r, now)]

    def live(self, key: str | None, now: int) -> int:
        return 0 if key is None else len(self.slots(key, now))

    def started(self, key: str | None, now: int) -> list[int]:
        """The live starts of throttle ``key`` (the expired ones forgotten)."""
        if key is None:
            return []
        starts = [at for at in self._starts.get(key, []) if rules.live_start(at, now)]
        self._starts[key] = starts
        return starts

    def has_room(self, row: Row, now: int) -> bool:
        """``rules.has_room`` for both of the row's keys."""
        return rules.has_room(row.concurrency_limit, self.live(row.concurrency_key, now)) and (
            rules.has_room(row.throttle_limit, len(self.started(row.throttle_key, now)))
        )

    def start(self, row: Row, now: int) -> None:
        """A claim of ``row`` started an attempt: it counts against its throttle."""
        if row.throttle_key is not None and row.throttle_period_ms is not None:
            self._starts.setdefault(row.throttle_key, []).append(now + row.throttle_period_ms)
