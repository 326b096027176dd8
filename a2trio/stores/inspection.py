"""The inspection capability (``store.inspect``): the read-only views a
dashboard, the command line and tests read. :mod:`a2trio.stores.base`
re-exports it with the other capabilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .records import EventPage, FailedAttempt, SessionPage, SnapshotInfo

__all__ = ["Inspection"]


@runtime_checkable
class Inspection(Protocol):
    """Read-only views for dashboards and tests."""

    async def list_sessions(
        self, *, prefix: str, limit: int, cursor: str | None = None
    ) -> SessionPage:
        """Sessions whose id starts with ``prefix``, ordered by id, after ``cursor``."""
        ...

    async def read_events(
        self, session_id: str, *, after_index: int, limit: int, through_index: int | None = None
    ) -> EventPage:
        """Events after ``after_index`` up to ``min(through_index, frontier)``."""
        ...

    async def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """The session's snapshots, ordered by reducer name."""
        ...

    async def read_failures(self, session_id: str, indexes: Sequence[int]) -> list[FailedAttempt]:
        """The failed attempts recorded on these events of the session (see
        :meth:`~a2trio.stores.base.Store.fail_attempt`), by index, then attempt: the latest
        :data:`~a2trio.stores.rules.MAX_FAILED_ATTEMPTS` of each event."""
        ...
