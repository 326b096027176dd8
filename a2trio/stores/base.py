"""The store seam: what every backend promises, and the records it speaks.

A store is the durable half of a2trio. The server never imports a concrete
store; it calls the operations below, whose semantics are those of the seed's
``store-postgres.ts``. ``a2trio.stores.conformance`` is the executable form of
this page: every backend passes it unchanged.

Obligations every backend keeps:

* **Indexes** are per session, contiguous, from 1. **Ids** are unique across
  the whole store.
* **Append** is atomic. A batch whose ids all exist in the session replays
  idempotently (the stored rows come back); a mix of stored and fresh ids, an id
  stored in another session, or an id twice in the batch is
  ``PARTIAL_DUPLICATE_BATCH``. Events carrying a ``cause`` are fenced: the
  cause's attempt must still be the parent's latest and the parent not dead
  lettered, else ``SUPERSEDED_ATTEMPT`` and nothing is written. An append
  with a :class:`ClaimRequest` writes its claimable events claimed, as a
  claim in the same transaction would (see there). An append with an
  ``expected_index`` commits only if the session's last index is still that
  one (after the replay verdict and the fence), else ``INDEX_CONFLICT`` and
  nothing is written: the conditional commit of actor calls.
* **Lookup**: ``find_event`` finds a stored id in its session (what makes an
  actor call's ``messageId`` answer durable).
* **Lanes**: ``lane_ready`` is true only for the oldest unprocessed event of
  its lane; completing it hands readiness to the next.
* **Settled** events (types without a handler) are stored processed.
* **Claims** are fenced by ``attempt``: completion, failure and renewal of an
  attempt that is no longer the latest report ``superseded`` and change nothing.
* **Snapshots** never move backwards.
* **Presence** is field-wise last-writer-wins on the sender's ``at`` (ties go
  to the incoming write); expiry runs on the store's own clock.
* Every timestamp comes from the store's injected :class:`~a2trio.Clock`.
* Any backend failure surfaces as ``A2Error(STORE_UNAVAILABLE)`` with the
  original as ``__cause__``, from every async method of the store and of its
  capabilities (presence, inspection, sweep, operator actions), translated
  inside the store at one point (``a2trio.errors.store_unavailable``): the
  engine passes a store's errors on untouched and translates none of them.

Cancellation: every async operation is a checkpoint. A cancelled operation
either committed entirely or not at all, and never leaves a connection
mid-transaction; retrying with the same ids is always safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from ..clock import Clock
from ..errors import A2Error, ErrorCode
from .feed import Feed

__all__ = [
    "ActionKind",
    "AppendEvent",
    "AppendResult",
    "Busy",
    "ClaimRef",
    "ClaimRequest",
    "ClaimResult",
    "Claimed",
    "CompleteResult",
    "EventCause",
    "EventPage",
    "FailResult",
    "Feed",
    "Inspection",
    "OperatorAction",
    "OperatorActionError",
    "OperatorActions",
    "PresenceRow",
    "PresenceStore",
    "RefusalReason",
    "RenewResult",
    "SessionPage",
    "SessionSummary",
    "Settled",
    "Snapshot",
    "SnapshotInfo",
    "StateRead",
    "Store",
    "StoredEvent",
    "StoredPresencePatch",
    "SweepsClaimable",
    "WatchesPending",
    "replay",
]


class EventCause(msgspec.Struct, frozen=True):
    """The handler attempt that appended an event: its trigger's index and attempt.

    ``batch_size`` is set on handler appends whose ids were generated, so the
    replay of a retried attempt can be checked for the same shape.
    """

    index: int
    attempt: int
    batch_size: int | None = None


class AppendEvent(msgspec.Struct, frozen=True):
    """A validated event on its way into a store.

    ``payload`` is JSON builtins (what ``msgspec.to_builtins`` returns).
    ``id`` is None when the store should generate one. ``trace_context`` is
    the appender's trace context, opaque to the store (the telemetry's
    encoding, see :mod:`a2trio.telemetry`): stored with the event and returned
    with it, so a handler in another process continues the appender's trace.
    """

    type: str
    payload: Any
    id: str | None = None
    cause: EventCause | None = None
    lane: str | None = None
    settled: bool = False
    trace_context: str | None = None


class StoredEvent(msgspec.Struct, frozen=True):
    """An event row with its dispatch bookkeeping (the seed's ``StoredEvent``).

    Times are epoch milliseconds from the store's clock.
    """

    id: str
    type: str
    payload: Any
    index: int
    session_id: str
    created_at_ms: int
    cause: EventCause | None = None
    lane: str | None = None
    processed_at_ms: int | None = None
    processed_by_attempt: int | None = None
    returned_event_ids: list[str] | None = None
    first_claimed_at_ms: int | None = None
    last_claimed_at_ms: int | None = None
    attempt_count: int = 0
    failure_count: int = 0
    last_failed_at_ms: int | None = None
    last_failed_attempt: int | None = None
    last_error: str | None = None
    failed_at_ms: int | None = None
    claim_holder: str | None = None
    claim_expires_at_ms: int | None = None
    trace_context: str | None = None


class Claimed(msgspec.Struct, frozen=True, tag="claimed"):
    """Events claimed by this holder, in index order, ``attempt_count`` advanced."""

    events: list[StoredEvent]


class Busy(msgspec.Struct, frozen=True, tag="busy"):
    """Nothing claimable now; live claims held elsewhere expire at ``retry_at_ms``."""

    retry_at_ms: int


class Settled(msgspec.Struct, frozen=True, tag="settled"):
    """Nothing claimable and no live claim: the session is idle (or stalled)."""


ClaimResult = Claimed | Busy | Settled


class ClaimRequest(msgspec.Struct, frozen=True):
    """Ask :meth:`Store.append` to write its events claimed.

    Each event the append writes that a claim would take at once (not settled,
    first in its lane) is stored claimed by ``holder`` until ``now + ttl_ms``,
    at attempt 1, exactly as if :meth:`Store.claim_available` had claimed it in
    the append's own transaction. A server then starts the handler of an event
    it just appended with no second round trip, and the row is written once.
    A replay or a refused append claims nothing.
    """

    holder: str
    ttl_ms: int


class AppendResult(msgspec.Struct, frozen=True):
    """The appended (or replayed) rows, and whether the session has pending work.

    With a :class:`ClaimRequest`: ``claimed`` holds the rows written claimed
    (index order, also in ``events``), and ``others_claimable`` says whether the
    session held other events a claim would take now (the caller claims those
    the usual way).
    """

    events: list[StoredEvent]
    has_pending: bool
    claimed: list[StoredEvent] = msgspec.field(default_factory=list)
    others_claimable: bool = False


class ClaimRef(msgspec.Struct, frozen=True):
    """A claim this holder believes it owns: (index, attempt)."""

    index: int
    attempt: int


class RenewResult(msgspec.Struct, frozen=True):
    """Indexes whose claims moved forward, and those a newer attempt owns."""

    renewed: list[int]
    superseded: list[int]


class CompleteResult(msgspec.Struct, frozen=True):
    """``completed`` with the returned events as stored, or ``superseded``.

    ``drained`` is a hint that saves a drain its final "nothing left" claim:
    True only if, as of this completion's commit, the session holds no
    unprocessed event that is not dead-lettered (the returned events
    included). A store may always say False; it must never say True falsely.
    """

    outcome: Literal["completed", "superseded"]
    events: list[StoredEvent] = msgspec.field(default_factory=list)
    drained: bool = False


class FailResult(msgspec.Struct, frozen=True):
    """``failed`` (retryable), ``dead_lettered`` (at the limit) or ``superseded``."""

    outcome: Literal["failed", "dead_lettered", "superseded"]
    failure_count: int


class Snapshot(msgspec.Struct, frozen=True):
    """A cached reducer state folded through ``index``."""

    index: int
    state: Any


class StateRead(msgspec.Struct, frozen=True):
    """A snapshot (if any) and the events after it, read in one consistent view."""

    snapshot: Snapshot | None
    events: list[StoredEvent]


class PresenceRow(msgspec.Struct, frozen=True):
    """One live (participant, field) register."""

    participant: str
    field: str
    value: Any
    seen: int
    at_ms: int
    expires_at_ms: int


class StoredPresencePatch(msgspec.Struct, frozen=True):
    """What a presence write changed, as delivered to subscribers.

    ``values`` maps each applied field to its value, ``None`` for a clear.
    """

    participant: str
    values: dict[str, Any]
    seen: int
    at_ms: int


class SessionSummary(msgspec.Struct, frozen=True):
    """Inspection: one session's counters."""

    session_id: str
    event_count: int
    pending_count: int
    failed_count: int
    attempt_count: int
    failure_count: int
    first_event_at_ms: int
    updated_at_ms: int


class SessionPage(msgspec.Struct, frozen=True):
    """Inspection: a page of sessions, and the cursor for the next (None at the end)."""

    sessions: list[SessionSummary]
    cursor: str | None


class EventPage(msgspec.Struct, frozen=True):
    """Inspection: events in ``(after_index, through_index]``, at most ``limit``."""

    events: list[StoredEvent]
    through_index: int


class SnapshotInfo(msgspec.Struct, frozen=True):
    """Inspection: a snapshot's reducer, index and write time."""

    reducer_name: str
    index: int
    updated_at_ms: int


ActionKind = Literal["redrive", "skip", "retry_now"]

RefusalReason = Literal["no_event", "not_dead_lettered", "settled", "claimed", "nothing_to_retry"]


class OperatorAction(msgspec.Struct, frozen=True):
    """An operator's action on one event, as the store recorded it.

    ``action``: ``redrive`` (a dead letter's failures reset, its lane
    unblocked), ``skip`` (marked processed without running) or ``retry_now``
    (its session's drain woken). ``by`` and ``reason`` are the operator's
    words; ``at_ms`` is the store's clock when it committed.
    """

    action: ActionKind
    session_id: str
    index: int
    by: str
    reason: str
    at_ms: int


class OperatorActionError(ValueError):
    """An operator action refused for its target; nothing was written.

    ``reason``: ``no_event`` (the session has no such index),
    ``not_dead_lettered`` (redrive of an event that is not a dead letter),
    ``settled`` (skip of an event already processed), ``claimed`` (a live
    claim holds it: wait for the attempt, or for its lease to lapse) or
    ``nothing_to_retry`` (retry now on a session with nothing claimable).
    The message names the target (``index`` is None for a whole session)
    and then ``detail``.
    """

    def __init__(
        self, reason: RefusalReason, session_id: str, index: int | None, detail: str
    ) -> None:
        self.reason: RefusalReason = reason
        self.session_id = session_id
        self.index = index
        self.detail = detail
        where = f"session {session_id!r}"
        super().__init__(f"{where if index is None else f'event {index} of {where}'} {detail}")


OperatorActionError.__module__ = "a2trio"


@runtime_checkable
class PresenceStore(Protocol):
    """The presence capability: field-wise LWW registers with a TTL."""

    @property
    def push(self) -> bool:
        """True when :meth:`subscribe` delivers patches as they apply (push tier);
        False for the degraded tier, where the server re-reads and diffs."""
        ...

    async def set(
        self,
        session_id: str,
        participant: str,
        values: dict[str, Any],
        *,
        seen: int,
        at_ms: int,
        ttl_ms: int,
    ) -> StoredPresencePatch | None:
        """Apply each field with LWW on ``at_ms``; a ``None`` value deletes the field.

        Returns the patch of fields that applied (None if none did) and delivers
        it to local subscribers before returning. Expiry is ``now + ttl_ms`` on
        the store's clock.
        """
        ...

    async def read(self, session_id: str) -> list[PresenceRow]:
        """The live rows (expired ones pruned), ordered by participant, field."""
        ...

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        """Call ``on_patch`` for each applied patch until the returned function is
        called. ``on_patch`` must not block. Degraded-tier stores may never call it."""
        ...


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


@runtime_checkable
class Store(Protocol):
    """What a backend implements. See the module docstring for the obligations.

    Lifecycle: constructing a store does no I/O. ``async with store:`` gives it
    a nursery for background work (a notification listener); it may be entered
    by several servers at once and stays open until the last one leaves.
    ``aclose()`` releases what the store created and is idempotent.
    """

    @property
    def clock(self) -> Clock:
        """The clock the store stamps times with (a server's default clock)."""
        ...

    @property
    def presence(self) -> PresenceStore | None:
        """The presence capability, or None."""
        ...

    @property
    def inspect(self) -> Inspection | None:
        """The inspection capability, or None."""
        ...

    async def __aenter__(self) -> Store: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def aclose(self) -> None:
        """Release connections and files the store opened. Idempotent."""
        ...

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append atomically (see the obligations). An empty batch only reports
        ``has_pending`` (and claims nothing). With ``claim``, also claim the
        eligible set in the same transaction (see :class:`ClaimRequest`).

        With ``expected_index``, commit only if the session's last index is
        still ``expected_index`` (0: empty), checked in the append's own
        transaction after the replay verdict and the fence: a batch whose ids
        are all stored replays whatever the index. Otherwise raise
        ``A2Error(INDEX_CONFLICT)`` (``details``: ``expected`` and ``index``,
        the frontier found) and write nothing."""
        ...

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """The row stored under ``event_id`` if it is in ``session_id``, else
        None (an id in another session is not this session's)."""
        ...

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """Events with ``after_index < index <= through_index``, in order."""
        ...

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        """Claim every eligible event (unprocessed, not dead, lane-ready, claim free
        or expired, not excluded) for ``holder`` until ``now + ttl_ms`` (or
        ``expires_at_ms``), advancing each ``attempt_count``: with ``limit``,
        at most that many, lowest indexes first (the rest stay claimable)."""
        ...

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """Extend live claims this holder owns at these attempts; report the ones a
        newer attempt owns. An expired claim is neither renewed nor superseded."""
        ...

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        """Mark the event processed by ``attempt`` and append its returned events
        (with ids, cause ``(index, attempt)``) in one transaction; hand the lane
        on. A repeat by the same attempt with the same ids replays."""
        ...

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
    ) -> FailResult:
        """Record a failure of ``attempt``, release the claim, dead-letter at
        ``max_failures``. Repeats by the same attempt are idempotent."""
        ...

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """The reducer's snapshot and the events after it."""
        ...

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """:meth:`read_state` for many sessions, aligned with ``session_ids``."""
        ...

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """Store a snapshot unless one at a higher or equal index exists."""
        ...

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        """A live feed of events after ``start_after``: catch up, then follow."""
        ...


@runtime_checkable
class WatchesPending(Protocol):
    """The optional cross-process wake-up capability (the Postgres store).

    A server that runs handlers checks for it once when it opens, so work that
    another process appends starts here at once instead of at a watchdog.
    """

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(key)`` when another process appends to the session
        stored under ``key``; return the function that stops it. Only inside
        ``async with store``; echoes of this store's own writes are skipped."""
        ...


@runtime_checkable
class SweepsClaimable(Protocol):
    """The optional sweep capability: which sessions hold work a claim would
    take now, so work stranded by a crashed process is found without an append
    or a scheduler (memory, SQLite and Postgres have it).
    """

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """Up to ``limit`` session keys starting with ``prefix``, in key order,
        holding an event that is unprocessed, not dead-lettered, lane-ready,
        with no live claim, and, after a failure, past its retry backoff
        (:func:`a2trio.stores.rules.retry_backoff_ms`).

        Obligation: bounded by the work pending, not by the history (an index
        over pending events). A key returned may hold nothing to claim by the
        time a drain looks: the drain's claim decides.
        """
        ...


@runtime_checkable
class OperatorActions(Protocol):
    """The optional operator capability (memory, SQLite, Postgres, Redis):
    dead letters across sessions, and the actions that repair a session,
    each recorded with who and why.

    Every action is durable and fenced: it reads the target's row and writes
    its verdict (``rules.check_action``) atomically, so a live claim
    (unexpired on the store's clock) always refuses it and a handler's later
    completion or failure of a skipped event is ``superseded``. A refused
    action raises :class:`OperatorActionError` and writes nothing. A written
    action wakes other processes' drains of the session where the store has
    cross-process wake-up (``WatchesPending``); a sweep finds it otherwise.
    """

    async def dead_letters(
        self, prefix: str, *, limit: int, after: tuple[str, int] | None = None
    ) -> list[StoredEvent]:
        """Up to ``limit`` dead-lettered events of sessions whose key starts
        with ``prefix``, ordered by (session key, index), after ``after``.

        Obligation: bounded by the dead letters, not by the history (an
        index over dead rows)."""
        ...

    async def redrive(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """Put a dead letter back in line: failures reset to 0, no longer dead
        (its lane unblocked), claimable at once; the error history stays.

        Raises:
          OperatorActionError: ``no_event``, ``not_dead_lettered``, ``claimed``.
        """
        ...

    async def skip(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """Mark an unprocessed event processed without running it (by no
        attempt; no longer dead), handing its lane on.

        Raises:
          OperatorActionError: ``no_event``, ``settled``, ``claimed``.
        """
        ...

    async def retry_now(self, session_id: str, *, by: str, reason: str) -> list[OperatorAction]:
        """Record a retry of every event a claim would take now, ignoring
        failure backoff (unprocessed, alive, lane-ready, no live claim), one
        action each, and wake drains of the session. Rows are not changed.

        Raises:
          OperatorActionError: ``claimed`` (every candidate is under a live
            claim), ``nothing_to_retry``.
        """
        ...

    async def read_actions(
        self, session_id: str, *, after_index: int, through_index: int
    ) -> list[OperatorAction]:
        """The actions recorded on events in ``(after_index, through_index]``,
        by index, then in the order they were recorded."""
        ...


def replay(events: Sequence[AppendEvent], stored: Sequence[StoredEvent]) -> list[StoredEvent]:
    """The stored rows of an idempotent re-append, in the batch's order.

    ``stored`` holds the rows of every id in ``events`` (any order). A re-append
    must name the same types as the original: a different type under a stored
    id is a collision, not a replay (``PARTIAL_DUPLICATE_BATCH``).
    """
    by_id = {row.id: row for row in stored}
    replayed = []
    for event in events:
        row = by_id[event.id or ""]
        if row.type != event.type:
            raise A2Error(
                ErrorCode.PARTIAL_DUPLICATE_BATCH,
                f"event id {row.id!r} is already stored with type {row.type!r}, not {event.type!r}",
            )
        replayed.append(row)
    return replayed
