"""``server.inspect``: the seed's inspection API, scoped to one contract.

The store's inspection capability (``Store.inspect``) sees every contract's
sessions under their storage keys; this module is what an operator's tools
use: sessions of this server's contract with the namespace stripped, and a
session's events page by page, each with the processing status its
bookkeeping implies. It validates bounds as the seed's ``readSessionPage``
does and checks the store's answer (contiguous, within bounds) before
trusting it.

Not here yet (issue 18): dead letters across sessions, and the operator's
actions (redrive, skip, retry now), which need store operations of their own.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .contract import Event
from .core import Engine
from .errors import A2Error, ErrorCode, store_unavailable
from .identifiers import MAX_SAFE_INTEGER, check_session_id
from .stores.base import Inspection, SessionSummary, SnapshotInfo, StoredEvent

__all__ = [
    "MAX_INSPECTION_PAGE",
    "EventStatus",
    "InspectedEvent",
    "InspectionUnsupportedError",
    "ServerInspection",
    "SessionEventsPage",
    "SessionsPage",
]

#: The most sessions or events one inspection page holds.
MAX_INSPECTION_PAGE = 1_000

State = Literal["settled", "processed", "pending", "claimed", "failed", "dead_lettered"]


class InspectionUnsupportedError(Exception):
    """The server's store has no inspection capability (the seed's
    ``InspectionUnsupportedError``)."""


InspectionUnsupportedError.__module__ = "a2trio"


class EventStatus(msgspec.Struct, frozen=True):
    """Where an event is in its processing.

    ``state``: ``settled`` (stored with nothing to run), ``processed`` (a
    handler completed it, by ``processed_by_attempt``), ``pending`` (waiting
    for a claim), ``claimed`` (``claim_holder`` runs attempt ``attempts``
    until ``claim_expires_at``), ``failed`` (``failures`` so far, waiting for
    a retry), ``dead_lettered`` (failed for good; its lane is blocked).
    """

    state: State
    attempts: int
    failures: int
    claim_holder: str | None = None
    claim_expires_at_ms: int | None = None
    processed_by_attempt: int | None = None
    last_error: str | None = None


class InspectedEvent(msgspec.Struct, frozen=True):
    """A typed event and its status."""

    event: Event[Any]
    status: EventStatus


class SessionsPage(msgspec.Struct, frozen=True):
    """Sessions of the contract (ids without the namespace), and the cursor
    for the next page (None at the end)."""

    sessions: list[SessionSummary]
    cursor: str | None


class SessionEventsPage(msgspec.Struct, frozen=True):
    """Events in ``(after_index, through_index]``; ``next_index`` is the
    ``after_index`` of the next page, None when this one reached
    ``through_index``. Snapshots come with the first page (``after_index=0``)."""

    events: list[InspectedEvent]
    snapshots: list[SnapshotInfo]
    through_index: int
    next_index: int | None


def event_status(row: StoredEvent, now_ms: int) -> EventStatus:
    """The status a stored row's bookkeeping implies at ``now_ms``."""
    state: State
    if row.failed_at_ms is not None:
        state = "dead_lettered"
    elif row.processed_at_ms is not None:
        state = "settled" if row.attempt_count == 0 else "processed"
    elif row.claim_expires_at_ms is not None and row.claim_expires_at_ms > now_ms:
        state = "claimed"
    elif row.failure_count > 0:
        state = "failed"
    else:
        state = "pending"
    claimed = state == "claimed"
    return EventStatus(
        state,
        row.attempt_count,
        row.failure_count,
        row.claim_holder if claimed else None,
        row.claim_expires_at_ms if claimed else None,
        row.processed_by_attempt,
        row.last_error,
    )


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit:
        raise TypeError(f"inspection limit must be a positive integer, got {limit!r}")
    if limit > MAX_INSPECTION_PAGE:
        raise ValueError(
            f"inspection pages hold at most {MAX_INSPECTION_PAGE} items, got limit={limit}"
        )
    return limit


def _check_index(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise TypeError(f"inspection {name} must be a non-negative safe integer, got {value!r}")
    return value


class ServerInspection:
    """``server.inspect`` (see the module docstring). Every method is a read."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _api(self) -> Inspection:
        api = self._engine.store.inspect
        if api is None:
            raise InspectionUnsupportedError(
                f"the store {type(self._engine.store).__name__} does not support inspection"
            )
        return api

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionsPage:
        """A page of the contract's sessions, ordered by id, after ``cursor``.

        Raises:
          TypeError / ValueError: a bad ``limit`` (at most
            :data:`MAX_INSPECTION_PAGE`).
          InspectionUnsupportedError: the store cannot inspect.
        """
        limit = _check_limit(limit)
        api = self._api()
        engine = self._engine
        key_cursor = None if cursor is None else engine.key(check_session_id(cursor))
        with store_unavailable("list sessions"):
            page = await api.list_sessions(prefix=engine.key(""), limit=limit, cursor=key_cursor)
        sessions = []
        for summary in page.sessions:
            session_id = engine.session_of(summary.session_id)
            assert session_id is not None, summary  # the prefix scoped the page
            sessions.append(msgspec.structs.replace(summary, session_id=session_id))
        next_cursor = None if page.cursor is None else engine.session_of(page.cursor)
        return SessionsPage(sessions, next_cursor)

    async def read_session_page(
        self,
        session_id: str,
        *,
        after_index: int = 0,
        limit: int = 100,
        through_index: int | None = None,
    ) -> SessionEventsPage:
        """Events after ``after_index``, at most ``limit``, up to
        ``min(through_index, the session's last index)``, with their status.

        Raises:
          TypeError / ValueError: bad bounds (the seed's checks), a bad id.
          InspectionUnsupportedError: the store cannot inspect.
          A2Error: ``STORE_UNAVAILABLE``, also when the store's page is not
            contiguous or oversteps its bounds (the seed's checks).
        """
        check_session_id(session_id)
        after_index = _check_index("after_index", after_index)
        limit = _check_limit(limit)
        if through_index is not None:
            through_index = _check_index("through_index", through_index)
        api = self._api()
        engine = self._engine
        key = engine.key(session_id)
        with store_unavailable("read events"):
            snapshots = await api.list_snapshots(key) if after_index == 0 else []
            page = await api.read_events(
                key, after_index=after_index, limit=limit, through_index=through_index
            )
        through = page.through_index
        events = page.events
        bad = through < 0 or len(events) > limit
        bad = bad or (through_index is not None and after_index > 0 and through != through_index)
        contiguous = all(
            row.index == after_index + position + 1 and row.index <= through
            for position, row in enumerate(events)
        )
        if bad or not contiguous or (after_index < through and not events):
            raise A2Error(
                ErrorCode.STORE_UNAVAILABLE,
                f"the store's inspection page for session {session_id!r} is not "
                f"contiguous within ({after_index}, {through}]",
            )
        now_ms = engine.clock.now_ms()
        inspected = [
            InspectedEvent(engine.to_public(row), event_status(row, now_ms)) for row in events
        ]
        last = events[-1].index if events else after_index
        return SessionEventsPage(
            inspected,
            [s for s in snapshots if s.index <= through],
            through,
            last if last < through else None,
        )
