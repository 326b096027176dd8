"""``server.inspect``: the seed's inspection API, scoped to one contract.

The store's inspection capability (``Store.inspect``) sees every contract's
sessions under their storage keys; this module is what an operator's tools
use: sessions of this server's contract with the namespace stripped, and a
session's events page by page, each with the processing status its
bookkeeping implies. It validates bounds as the seed's ``readSessionPage``
does and checks the store's answer (contiguous, within bounds) before
trusting it.

Beyond the seed (issue 18), on stores with the operator capability
(``Store.operator``, :class:`~a2trio.stores.base.OperatorActions`: memory,
SQLite, Postgres, Redis): the dead letters across the contract's sessions, and the operator's
actions, each durable, fenced against a live claim and recorded with who and
why (shown on the event's page): :meth:`ServerInspection.redrive`,
:meth:`~ServerInspection.skip`, :meth:`~ServerInspection.retry_now`, and for a
handler suspended in a durable sleep or wait :meth:`~ServerInspection.wake`
and :meth:`~ServerInspection.cancel`. An
action then wakes this server's drain of the session (when it is open and
runs handlers); the store wakes other processes' drains where it can.

The records it answers with, and the status a row's bookkeeping implies
(``event_status``), are in ``inspection_records.py``; the actions' work
(single and bulk) in ``actions.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from ..errors import A2Error, ErrorCode
from ..identifiers import MAX_SAFE_INTEGER, check_session_id
from ..stores.base import (
    FailedAttempt,
    Inspection,
    OperatorAction,
    StoredEvent,
)
from ..telemetry import trace_id_of
from ..upcasting import UpcastError
from .actions import (
    DEFAULT_BULK_LIMIT,
    MAX_ACTOR_CHARS,
    MAX_BULK_LIMIT,
    MAX_REASON_CHARS,
    OperatorDesk,
)
from .context import Engine
from .crons import CronInfo, Crons
from .durable import Waiting, waiting
from .inspection_records import (
    BulkAction,
    BulkFilterError,
    BulkResult,
    DeadLetterFilter,
    DeadLettersPage,
    InspectedEvent,
    InspectionUnsupportedError,
    SessionEventsPage,
    SessionsPage,
    dead_cursor,
    event_status,
)

__all__ = [
    "DEFAULT_BULK_LIMIT",
    "MAX_ACTOR_CHARS",
    "MAX_BULK_LIMIT",
    "MAX_INSPECTION_PAGE",
    "MAX_REASON_CHARS",
    "BulkFilterError",
    "InspectionUnsupportedError",
    "ServerInspection",
]

#: The most sessions or events one inspection page holds.
MAX_INSPECTION_PAGE = 1_000


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
    """``server.inspect`` (see the module docstring).

    Args:
      engine: the server's engine.
      wake: wakes this server's drain of a session (the drain registry's).
      crons: the server's :func:`a2trio.cron` schedules.
    """

    def __init__(self, engine: Engine, wake: Callable[[str], None], crons: Crons) -> None:
        self._engine = engine
        self._actions = OperatorDesk(engine, wake)
        self._crons = crons

    async def crons(self) -> list[CronInfo]:
        """The server's crons, in the order given, each with its last fired
        slot (its first event is stored; looked for within
        :data:`~a2trio.engine.crons.CATCH_UP_WINDOW` slots of now: at most that
        many ``find_event`` reads per cron) and its next slot. Needs only the
        store open, not the server, and no inspection capability.

        Cancellation: a read; nothing to undo.
        """
        return await self._crons.info()

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

        Each event that failed comes with its failed attempts (one more read
        for the page, only when one of its events failed).
        """
        check_session_id(session_id)
        after_index = _check_index("after_index", after_index)
        limit = _check_limit(limit)
        if through_index is not None:
            through_index = _check_index("through_index", through_index)
        api = self._api()
        engine = self._engine
        key = engine.key(session_id)
        snapshots = await api.list_snapshots(key) if after_index == 0 else []
        page = await api.read_events(
            key, after_index=after_index, limit=limit, through_index=through_index
        )
        through = page.through_index
        events = page.events
        bad = through < 0 or len(events) > limit
        bad = bad or (through_index is not None and after_index > 0 and through != through_index)
        # A trimmed session's page starts past its trim point (Retention.trim).
        start = max(after_index, events[0].index - 1) if events else after_index
        contiguous = all(
            row.index == start + position + 1 and row.index <= through
            for position, row in enumerate(events)
        )
        if bad or not contiguous or (after_index < through and not events):
            raise A2Error(
                ErrorCode.STORE_UNAVAILABLE,
                f"the store's inspection page for session {session_id!r} is not "
                f"contiguous within ({after_index}, {through}]",
            )
        last = events[-1].index if events else after_index
        actions = await self._read_actions(key, session_id, after_index, last)
        failures = await self._read_failures(key, events)
        now_ms = engine.clock.now_ms()
        waits = await self._read_waits(key, events, now_ms)
        inspected = [
            self._inspected(
                row, now_ms, actions.get(row.index, []), failures.get(row.index, []), waits
            )
            for row in events
        ]
        return SessionEventsPage(
            inspected,
            [s for s in snapshots if s.index <= through],
            through,
            last if last < through else None,
        )

    # -- dead letters and the operator's actions (issue 18) ---------------------------

    def _inspected(
        self,
        row: StoredEvent,
        now_ms: int,
        actions: list[OperatorAction],
        failures: list[FailedAttempt],
        waits: dict[int, Waiting] | None = None,
    ) -> InspectedEvent:
        unreadable = None
        try:
            event = self._engine.to_public(row)
        except UpcastError as exc:
            # The operator still sees it, as stored, and why it cannot be read.
            event = self._engine.as_stored(row)
            unreadable = str(exc)
        return InspectedEvent(
            event,
            event_status(row, now_ms, actions, (waits or {}).get(row.index)),
            actions,
            trace_id_of(row.trace_context),
            1 if row.version is None else row.version,
            unreadable,
            failures,
        )

    async def _read_waits(self, key: str, rows: list[StoredEvent], now: int) -> dict[int, Waiting]:
        # Only a live event held by a claim or a not-before may wait: else no read.
        journal = self._engine.store.journal
        found: dict[int, Waiting] = {}
        for row in rows:
            held = max(row.claim_expires_at_ms or 0, row.not_before_ms or 0) > now
            if journal is None or row.processed_at_ms or row.failed_at_ms or not held:
                continue
            wait = waiting(await journal.read_journal(key, row.index), now)
            if wait is not None:
                found[row.index] = wait
        return found

    async def _read_failures(
        self, key: str, rows: list[StoredEvent]
    ) -> dict[int, list[FailedAttempt]]:
        # Only events that ever failed have a history: a page without
        # failures costs no read.
        failed = [row.index for row in rows if row.last_failed_attempt is not None]
        api = self._engine.store.inspect
        if api is None or not failed:
            return {}
        by_index: dict[int, list[FailedAttempt]] = {}
        for failure in await api.read_failures(key, failed):
            by_index.setdefault(failure.index, []).append(failure)
        return by_index

    async def _read_actions(
        self, key: str, session_id: str, after_index: int, through_index: int
    ) -> dict[int, list[OperatorAction]]:
        operator = self._engine.store.operator
        if operator is None or through_index <= after_index:
            return {}
        recorded = await operator.read_actions(
            key, after_index=after_index, through_index=through_index
        )
        by_index: dict[int, list[OperatorAction]] = {}
        for action in recorded:
            by_index.setdefault(action.index, []).append(self._actions.public(action, session_id))
        return by_index

    async def list_dead_letters(
        self, *, limit: int = 100, cursor: str | None = None
    ) -> DeadLettersPage:
        """A page of the contract's dead letters, by (session, index), after
        ``cursor`` (``"<index>:<session>"``, from the previous page).

        Raises:
          TypeError / ValueError: a bad ``limit`` or ``cursor``.
          InspectionUnsupportedError: the store has no operator actions.
          A2Error: ``STORE_UNAVAILABLE``.
        """
        limit = _check_limit(limit)
        after = None
        if cursor is not None:
            session_id, index = dead_cursor(cursor)
            after = (self._engine.key(session_id), index)
        operator = self._actions.operator()
        engine = self._engine
        rows = await operator.dead_letters(engine.key(""), limit=limit + 1, after=after)
        # The actions of each session's dead letters on this page, one read
        # per session (the page is ordered by session).
        spans: dict[str, tuple[int, int]] = {}
        for row in rows[:limit]:
            low, high = spans.get(row.session_id, (row.index, row.index))
            spans[row.session_id] = (min(low, row.index), max(high, row.index))
        actions: dict[tuple[str, int], list[OperatorAction]] = {}
        failures: dict[tuple[str, int], list[FailedAttempt]] = {}
        for key, (low, high) in spans.items():
            owner = engine.session_of(key)
            assert owner is not None, key  # the prefix scoped the page
            found = await self._read_actions(key, owner, low - 1, high)
            actions.update(((key, index), recorded) for index, recorded in found.items())
            failed = await self._read_failures(
                key, [r for r in rows[:limit] if r.session_id == key]
            )
            failures.update(((key, index), history) for index, history in failed.items())
        now_ms = engine.clock.now_ms()
        page = [
            self._inspected(
                row,
                now_ms,
                actions.get((row.session_id, row.index), []),
                failures.get((row.session_id, row.index), []),
            )
            for row in rows[:limit]
        ]
        last = page[-1].event if page and len(rows) > limit else None
        return DeadLettersPage(page, None if last is None else f"{last.index}:{last.session_id}")

    async def redrive(
        self, session_id: str, index: int, *, by: str, reason: str = ""
    ) -> OperatorAction:
        """Put a dead letter back in line: its failures reset, its lane
        unblocked, the session's drain woken. Recorded with ``by`` and
        ``reason``.

        Raises:
          TypeError / ValueError: a bad id, index, ``by`` or ``reason``.
          OperatorActionError: ``no_event``, ``not_dead_lettered``, ``claimed``
            (nothing written).
          InspectionUnsupportedError: the store has no operator actions.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: the store's action commits entirely or not at all; a
        retry after a commit is refused (``not_dead_lettered``).
        """
        return await self._actions.act("redrive", session_id, index, by, reason)

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """Mark an unprocessed event (pending, failed or dead-lettered)
        processed without running it, handing its lane on. ``reason`` is
        required: a skipped event's effects never happen.

        Raises:
          TypeError / ValueError: a bad id, index, ``by`` or an empty ``reason``.
          OperatorActionError: ``no_event``, ``settled``, ``claimed``.
          InspectionUnsupportedError: the store has no operator actions.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: all or nothing; a retry after a commit is refused
        (``settled``).
        """
        return await self._actions.act("skip", session_id, index, by, reason)

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """Make the event at ``index``, whose handler is suspended in a durable
        sleep or ``wait_for`` (issue 34), claimable at once
        (``OperatorActions.wake``, recorded as ``wake``); its rerun answers
        from the journal (a sleep sleeps what is left, a wait looks again).

        Raises:
          OperatorActionError: ``not_waiting`` (its journal shows no wait or
            sleep), ``claimed`` (it runs: a short one), ``no_event``, ``settled``.
        """
        return await self._actions.act("wake", session_id, index, by, reason)

    async def cancel(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """:meth:`skip` the event at ``index`` once its journal shows its
        handler suspended (issue 34; recorded as ``skip``, ``reason``
        required). Raises as :meth:`wake` does."""
        return await self._actions.act("cancel", session_id, index, by, reason)

    async def bulk(
        self,
        action: BulkAction,
        where: DeadLetterFilter | None = None,
        *,
        by: str,
        reason: str = "",
        dry_run: bool = False,
        all: bool = False,
        limit: int = DEFAULT_BULK_LIMIT,
        allow: Callable[[str, int], Awaitable[bool]] | None = None,
    ) -> BulkResult:
        """Redrive or skip every dead letter ``where`` matches, by (session,
        index), up to ``limit`` of them; ``dry_run`` lists them and touches
        nothing.

        The dead letters are read page by page (bounded, never all at once),
        and each match is acted on alone through the single action
        (:meth:`redrive`, :meth:`skip`: fenced, recorded with ``by`` and
        ``reason``, its session's drain woken). A refusal (``claimed`` by a
        live claim, or ``not_dead_lettered`` / ``settled`` when it changed
        since it was read) is reported on that event and the others go on;
        so is ``forbidden`` when ``allow(session_id, index)`` says no (the
        HTTP route asks its policy so, per event).

        Raises:
          BulkFilterError: a malformed filter or ``limit`` (at most
            :data:`MAX_BULK_LIMIT`), or an empty filter on a run that acts
            without ``all=True``.
          TypeError / ValueError: a bad ``action``, ``by`` or ``reason``
            (required to skip, dry run or not).
          InspectionUnsupportedError: the store has no operator actions.
          A2Error: ``STORE_UNAVAILABLE`` (the events acted on before it stay
            acted on).

        Cancellation: each single action commits entirely or not at all; a
        cancelled call leaves those it acted on acted on (recorded, no longer
        dead letters), so running it again takes up the rest.
        """
        return await self._actions.bulk(
            action, where, by=by, reason=reason, dry_run=dry_run, all=all, limit=limit, allow=allow
        )

    async def retry_now(
        self, session_id: str, *, by: str, reason: str = ""
    ) -> list[OperatorAction]:
        """Wake the session's drain now: every event a claim would take
        (failure backoff ignored) is recorded as retried, and claimed at once
        by this server's drain (or another process's, where the store wakes
        them: Postgres, Redis; on SQLite another process's sweep takes a
        failed event when its backoff ends).

        Raises:
          TypeError / ValueError: a bad id, ``by`` or ``reason``.
          OperatorActionError: ``claimed`` (a live drain holds the work),
            ``nothing_to_retry``.
          InspectionUnsupportedError: the store has no operator actions.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: recorded entirely or not at all; repeating it is safe.
        """
        return await self._actions.retry_now(session_id, by=by, reason=reason)
