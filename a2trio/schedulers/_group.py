"""Group commit for the durable scheduler's queues, run in the callers' tasks.

Theory of operation
-------------------

Every scheduler write (an insert, the delete after a delivery, a lease
renewal, a reschedule) is one small transaction, and a durable commit waits
for a flush. Under load many arrive at once: a server arms watchdogs from
every drain, handlers schedule, and up to ``max_in_flight`` deliveries finish
together. :class:`GroupCommit` queues the writes that arrive while others are
in flight and commits everything queued as one transaction (one round trip,
one flush), as the Postgres store's ``GroupCommitter`` does for its appends
and completions (``stores/postgres/group.py``).

Where the work runs differs. The store's committers are tasks in the store's
nursery; a scheduler has no nursery that outlives its callers: its lifetime
is counted over bound servers (each in its own task) and ``async with
scheduler:`` blocks, any of which may end first. So each group runs in the
task of one of its callers, its *leader*:

* a caller that finds fewer than ``leaders`` groups in flight leads at once:
  it takes what is queued (itself included, oldest first, up to
  ``max_group``) and commits it. With nothing in flight it commits alone, in
  its own task, with no extra task switch.
* otherwise it queues and waits. A leader that finishes promotes the oldest
  queued caller, which leads the next group. A leader commits groups from the
  head of the queue until its own write has been taken, so it never serves
  more than the writes queued ahead of it.

Inside a group, members run in key order (the task id), so two groups (two
processes) lock rows in one order and cannot deadlock.

Verdicts: a group the backend *rejected* (one of ``rejected``: it rolled
back) is replayed member by member, so each caller gets its own answer. A
group that failed otherwise (a lost connection) fails every member with
:class:`GroupLost`, which is what each lone write would have seen: it may or
may not have committed, and retrying is safe because every scheduler write is
idempotent (inserting a queued id does nothing; a token-guarded write whose
lease moved on does nothing).

Cancellation: a caller cancelled before its write was taken withdraws it
(nothing written) and passes any promotion on. A caller cancelled while its
group is in flight cancels the group's transaction and waits, shielded, until
that has settled (prompt and bounded: the Postgres driver cancels on the
server within a second and closes the connection; a sqlite call is
interrupted), so its write committed entirely or not at all before it sees
``Cancelled``. The group's other members go back to the head of the queue and
run again; replaying a write that did commit changes nothing. A cancelled
leader does the same for the group it leads, then promotes the next caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import msgspec
import trio

__all__ = ["GroupCommit", "GroupCommitStatistics", "GroupLost"]

W = TypeVar("W")
R = TypeVar("R")

#: Groups in flight at once: a second one hides the first one's round trip.
DEFAULT_LEADERS = 2
#: Writes per transaction; a full queue is several groups.
DEFAULT_MAX_GROUP = 256


class GroupLost(Exception):
    """A group's transaction failed without a verdict (its connection was lost):
    it may or may not have committed. ``__cause__`` is the backend's error."""


class GroupCommitStatistics(msgspec.Struct, frozen=True):
    """How writes were committed: ``groups`` transactions for ``members`` writes."""

    groups: int
    members: int
    largest: int


class _Member(Generic[W, R]):
    __slots__ = (
        "error",
        "finished",
        "key",
        "result",
        "scope",
        "signal",
        "taken",
        "withdrawn",
        "work",
    )

    def __init__(self, key: str, work: W) -> None:
        self.key = key
        self.work = work
        self.taken = False
        self.withdrawn = False
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


class GroupCommit(Generic[W, R]):
    """Commits queued writes together (see the module docstring).

    Args:
      run_group: commits the given works, in order, as one transaction and
        returns each one's result.
      rejected: what ``run_group`` raises when the backend refused the
        transaction (it rolled back): the members are then replayed alone.
      leaders: groups in flight at once.
      max_group: writes per group.
    """

    def __init__(
        self,
        run_group: Callable[[Sequence[W]], Awaitable[list[R]]],
        *,
        rejected: tuple[type[Exception], ...],
        leaders: int = DEFAULT_LEADERS,
        max_group: int = DEFAULT_MAX_GROUP,
    ) -> None:
        self._run_group = run_group
        self._rejected = rejected
        self._leaders = leaders
        self._max_group = max_group
        self._pending: deque[_Member[W, R]] = deque()
        self._leading = 0
        self._groups = 0
        self._members = 0
        self._largest = 0

    def statistics(self) -> GroupCommitStatistics:
        """Transactions committed and their sizes (tests, benchmarks)."""
        return GroupCommitStatistics(self._groups, self._members, self._largest)

    async def submit(self, key: str, work: W) -> R:
        """Commit ``work`` (alone or with others queued) and return its result.

        Raises:
          What its lone replay raised after a rejected group, what the backend
          raised for a lone write, or :class:`GroupLost`.

        Cancellation: a checkpoint; committed entirely or not at all (see
        the module docstring).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        member: _Member[W, R] = _Member(key, work)
        self._pending.append(member)
        try:
            while not member.finished.is_set():
                if not member.taken and self._leading < self._leaders:
                    await self._lead(member)
                else:
                    member.signal = trio.Event()
                    await member.signal.wait()
        except BaseException:
            await self._abandon(member)
            raise
        if member.error is not None:
            raise member.error
        return member.result  # type: ignore[return-value]

    async def _abandon(self, member: _Member[W, R]) -> None:
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
            member.signal.set()
            free -= 1

    async def _lead(self, me: _Member[W, R]) -> None:
        self._leading += 1
        try:
            while not me.taken:
                group: list[_Member[W, R]] = []
                while self._pending and len(group) < self._max_group:
                    member = self._pending.popleft()
                    member.taken = True
                    group.append(member)
                await self._commit(group)
        finally:
            self._leading -= 1
            self._promote()

    def _requeue(self, ordered: list[_Member[W, R]]) -> None:
        again = [m for m in ordered if not m.withdrawn and not m.finished.is_set()]
        for member in reversed(again):
            member.taken = False
            member.scope = None
            self._pending.appendleft(member)

    async def _commit(self, group: list[_Member[W, R]]) -> None:
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

    async def _attempt(self, ordered: list[_Member[W, R]]) -> None:
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
                lost = GroupLost(f"group of {len(ordered)} lost: {exc}")
                lost.__cause__ = exc
                member.finish(error=lost)
        else:
            for member, result in zip(ordered, results, strict=True):
                member.finish(result)
            self._groups += 1
            self._members += len(ordered)
            self._largest = max(self._largest, len(ordered))

    async def _alone(self, member: _Member[W, R]) -> None:
        if member.withdrawn:
            return
        with trio.CancelScope() as member.scope:
            try:
                [result] = await self._run_group([member.work])
            except Exception as exc:
                member.finish(error=exc)
            else:
                member.finish(result)
