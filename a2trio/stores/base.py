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
* **Claims** are fenced by ``attempt``: completion, failure, release and
  renewal of an attempt that is no longer the latest report ``superseded``
  and change nothing.
* **Not before**: an event whose stored ``not_before_ms`` is still to come
  is claimed by no claim and found by no sweep (``rules.ripe``).
* **Snapshots** never move backwards.
* **Trimmed** sessions (``Retention.trim``) keep their events above the trim
  point and their last one. ``read``, ``stream`` (its ``start_after``) and
  ``read_state(s)`` (from the snapshot, or from 0 without one) whose range
  starts below the trim point raise ``A2Error(TRIMMED)`` (``rules.check_read``)
  rather than answer a gap; ``inspect.read_events`` answers what is stored,
  its first row past the trim point.
* **Presence** is field-wise last-writer-wins on the sender's ``at`` (ties go
  to the incoming write); expiry runs on the store's own clock.
* Every timestamp comes from the store's injected :class:`~a2trio.Clock`.
* Any backend failure surfaces as ``A2Error(STORE_UNAVAILABLE)`` with the
  original as ``__cause__``, from every async method of the store and of its
  capabilities (presence, inspection, sweep, operator actions), translated
  inside the store at one point (``a2trio.errors.store_unavailable``): the
  engine passes a store's errors on untouched and translates none of them.

Optional capabilities are attributes of the store, each the capability
object or None: ``presence`` (:class:`PresenceStore`), ``inspect``
(:class:`Inspection`), ``sweep`` (:class:`SweepsClaimable`), ``pending``
(:class:`WatchesPending`), ``operator`` (:class:`OperatorActions`),
``retention`` (:class:`Retention`), ``transactions``
(:class:`AppTransactions`: the app's own transaction) and ``journal``
(:class:`Journal`: durable handlers' steps). A caller looks once,
tests for None and calls the object; a backend points
each at the part of it that does the work, or sets None.

Cancellation: every async operation is a checkpoint. A cancelled operation
either committed entirely or not at all, and never leaves a connection
mid-transaction; retrying with the same ids is always safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from ..clock import Clock
from .feed import Feed
from .inspection import Inspection
from .journal import Journal, JournalEntry
from .records import (
    ActionKind,
    AppendEvent,
    AppendResult,
    Busy,
    Claimed,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    EventCause,
    EventPage,
    FailedAttempt,
    FailResult,
    OperatorAction,
    OperatorActionError,
    PresenceRow,
    RefusalReason,
    ReleaseResult,
    RenewResult,
    SessionPage,
    SessionSummary,
    Settled,
    Snapshot,
    SnapshotInfo,
    StateRead,
    StoredEvent,
    StoredPresencePatch,
    replay,
)
from .retention import (
    ArchivedSnapshot,
    Erased,
    Retention,
    RetentionError,
    RetentionRefusal,
    SessionArchive,
    Trimmed,
)

__all__ = [
    "ActionKind",
    "AppTransactions",
    "AppendEvent",
    "AppendResult",
    "ArchivedSnapshot",
    "Busy",
    "ClaimRef",
    "ClaimRequest",
    "ClaimResult",
    "Claimed",
    "CompleteResult",
    "Erased",
    "EventCause",
    "EventPage",
    "FailResult",
    "FailedAttempt",
    "Feed",
    "Inspection",
    "Journal",
    "JournalEntry",
    "OperatorAction",
    "OperatorActionError",
    "OperatorActions",
    "PresenceRow",
    "PresenceStore",
    "RefusalReason",
    "ReleaseResult",
    "RenewResult",
    "Retention",
    "RetentionError",
    "RetentionRefusal",
    "SessionArchive",
    "SessionPage",
    "SessionSummary",
    "Settled",
    "Snapshot",
    "SnapshotInfo",
    "SqlValue",
    "StateRead",
    "Store",
    "StoreTransaction",
    "StoredEvent",
    "StoredPresencePatch",
    "SweepsClaimable",
    "Trimmed",
    "WatchesPending",
    "replay",
]


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

    @property
    def sweep(self) -> SweepsClaimable | None:
        """The sweep capability (which sessions hold claimable work), or None."""
        ...

    @property
    def pending(self) -> WatchesPending | None:
        """The cross-process wake-up capability, or None."""
        ...

    @property
    def operator(self) -> OperatorActions | None:
        """The operator capability (dead letters, redrive, skip, retry now), or None."""
        ...

    @property
    def retention(self) -> Retention | None:
        """The retention capability (export, erase, trim a session), or None."""
        ...

    @property
    def transactions(self) -> AppTransactions | None:
        """The app transaction capability (SQLite, Postgres), or None."""
        ...

    @property
    def journal(self) -> Journal | None:
        """The durable handlers' journal (``ctx.step``), or None."""
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
        retry_after_ms: int | None = None,
    ) -> FailResult:
        """Record a failure of ``attempt``, release the claim, dead-letter at
        ``max_failures``. Repeats by the same attempt are idempotent.

        ``retry_after_ms`` (a per-handler backoff, issue 33): a recorded
        failure that does not dead-letter stores the not-before ``now +
        retry_after_ms`` (``result.retry_at_ms``), so no claim takes the event
        before it (``rules.ripe``). None, or a dead letter, stores none: the
        seed's rule (a drain may retry at once, the sweep waits out
        ``rules.retry_backoff_ms``).

        A failure that records (not a repeat, not superseded) also records a
        :class:`FailedAttempt` (the attempt, ``error``, now, the claim's
        holder and claim time) in the same transaction, where inspection
        reads it (:meth:`Inspection.read_failures`), keeping the latest
        :data:`~a2trio.stores.rules.MAX_FAILED_ATTEMPTS` of the event: the
        row itself keeps the last one only. Nothing else writes or reads
        that history, so a run without failures never touches it."""
        ...

    async def release_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        delay_ms: int | None,
        wake_on: Sequence[str] = (),
        seen_through: int | None = None,
    ) -> ReleaseResult:
        """Give up ``attempt``'s claim without counting a failure, the event
        claimable again from ``now + delay_ms`` (``not_before_ms``; None:
        ``rules.NEVER_MS``, no wake time), by a later attempt
        (``attempt_count`` advances at that claim). Fenced by
        ``rules.release_verdict``: only the attempt holding the claim (a
        lapsed but untaken claim still holds) releases; anything else is
        ``superseded`` and writes nothing. An a2trio addition (issue 33).

        ``wake_on`` (a suspended durable wait, issue 34): event types stored
        with the row as its wake mark; an event of one of them landing in
        the session later (an append, a completion's returned events) clears
        the not-before and the mark in its own transaction
        (``rules.wake_verdict``), so the event is claimable at once. With
        ``seen_through`` (the last index the attempt read), one that landed
        after it already (``rules.wakes``) releases claimable at once
        (``not_before_ms`` now) with no mark. A later claim makes the mark
        stale; any write that meets a stale mark may drop it.

        Raises:
          ValueError: no event at ``index``.
        """
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


class WatchesPending(Protocol):
    """The optional cross-process wake-up capability (``store.pending``:
    Postgres, Redis).

    A server that runs handlers checks for it once when it opens, so work that
    another process appends starts here at once instead of at a watchdog.
    """

    def watch_pending(self, on_session: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_session(key)`` when another process appends to the session
        stored under ``key``; return the function that stops it. Only inside
        ``async with store``; echoes of this store's own writes are skipped."""
        ...


class SweepsClaimable(Protocol):
    """The optional sweep capability (``store.sweep``): which sessions hold
    work a claim would take now, so work stranded by a crashed process is
    found without an append or a scheduler (memory, SQLite, Postgres, Redis).
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


class OperatorActions(Protocol):
    """The optional operator capability (``store.operator``: memory, SQLite,
    Postgres, Redis): dead letters across sessions, and the actions that
    repair a session, each recorded with who and why.

    Every action is durable and fenced: it reads the target's row and writes
    its verdict (``rules.check_action``) atomically, so a live claim
    (unexpired on the store's clock) always refuses it and a handler's later
    completion or failure of a skipped event is ``superseded``. A refused
    action raises :class:`OperatorActionError` and writes nothing. A written
    action wakes other processes' drains of the session where the store has
    cross-process wake-up (``store.pending``); a sweep finds it otherwise.
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

    async def wake(self, session_id: str, index: int, *, by: str, reason: str) -> OperatorAction:
        """Make a suspended attempt's event claimable at once (issue 34): its
        not-before and its wake mark cleared (``rules.check_wake``).

        Raises:
          OperatorActionError: ``no_event``, ``settled``, ``claimed``,
            ``not_waiting``.
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


#: A parameter of an app's own statement in an app transaction: bytes are a
#: blob (``bytea`` on Postgres), a bool an integer on SQLite.
SqlValue = str | int | float | bool | bytes | None


class StoreTransaction(Protocol):
    """One app transaction open on a store (:meth:`AppTransactions.begin`):
    the app's own statements and its appends, on one connection, committed
    together when the block ends. One statement runs at a time (tasks that
    share it take turns)."""

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """Run one of the app's statements (the database's own placeholders:
        ``$1`` on Postgres, ``?`` on SQLite).

        Raises:
          SqlError: the database refused it, or it ended the transaction
            (``commit`` or ``rollback``: the block's to do).
          A2Error: ``STORE_UNAVAILABLE``, the connection failed.
          TypeError: a parameter that is not a :data:`SqlValue`.
        """
        ...

    async def fetch(self, sql: str, params: Sequence[SqlValue] = ()) -> list[tuple[Any, ...]]:
        """:meth:`execute`, returning the statement's rows."""
        ...

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        expected_index: int | None = None,
    ) -> AppendResult:
        """:meth:`Store.append` inside the transaction: the same verdicts
        (replay, partial duplicate, the cause fence, ``expected_index``) and
        indexes, nothing claimed. Its rows stay invisible to every other
        reader, claim and feed until the commit, and vanish with a rollback.
        Appends to a session wait for the transactions that appended to it
        first."""
        ...


class AppTransactions(Protocol):
    """The optional app transaction capability (``store.transactions``:
    SQLite, Postgres): the transactional outbox, an app's own rows and its
    events committed together or not at all."""

    def begin(self) -> AbstractAsyncContextManager[StoreTransaction]:
        """Open a transaction for the block: a block that ends normally
        commits it, then wakes the store's feeds of the sessions it appended
        to; one that raises, or is cancelled, rolls it back (a cancelled
        commit committed entirely or not at all, like any write).

        Raises:
          SqlError: at the end of the block, the transaction was aborted by
            an earlier error and rolled back.
          A2Error: ``STORE_UNAVAILABLE``.
        """
        ...
