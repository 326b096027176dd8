"""Group commit: writes that arrive close together share one transaction.

Theory of operation
-------------------

Every write of the Postgres store (an append, a claim that takes events, a
completion) and of the durable scheduler's queues (an insert, the delete
after a delivery, a lease renewal, a reschedule) is a small transaction, and
on a durable backend every commit waits for a flush; on Postgres every round
trip is also a send and a wake-up on both sides. Under load many arrive at
once: many drains claim and complete, a server arms watchdogs from every
drain, up to ``max_in_flight`` deliveries finish together. So
:class:`GroupCommit` queues the writes that arrive while others are in flight
and commits everything queued as one transaction (one round trip, one
flush), which its user's ``run_group`` builds; the Postgres store's
(``Database.run_group``) takes each session's lock before its first writer::

    begin; lock(s1); complete(s1, i, a); append(s1); claim(s1); claim(s2); lock(s3); ...; commit

Each member keeps its own fence: its statement checks its own guards (an
attempt and holder, a lease token) exactly as it would alone, so a write
whose fence moved on (a superseded completion, a renewal of a lease another
token took) only reports that, writing nothing, while the others commit.

**Where the work runs.** Each group runs in the task of one of its callers,
its *leader*: no background task, so no nursery that must outlive the callers
(a scheduler's lifetime is counted over bound servers, each in its own task,
and ``async with scheduler:`` blocks, any of which may end first).

* A caller that finds nothing in flight leads at once: it takes what is
  queued (itself included, oldest first, up to ``max_group``) and commits it,
  alone in its own task with no extra task switch when nothing else is queued.
* A caller that finds groups in flight but fewer than ``leaders`` takes a
  free slot and lets the scheduler run once before it takes the queue, so the
  callers woken with it join its group. Had it led at once, a burst's first
  writes would each commit alone while a slot was free, instead of in one
  group (measured on the Postgres store: ``docs/performance-postgres.md``).
* Otherwise it queues and waits. A leader that finishes promotes the oldest
  queued callers, one per free slot, and each leads the next group at once. A
  leader commits groups from the head of the queue until its own write has
  been taken, so it never serves more than the writes queued ahead of it.

**Order.** Inside a group, members run in key order, stable (each write's
``key``: the Postgres store's is its session and then completions and appends
before claims, so a claim sees what the group's completions and appends made
eligible; the scheduler's is the task id). Two groups (two processes) take
their locks in one order and cannot deadlock.

**Verdicts.** A group the backend *rejected* (one of ``rejected``: it rolled
back entirely) is replayed member by member in its leader's task, so each
caller gets its own answer. A group that failed otherwise (a lost connection)
may or may not have committed: every member fails with its own ``lost``
exception (:class:`GroupLost` unless given; the Postgres store's is
``PgConnectionError``, which its one error point makes ``STORE_UNAVAILABLE``)
chained to the cause, which is what each lone write would have seen. A write
committed alone raises what the backend raised. Retrying is safe because every
write is idempotent: a completion or an append replays (its ids are fixed
before it queues), a repeated claim finds its own live claim and reports
``Busy`` until it expires, inserting a queued task id does nothing, a
token-guarded write whose lease moved on does nothing.

**Cancellation.** An already-cancelled caller never queues. A caller
cancelled before its write was taken withdraws it (nothing is written) and
passes any promotion on. A caller cancelled while its group is in flight
cancels the group's transaction and waits, shielded, until that has settled
(prompt and bounded: the Postgres driver cancels the statement on the server
within a second and closes the connection; a sqlite call is interrupted), so
its write committed entirely or not at all before it sees ``Cancelled``. The
group's other members go back to the head of the queue and run again:
replaying a write that did commit changes nothing. A cancelled leader does the
same for the group it leads, then promotes the next caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec
import trio

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

__all__ = ["DEFAULT_LEADERS", "DEFAULT_MAX_GROUP", "GroupCommit", "GroupLost", "GroupStatistics"]

K = TypeVar("K", bound="SupportsRichComparison")
W = TypeVar("W")
R = TypeVar("R")

#: Groups in flight at once: a second one hides the first one's round trip.
DEFAULT_LEADERS = 2
#: Writes per transaction; a full queue is several groups.
DEFAULT_MAX_GROUP = 256


class GroupLost(Exception):
    """A group's transaction failed without a verdict (its connection was lost):
    it may or may not have committed. ``__cause__`` is the backend's error."""


class GroupStatistics(msgspec.Struct, frozen=True):
    """How writes were committed: ``groups`` transactions for ``members`` writes,
    the largest of ``largest``. Failed writes and groups, and the replays after
    a rejection, are not counted."""

    groups: int
    members: int
    largest: int


class _Member(Generic[K, W, R]):
    __slots__ = (
        "error",
        "finished",
        "key",
        "leading",
        "result",
        "scope",
        "signal",
        "taken",
        "withdrawn",
        "work",
    )

    def __init__(self, key: K, work: W) -> None:
        self.key = key
        self.work = work
        self.taken = False
        self.withdrawn = False
        self.leading = False
        self.scope: trio.CancelScope | None = None
        #: Set when the write is settled.
        self.finished = trio.Event()
        #: Set when settled or promoted to lead.
        self.signal = trio.Event()
        self.result: R | None = None
        self.error: Exception | None = None

    def finish(self, result: R | None = None, error: Exception | None = None) -> None:
        self.result = result
        self.error = error
        self.finished.set()
        self.signal.set()


class GroupCommit(Generic[K, W, R]):
    """Commits queued writes together (see the module docstring).

    Args:
      run_group: commits the given works, in order, as one transaction and
        returns each one's result.
      rejected: what ``run_group`` raises when the backend refused the
        transaction (it rolled back): the members are then replayed alone.
      lost: what each member of a group that failed otherwise raises (made
        from a message), with the backend's error as ``__cause__``.
      leaders: groups in flight at once.
      max_group: writes per group.
    """

    def __init__(
        self,
        run_group: Callable[[Sequence[W]], Awaitable[list[R]]],
        *,
        rejected: tuple[type[Exception], ...],
        lost: type[Exception] = GroupLost,
        leaders: int = DEFAULT_LEADERS,
        max_group: int = DEFAULT_MAX_GROUP,
    ) -> None:
        self._run_group = run_group
        self._rejected = rejected
        self._lost = lost
        self._leaders = leaders
        self._max_group = max_group
        self._pending: deque[_Member[K, W, R]] = deque()
        self._leading = 0
        self._groups = 0
        self._members = 0
        self._largest = 0

    def statistics(self) -> GroupStatistics:
        """Transactions committed and their sizes (tests, benchmarks)."""
        return GroupStatistics(self._groups, self._members, self._largest)

    async def submit(self, key: K, work: W) -> R:
        """Commit ``work`` (alone or with others queued) and return its result.

        Args:
          key: where ``work`` goes in its group (see the module docstring).

        Raises:
          What its lone replay raised after a rejected group, what the backend
          raised for a lone write, or ``lost``.

        Cancellation: a checkpoint; committed entirely or not at all (see
        the module docstring).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        member: _Member[K, W, R] = _Member(key, work)
        self._pending.append(member)
        gather = self._leading > 0
        try:
            while not member.finished.is_set():
                if not member.taken and self._leading < self._leaders:
                    await self._lead(member, gather=gather)
                else:
                    if member.signal.is_set():
                        # A promotion already acted on (or found no free slot).
                        member.signal = trio.Event()
                    await member.signal.wait()
                # A promoted caller leads at once: its queue has gathered.
                gather = False
        except BaseException:
            await self._abandon(member)
            raise
        if member.error is not None:
            raise member.error
        return member.result  # type: ignore[return-value]

    async def _abandon(self, member: _Member[K, W, R]) -> None:
        if member.finished.is_set():
            return
        if not member.taken:
            self._pending.remove(member)
            # It may have been promoted: pass that on.
            self._promote()
            return
        member.withdrawn = True
        # No scope: its group failed and its own replay has not begun (it will
        # be skipped).
        if member.scope is not None:
            member.scope.cancel(reason="a member's caller was cancelled")
        with trio.CancelScope(shield=True):
            await member.finished.wait()

    def _promote(self) -> None:
        free = self._leaders - self._leading
        for member in self._pending:
            if free <= 0:
                return
            # A queued leader (gathering, or behind a full group) holds its slot.
            if not member.leading:
                member.signal.set()
                free -= 1

    async def _lead(self, me: _Member[K, W, R], *, gather: bool) -> None:
        self._leading += 1
        me.leading = True
        try:
            if gather:
                # Let the callers scheduled with this one queue into its group.
                await trio.lowlevel.checkpoint()
            while not me.taken:
                group: list[_Member[K, W, R]] = []
                while self._pending and len(group) < self._max_group:
                    member = self._pending.popleft()
                    member.taken = True
                    group.append(member)
                await self._commit(group)
        finally:
            me.leading = False
            self._leading -= 1
            self._promote()

    def _requeue(self, ordered: list[_Member[K, W, R]]) -> None:
        again = [m for m in ordered if not m.withdrawn and not m.finished.is_set()]
        for member in reversed(again):
            member.taken = False
            member.scope = None
            self._pending.appendleft(member)

    async def _commit(self, group: list[_Member[K, W, R]]) -> None:
        ordered = sorted(group, key=lambda m: m.key)
        try:
            with trio.CancelScope() as scope:
                for member in ordered:
                    member.scope = scope
                await self._attempt(ordered)
            if scope.cancelled_caught:
                # A member withdrew and cancelled the transaction.
                self._requeue(ordered)
        except BaseException:
            # This leader was cancelled: the others run again under another.
            self._requeue(ordered)
            raise
        finally:
            for member in ordered:
                if member.withdrawn and not member.finished.is_set():
                    member.finish()

    async def _attempt(self, ordered: list[_Member[K, W, R]]) -> None:
        try:
            results = await self._run_group([m.work for m in ordered])
        except Exception as exc:
            if len(ordered) == 1:
                ordered[0].finish(error=exc)
                return
            if isinstance(exc, self._rejected):
                # From here a withdrawal cancels only that member's own replay.
                for member in ordered:
                    member.scope = None
                for member in ordered:
                    await self._alone(member)
                return
            for member in ordered:
                # Each caller raises its own instance, chained to the cause.
                lost = self._lost(f"group of {len(ordered)} lost: {exc}")
                lost.__cause__ = exc
                member.finish(error=lost)
        else:
            for member, result in zip(ordered, results, strict=True):
                member.finish(result)
            self._groups += 1
            self._members += len(ordered)
            self._largest = max(self._largest, len(ordered))

    async def _alone(self, member: _Member[K, W, R]) -> None:
        if member.withdrawn:
            return
        with trio.CancelScope() as member.scope:
            try:
                [result] = await self._run_group([member.work])
            except Exception as exc:
                member.finish(error=exc)
            else:
                member.finish(result)
