"""An operator's actions on a server's sessions: redrive, skip, retry now,
and their bulk form over the dead letters a filter matches (issue 35).

:class:`~a2trio.engine.inspection.ServerInspection` (``server.inspect``)
answers the calls and documents them; :class:`OperatorDesk` does the work:
checks the inputs, calls the store's operator capability (each action
fenced and recorded by the store), names sessions without their namespace,
and wakes this server's drain of a session an action touched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import msgspec

from ..identifiers import MAX_SAFE_INTEGER, check_session_id
from ..stores.base import OperatorAction, OperatorActionError, OperatorActions, StoredEvent
from .context import Engine
from .durable import waiting
from .inspection_records import (
    BulkAction,
    BulkFilterError,
    BulkItem,
    BulkResult,
    DeadLetterFilter,
    InspectionUnsupportedError,
)

__all__ = [
    "DEFAULT_BULK_LIMIT",
    "MAX_ACTOR_CHARS",
    "MAX_BULK_LIMIT",
    "MAX_REASON_CHARS",
    "OperatorDesk",
    "check_words",
    "public_refusal",
]

#: The longest ``by`` (who acted) and ``reason`` an operator action records:
#: a name and a sentence or two, not a document.
MAX_ACTOR_CHARS = 200
MAX_REASON_CHARS = 2_000
#: How many dead letters one bulk action touches unless told otherwise, and
#: at most: its result lists each one.
DEFAULT_BULK_LIMIT = 1_000
MAX_BULK_LIMIT = 10_000
#: The dead letters a bulk action reads per store round trip.
_BULK_PAGE = 200


def check_filter(where: DeadLetterFilter) -> DeadLetterFilter:
    if not isinstance(where, DeadLetterFilter):
        raise BulkFilterError(f"a bulk action's filter is a DeadLetterFilter, got {where!r}")
    types = where.event_types
    if not isinstance(types, tuple) or not all(isinstance(t, str) and t for t in types):
        raise BulkFilterError(f"`event_types` are non-empty strings, got {types!r}")
    text = where.error_contains
    if text is not None and (not isinstance(text, str) or not text):
        raise BulkFilterError(f"`error_contains` is a non-empty string, got {text!r}")
    if not isinstance(where.session_prefix, str):
        raise BulkFilterError(f"`session_prefix` is a string, got {where.session_prefix!r}")
    low, high = where.dead_lettered_from_ms, where.dead_lettered_until_ms
    for name, value in (("dead_lettered_from_ms", low), ("dead_lettered_until_ms", high)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 <= value <= MAX_SAFE_INTEGER
        ):
            raise BulkFilterError(
                f"`{name}` is epoch milliseconds (a non-negative safe integer), got {value!r}"
            )
    if low is not None and high is not None and low >= high:
        raise BulkFilterError(
            f"the time range ends before it starts: from {low} (inclusive) until {high} (exclusive)"
        )
    return where


def check_words(name: str, value: object, most: int, *, required: bool) -> str:
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be a string, got {value!r}")
    if required and not value.strip():
        raise ValueError(f"`{name}` must not be empty: say who acted and why")
    if len(value) > most:
        raise ValueError(f"`{name}` holds at most {most} characters, got {len(value)}")
    return value


@contextmanager
def public_refusal(session_id: str) -> Iterator[None]:
    """The store's refusal, naming the session without its namespace."""
    try:
        yield
    except OperatorActionError as exc:
        raise OperatorActionError(exc.reason, session_id, exc.index, exc.detail) from None


class OperatorDesk:
    """The operator's actions of one server (see the module docstring).

    Args:
      engine: the server's engine.
      wake: wakes this server's drain of a session (the drain registry's).
    """

    def __init__(self, engine: Engine, wake: Callable[[str], None]) -> None:
        self._engine = engine
        self._wake = wake

    def operator(self) -> OperatorActions:
        """The store's operator capability.

        Raises:
          InspectionUnsupportedError: the store has none.
        """
        operator = self._engine.store.operator
        if operator is None:
            raise InspectionUnsupportedError(
                f"the store {type(self._engine.store).__name__} has no operator actions "
                "(dead letters, redrive, skip, retry now)"
            )
        return operator

    def public(self, action: OperatorAction, session_id: str) -> OperatorAction:
        """``action`` naming its session without the namespace."""
        return msgspec.structs.replace(action, session_id=session_id)

    def woken(self, session_id: str) -> None:
        """Wake this server's drain of the session (when it is open and runs
        handlers): what an action makes claimable runs at once."""
        engine = self._engine
        if engine.background.is_open and engine.run_handlers:
            self._wake(session_id)

    async def act(
        self,
        action: Literal["redrive", "skip", "wake", "cancel"],
        session_id: str,
        index: int,
        by: str,
        reason: str,
    ) -> OperatorAction:
        """See :meth:`ServerInspection.redrive`, :meth:`~ServerInspection.skip`,
        :meth:`~ServerInspection.wake` and :meth:`~ServerInspection.cancel`."""
        check_session_id(session_id)
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 1 <= index <= MAX_SAFE_INTEGER
        ):
            raise TypeError(
                f"the event index must be a positive integer up to {MAX_SAFE_INTEGER}, "
                f"got {index!r}"
            )
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        required = action in ("skip", "cancel")
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=required)
        operator = self.operator()
        key = self._engine.key(session_id)
        with public_refusal(session_id):
            if action in ("wake", "cancel"):
                await self._check_waiting(key, index)
            if action == "redrive":
                recorded = await operator.redrive(key, index, by=by, reason=reason)
            elif action == "wake":
                recorded = await operator.wake(key, index, by=by, reason=reason)
            else:
                recorded = await operator.skip(key, index, by=by, reason=reason)
        self.woken(session_id)
        return self.public(recorded, session_id)

    async def _check_waiting(self, key: str, index: int) -> None:
        """Refuse (``not_waiting``) an event no durable sleep or wait of its
        handler holds back, by its journal (as inspection's ``waiting``)."""
        store = self._engine.store
        rows = await store.read(key, after_index=index - 1, through_index=index)
        if not rows:
            return  # the store's own fence answers ``no_event``
        journal = store.journal
        entries = [] if journal is None else await journal.read_journal(key, index)
        if rows[0].processed_at_ms is None and waiting(entries, store.clock.now_ms()):
            return
        raise OperatorActionError(
            "not_waiting",
            key,
            index,
            "is not waiting in a durable sleep or wait_for: nothing to wake or cancel",
        )

    async def bulk(
        self,
        action: BulkAction,
        where: DeadLetterFilter | None,
        *,
        by: str,
        reason: str,
        dry_run: bool,
        all: bool,
        limit: int,
        allow: Callable[[str, int], Awaitable[bool]] | None,
    ) -> BulkResult:
        """See :meth:`ServerInspection.bulk`."""
        if action not in ("redrive", "skip"):
            raise ValueError(f"a bulk action is 'redrive' or 'skip', got {action!r}")
        where = check_filter(DeadLetterFilter() if where is None else where)
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_BULK_LIMIT
        ):
            raise BulkFilterError(f"a bulk action's limit is 1 to {MAX_BULK_LIMIT}, got {limit!r}")
        if where.is_empty() and not dry_run and not all:
            raise BulkFilterError(
                f"an empty filter would {action} every dead letter: narrow it, "
                "or say all=True (--all)"
            )
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=action == "skip")
        operator = self.operator()
        prefix = self._engine.key(where.session_prefix)
        items: list[BulkItem] = []
        after: tuple[str, int] | None = None
        limited = False
        while not limited:
            rows = await operator.dead_letters(prefix, limit=_BULK_PAGE, after=after)
            for row in rows:
                if not where.matches(row):
                    continue
                if len(items) == limit:
                    limited = True
                    break
                items.append(
                    await self._bulk_one(operator, action, row, by, reason, dry_run, allow)
                )
            if len(rows) < _BULK_PAGE:
                break
            after = (rows[-1].session_id, rows[-1].index)
        acted = sum(item.outcome == "acted" for item in items)
        refused = sum(item.outcome == "refused" for item in items)
        return BulkResult(action, dry_run, len(items), acted, refused, items, limited)

    async def _bulk_one(
        self,
        operator: OperatorActions,
        action: BulkAction,
        row: StoredEvent,
        by: str,
        reason: str,
        dry_run: bool,
        allow: Callable[[str, int], Awaitable[bool]] | None,
    ) -> BulkItem:
        session_id = self._engine.session_of(row.session_id)
        assert session_id is not None, row  # the prefix scoped the page
        index = row.index
        if dry_run:
            return BulkItem(session_id, index, row.type, "matched")
        if allow is not None and not await allow(session_id, index):
            detail = f"event {index} of session {session_id!r} is not allowed to {action}"
            return BulkItem(session_id, index, row.type, "refused", "forbidden", detail)
        try:
            with public_refusal(session_id):
                if action == "redrive":
                    recorded = await operator.redrive(row.session_id, index, by=by, reason=reason)
                else:
                    recorded = await operator.skip(row.session_id, index, by=by, reason=reason)
        except OperatorActionError as exc:
            return BulkItem(session_id, index, row.type, "refused", exc.reason, str(exc))
        self.woken(session_id)
        return BulkItem(
            session_id, index, row.type, "acted", action=self.public(recorded, session_id)
        )

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """See :meth:`ServerInspection.retry_now`."""
        check_session_id(session_id)
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=False)
        operator = self.operator()
        with public_refusal(session_id):
            recorded = await operator.retry_now(self._engine.key(session_id), by=by, reason=reason)
        self.woken(session_id)
        return [self.public(action, session_id) for action in recorded]
