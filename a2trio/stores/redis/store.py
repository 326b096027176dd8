"""The Redis store itself: :class:`RedisStore` and :func:`redis`.

The store's lifecycle (its nursery, ``async with store``, ``aclose()``), the
appends and completions (the scripts that insert events, whose rows it hands
to local feeds), the reads and snapshots, and the public face of the parts it
composes: ``claims``, ``operator``, ``presence``, ``inspection`` and the
``subscriber``, all over one ``conn`` (the capabilities are those parts:
``store.sweep`` the claims, ``store.pending`` the subscriber). The package
docstring (``a2trio.stores.redis``) has the theory of operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import trio

from ...clock import SYSTEM_CLOCK, Clock
from ...ids import IdSource, random_id
from ...timings import DEFAULT_TIMINGS, Timings
from .. import rules as verdicts
from ..base import (
    AppendEvent,
    AppendResult,
    AppTransactions,
    ClaimRef,
    ClaimRequest,
    ClaimResult,
    CompleteResult,
    EventCause,
    FailResult,
    Journal,
    OperatorActions,
    ReleaseResult,
    RenewResult,
    StateRead,
    StoredEvent,
    SweepsClaimable,
    WatchesPending,
)
from ..feed import Feed, FeedStatistics, Wakeups
from ..group import GroupStatistics
from ..tasks import StoreTasks
from . import codec
from . import scripts as lua
from .claims import RedisClaims
from .codec import Keys
from .conn import Connection, errors
from .inspection import RedisInspection
from .journal import RedisJournal
from .operator import RedisOperator
from .presence import RedisPresence
from .retention import RedisRetention
from .subscriber import Subscriber, SubscriberStatistics

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["RedisStore", "redis"]

_SCHEMES = ("redis://", "rediss://", "unix://")


class RedisStore:
    """A :class:`~a2trio.stores.Store` on Redis, with presence (push tier),
    inspection, the sweep, cross-process wake-ups and operator actions.

    Build it with :func:`redis`. Attributes: ``url``, ``key_prefix``,
    ``clock``, ``timings``, ``presence``, ``inspect``, ``sweep`` (the claims
    part), ``pending`` (the shared subscriber), ``operator``.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "a2",
        clock: Clock | None = None,
        ids: IdSource | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        connect_timeout_s: float = 5.0,
        command_timeout_s: float | None = 10.0,
    ) -> None:
        if not url.startswith(_SCHEMES):
            raise ValueError(f"Redis URL {url!r} must start with redis://, rediss:// or unix://")
        if not key_prefix or ":" in key_prefix:
            raise ValueError(f"key_prefix {key_prefix!r} must be non-empty and without ':'")
        self.url = url
        self.key_prefix = key_prefix
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        self.timings = timings
        self._new_id: IdSource = random_id if ids is None else ids
        self._conn = Connection(
            url, connect_timeout_s=connect_timeout_s, command_timeout_s=command_timeout_s
        )
        self._origin = random_id()
        self._keys = Keys(key_prefix)
        self._wakeups = Wakeups()
        self._tasks = StoreTasks("Redis store")
        self._entered = 0
        # Presence is built next, on this subscriber: the callbacks find it then.
        self._subscriber = Subscriber(
            conn=self._conn,
            keys=self._keys,
            origin=self._origin,
            timings=timings,
            tasks=self._tasks,
            wakeups=self._wakeups,
            on_presence=lambda session_id, patch: self.presence.deliver(session_id, patch),
            repaint=lambda: self.presence.repaint(),
        )
        self.presence = RedisPresence(
            self._conn, self._keys, self.clock, self._origin, self._subscriber
        )
        self.inspect = RedisInspection(self._conn, self._keys)
        self._claims = RedisClaims(self._conn, self._keys, self.clock)
        self.sweep: SweepsClaimable = self._claims
        self.pending: WatchesPending = self._subscriber
        self.operator: OperatorActions = RedisOperator(
            self._conn, self._keys, self.clock, self._origin
        )
        self.retention: RedisRetention = RedisRetention(self._conn, self._keys, self.clock)
        self.journal: Journal = RedisJournal(self._conn, self._keys, self.clock)
        #: No app transactions: ``Server.transaction`` raises ``TRANSACTIONS_NOT_SUPPORTED``.
        self.transactions: AppTransactions | None = None

    def __repr__(self) -> str:
        return f"RedisStore(key_prefix={self.key_prefix!r})"

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> RedisStore:
        """Open the store's task nursery (``tasks``) and its client on the
        first entry.

        Nested entries share them; they close with the outermost exit, which
        must happen in the task that entered first. No I/O happens here.

        Cancellation: opens no connection; if cancelled, nothing is left open.
        """
        if self._conn.closed:
            raise trio.ClosedResourceError("this Redis store was closed: create a new one")
        if self._entered == 0:
            nursery = await self._tasks.enter()
            try:
                await nursery.start(self._conn.serve)
            except BaseException:
                await self._stop_tasks()
                raise
        self._entered += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered -= 1
        if self._entered > 0:
            return
        await self._stop_tasks()

    def _forget_tasks(self) -> None:
        self._conn.forget()
        self._subscriber.forget()

    async def _stop_tasks(self) -> None:
        """End the store's tasks and leave the nursery ``__aenter__`` opened."""
        self._forget_tasks()
        await self._tasks.exit()

    async def aclose(self) -> None:
        """Close both connections; sever every feed with ``STORE_UNAVAILABLE``.
        Idempotent; later operations raise ``STORE_UNAVAILABLE``.

        Inside ``async with store`` it cancels the store's tasks (their
        connections close as they end), never the block itself: the block goes
        on, and its next operation raises ``STORE_UNAVAILABLE``. The nursery
        ``__aenter__`` opened is left to the block's exit, so feeds open in
        the block are not misnested.

        Cancellation: a checkpoint; the connections are closed either way.
        """
        self._conn.close()
        self._forget_tasks()
        try:
            if self._entered > 0:
                await self._tasks.close()
            else:
                await self._stop_tasks()
        finally:
            self._wakeups.notify_all()
        await trio.lowlevel.checkpoint()

    @property
    def listening(self) -> bool:
        """Whether the shared subscriber is connected: feeds follow wake-ups."""
        return self._subscriber.listening

    async def wait_listening(self) -> None:
        """Wait until the shared subscriber is connected (tests, readiness probes).

        Starts it if the store is entered. Cancellation: a plain wait.
        """
        await self._subscriber.wait_listening()

    def feed_statistics(self) -> FeedStatistics:
        """Live feeds and presence subscribers (leak checks in tests)."""
        stats = self._wakeups.statistics()
        return FeedStatistics(
            listeners=stats.listeners + self.presence.subscriber_count(), keys=stats.keys
        )

    def subscriber_statistics(self) -> SubscriberStatistics:
        """What the shared subscriber did (tests, debugging)."""
        return self._subscriber.statistics()

    def pipeline_statistics(self) -> GroupStatistics:
        """How calls inside ``async with store`` were pipelined (tests,
        benchmarks; ``conn``): ``groups`` round trips for ``members`` calls."""
        return self._conn.pipeline_statistics()

    # -- writes and local feeds -------------------------------------------------

    def _wrote(self, session_id: str, rows: list[StoredEvent]) -> None:
        """A local write committed: hand its rows to local feeds (the
        subscriber skips this store's own wake-ups)."""
        self._wakeups.notify(session_id, rows)

    async def _insert(self, what: str, source: str, session_id: str, args: list[Any]) -> Any:
        """A write that may insert (``APPEND``, ``COMPLETE``): if it ends
        without handing its rows over (an error or cancellation, maybe after
        the script ran), local feeds read instead."""
        try:
            with errors(what):
                return await self._conn.run(source, self._keys.write_keys(session_id), args)
        except BaseException:
            self._wakeups.notify(session_id)
            raise

    # -- the Store protocol ------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[AppendEvent],
        *,
        claim: ClaimRequest | None = None,
        expected_index: int | None = None,
    ) -> AppendResult:
        """Append atomically in one script (see the package docstring); with
        ``claim``, the claimable events are written claimed; with
        ``expected_index``, only if the session is still at it.

        Cancellation: written entirely or not at all; retry with the same ids
        replays.
        """
        supplied = verdicts.supplied_ids(events) if events else []
        ids = [e.id or self._new_id() for e in events]
        now = self.clock.now_ms()
        holder, expires_at = ("", 0) if claim is None else (claim.holder, now + claim.ttl_ms)
        args: list[Any] = [
            session_id,
            now,
            self._origin,
            holder,
            expires_at,
            self._keys.key(session_id, "notify"),
            self._keys.global_key("pending"),
            len(events),
            len(supplied),
            "" if expected_index is None else expected_index,
            *supplied,
            *codec.append_args(events, ids, now),
        ]
        reply = await self._insert("append", lua.APPEND, session_id, args)
        verdict = reply[0]
        if verdict == b"pending":
            return AppendResult([], bool(reply[1]))
        if verdict == b"replay":
            # The duplicate verdict before the fence, as in the seed.
            replayed = verdicts.replayed_batch(
                session_id, events, codec.stored(session_id, reply[3:])
            )
            return AppendResult(replayed, bool(reply[1]), [], bool(reply[2]))
        if verdict == b"missing":
            raise verdicts.no_event(session_id, int(reply[1]))
        if verdict == b"superseded":
            cause = events[int(reply[1]) - 1].cause
            assert cause is not None
            raise verdicts.superseded_attempt(session_id, cause)
        if verdict == b"stale":
            assert expected_index is not None
            raise verdicts.stale_index(session_id, expected_index, int(reply[1]))
        _, base, had_pending, others_claimable, claimed_indexes = reply
        claimed_set = {int(i) for i in claimed_indexes}
        inserted = codec.appended_rows(
            session_id, events, ids, int(base), now, claimed_set, holder, expires_at
        )
        self._wrote(session_id, inserted)
        return AppendResult(
            inserted,
            verdicts.has_pending(bool(had_pending), events),
            [row for row in inserted if row.index in claimed_set],
            bool(others_claimable),
        )

    async def _read(
        self, session_id: str, after: int, through: int | None, watch_ttl_ms: int = 0
    ) -> list[StoredEvent]:
        """``READ``; with ``watch_ttl_ms`` (a feed's read) it sets the
        session's watched marker to that TTL too."""
        with errors("read"):
            flat = await self._conn.run(
                lua.READ,
                [
                    self._keys.key(session_id, "log"),
                    self._keys.key(session_id, "meta"),
                    self._keys.key(session_id, "watched"),
                ],
                [after, "+" if through is None else through, watch_ttl_ms],
            )
            rows = codec.rows(session_id, flat)
            await self.retention.check_read(session_id, after, through, rows)
        return rows

    async def read(
        self,
        session_id: str,
        *,
        after_index: int | None = None,
        through_index: int | None = None,
    ) -> list[StoredEvent]:
        """Events in ``(after_index, through_index]`` (``XRANGE``). Cancellation: a read."""
        after = max(0, after_index or 0)
        through = None if through_index is None else max(0, through_index)
        return await self._read(session_id, after, through)

    async def find_event(self, session_id: str, event_id: str) -> StoredEvent | None:
        """See :meth:`Store.find_event`: one ``HGET`` of the id index and the
        row, in one script. Cancellation: a read."""
        with errors("read"):
            flat = await self._conn.run(
                lua.FIND,
                [*self._keys.session_keys(session_id), self._keys.global_key("ids")],
                [session_id, event_id],
            )
        rows = [row for row in codec.stored(session_id, flat) if row.session_id == session_id]
        return rows[0] if rows else None

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
        """Claim the eligible set in one script (with ``limit``, at most that
        many, lowest indexes first).

        Cancellation: claimed or not; an orphaned claim expires and a later
        drain takes the next attempt.
        """
        return await self._claims.claim_available(
            session_id,
            holder=holder,
            ttl_ms=ttl_ms,
            expires_at_ms=expires_at_ms,
            exclude=exclude,
            limit=limit,
        )

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """Extend this holder's live claims in one script (the seed's ``renewClaims``).

        Cancellation: renewed or not; the heartbeat retries.
        """
        return await self._claims.renew_claims(
            session_id, holder=holder, claims=claims, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms
        )

    async def complete_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        events: Sequence[AppendEvent],
    ) -> CompleteResult:
        """Mark processed, append the returned events, hand the lane on: one script.

        Cancellation: written entirely or not at all; a repeat by the same
        attempt with the same ids replays.
        """
        returned = verdicts.returned_ids(events)
        now = self.clock.now_ms()
        cause = EventCause(index, attempt)
        args: list[Any] = [
            session_id,
            index,
            attempt,
            now,
            self._origin,
            codec.encode(returned),
            self._keys.key(session_id, "notify"),
            self._keys.global_key("pending"),
            len(events),
            self._keys.flow_prefix,
            *codec.complete_args(events, returned, now, cause),
        ]
        reply = await self._insert("complete", lua.COMPLETE, session_id, args)
        outcome = reply[0]
        if outcome == b"missing":
            raise verdicts.no_event(session_id, index)
        if outcome == b"superseded":
            return CompleteResult("superseded")
        if outcome == b"duplicate":
            raise verdicts.returned_id_taken()
        if outcome == b"replay":
            processed_by, returned_json = reply[1], reply[2]
            previous = None if returned_json is None else codec.decode_ids(returned_json)
            by_attempt = None if processed_by is None else int(processed_by)
            if not verdicts.replays_completion(attempt, returned, by_attempt, previous):
                return CompleteResult("superseded")
            stored = codec.stored(session_id, reply[3:])
            replayed = verdicts.replayed_completion(session_id, index, attempt, events, stored)
            return CompleteResult("completed", replayed)
        _, base, drained = reply
        inserted = codec.returned_rows(session_id, events, returned, int(base), now, cause)
        if inserted:
            self._wrote(session_id, inserted)
        return CompleteResult("completed", inserted, bool(drained))

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
        """Record a failure: ``rules.fail_verdict`` over the row as read,
        written back by a compare-and-set script (retried if the row moved).

        Cancellation: recorded or not; a repeat by the same attempt is idempotent.
        """
        return await self._claims.fail_attempt(
            session_id,
            index=index,
            attempt=attempt,
            error=error,
            max_failures=max_failures,
            retry_after_ms=retry_after_ms,
        )

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
        """``rules.release_verdict`` over the row as read, written back by a
        compare-and-set (issue 33; see :meth:`Store.release_attempt`).

        Cancellation: released or not; a repeat is ``superseded``.
        """
        return await self._claims.release_attempt(
            session_id,
            index=index,
            attempt=attempt,
            delay_ms=delay_ms,
            wake_on=wake_on,
            seen_through=seen_through,
        )

    # -- state and feeds -------------------------------------------------------

    async def read_state(self, session_id: str, reducer: str) -> StateRead:
        """The snapshot and the events after it, in one script. Cancellation: a read."""
        [state] = await self.read_states([session_id], reducer)
        return state

    async def read_states(self, session_ids: Sequence[str], reducer: str) -> list[StateRead]:
        """:meth:`read_state` for many sessions in one script. Cancellation: a read."""
        if not session_ids:
            await trio.lowlevel.checkpoint()
            return []
        keys = [self._keys.key(sid, s) for sid in session_ids for s in ("snap", "log", "meta")]
        with errors("read state"):
            flat = await self._conn.run(lua.READ_STATES, keys, [reducer])
        states = []
        for n, sid in enumerate(session_ids):
            snap, rows = flat[2 * n], flat[2 * n + 1]
            snapshot = None if snap is None else codec.snapshot(snap)
            events = codec.rows(sid, rows)
            after = 0 if snapshot is None else snapshot.index
            verdicts.check_read(sid, after, None, events[0].index if events else None)
            states.append(StateRead(snapshot, events))
        return states

    async def put_snapshot(self, session_id: str, reducer: str, index: int, state: Any) -> None:
        """The guarded write: never moves a snapshot backwards.

        Cancellation: written or not; rewriting is harmless.
        """
        with errors("put snapshot"):
            await self._conn.run(
                lua.PUT_SNAPSHOT,
                [self._keys.key(session_id, "snap")],
                [reducer, index, self.clock.now_ms(), codec.encode(state)],
            )

    def stream(
        self, session_id: str, *, start_after: int = 0
    ) -> AbstractAsyncContextManager[Feed[StoredEvent]]:
        """A live feed: subscribe, catch up, then follow wake-ups (see
        ``subscriber``). Outside ``async with store`` it polls adaptively."""
        return self._subscriber.open_feed(
            session_id,
            start_after,
            lambda after, watch_ttl_ms: self._read(session_id, after, None, watch_ttl_ms),
        )


def redis(
    url: str,
    key_prefix: str = "a2",
    clock: Clock | None = None,
    ids: IdSource | None = None,
    *,
    timings: Timings = DEFAULT_TIMINGS,
    connect_timeout_s: float = 5.0,
    command_timeout_s: float | None = 10.0,
) -> RedisStore:
    """Create a Redis store. Does no I/O: connections open inside ``async with
    store`` (or per operation outside it).

    Args:
      url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS)
        or ``unix:///path.sock``. A single instance or a non-cluster
        provider: cluster mode is out (the scripts span keys).
      key_prefix: every key and channel starts with ``<key_prefix>:``, so
        several apps (or test runs) share one Redis. No colon in it.
      clock: where every stored timestamp comes from (default: system time).
      ids: generates the ids of events appended without one (default:
        :func:`~a2trio.ids.random_id`). The store's instance id, which tags
        its wake-ups so it skips its own echoes, is always random.
      timings: ``notify_safety_s`` sets the safety re-read and the watched
        marker's TTL (three times it); ``poll_active_s``/``poll_idle_s`` the
        polling cadence outside ``async with store``.
      connect_timeout_s: each connection attempt fails after this long, as
        ``STORE_UNAVAILABLE``.
      command_timeout_s: a reply that takes longer is ``STORE_UNAVAILABLE``
        (the command may still have run: retrying with the same ids replays).

    Raises:
      ValueError: a URL of another scheme, or a key prefix with a colon.
    """
    return RedisStore(
        url,
        key_prefix=key_prefix,
        clock=clock,
        ids=ids,
        timings=timings,
        connect_timeout_s=connect_timeout_s,
        command_timeout_s=command_timeout_s,
    )
