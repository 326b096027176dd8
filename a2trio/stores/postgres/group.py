"""Group commit: appends, claims and completions that arrive close together share
one transaction and one round trip.

Every append, completion and claim that takes an event is a commit, and on a
durable server every commit waits for a WAL flush; every round trip is also a
send and a wake-up on both sides. Under load many drains claim and complete at
once, so the store queues those statements here and a few *committer* tasks
(in the store's nursery) each take everything queued and send it as one
pipeline::

    begin; lock(s1); complete(s1, i, a); append(s1); claim(s1); claim(s2); lock(s3); ...; commit

Each member keeps its own fence: its statement checks its own attempt and
holder exactly as it would alone, and a superseded completion only reports
``superseded`` (its statement writes nothing) while the others commit.
Statements run in order inside the transaction, so members on one session see
each other exactly as serial transactions would; a session's completions and
appends go before its claims, so a claim in the same group already sees the
lane a completion handed on and the events an append added.

Lock order: sessions ascending; within a session its append lock (taken for
appends, completions that return events, and completions of lane events) and
then its event rows. Every writer outside a group
touches one session, lock before rows, so no two writers wait on each other in
a cycle. A hash collision between two session
ids could still order two advisory locks differently; Postgres reports that as
a deadlock, and the store retries the rolled-back group like any other.

A group that the server rejected (one member's statement failed) rolled back
entirely and is replayed member by member, so each caller gets its own
verdict. A group lost with its connection may or may not have committed: every
member then fails with ``STORE_UNAVAILABLE``, which is what a lone statement
would have done (completions replay idempotently; orphaned claims expire).

Cancellation: an already-cancelled caller never queues; a caller cancelled
before a committer took its request withdraws it (nothing is written). A
request submitted while nothing is in flight runs alone in its caller's task,
so cancelling the caller cancels it exactly as it would a lone statement. A caller
cancelled while its group is in flight cancels the group's pipeline (the
server cancels the statement and the connection is closed, exactly as for a
lone statement) and waits, shielded and bounded, until that is done, so its
statement committed entirely or not at all before it sees ``Cancelled``. The
group's other members go back to the head of the queue and run again: a
completion or an append (ids are fixed before queueing) replays idempotently
if the cancelled group had in fact committed, and a repeated claim then finds
its own live claim and reports ``Busy`` until it expires.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import msgspec
import trio

from .conn import Param, PgConnectionError, PgError, Row

__all__ = ["LOCKING", "GroupCommitter", "GroupStatistics", "Kind", "Request"]

# ``finish`` is a completion that returns no events (one set-based statement
# can finish many of a session's events); ``append_fresh`` an append with no
# supplied ids and no causes (a leaner statement).
Kind = Literal["complete", "finish", "append", "append_fresh", "claim"]
# Within a session: the writers that take its lock, then the claims, so a claim
# sees what the group's completions and appends made eligible.
_ORDER = {"complete": 0, "finish": 0, "append": 1, "append_fresh": 1, "claim": 2}
# ``finish`` takes the lock only for events with a lane (``LOCK_IF_LANED``).
LOCKING: frozenset[Kind] = frozenset({"complete", "append", "append_fresh"})


class GroupStatistics(msgspec.Struct, frozen=True):
    """How statements were committed: ``groups`` transactions for ``members``."""

    groups: int
    members: int
    largest: int


class Request:
    """One queued statement: its kind, session and parameters, and its answer."""

    __slots__ = (
        "answered",
        "done",
        "error",
        "kind",
        "params",
        "rows",
        "scope",
        "session_id",
        "taken",
        "withdrawn",
    )

    def __init__(self, kind: Kind, session_id: str, params: Sequence[Param]) -> None:
        self.kind: Kind = kind
        self.session_id = session_id
        self.params = params
        self.taken = False
        self.withdrawn = False
        self.answered = False
        self.scope: trio.CancelScope | None = None
        self.done = trio.Event()
        self.rows: list[Row] = []
        self.error: Exception | None = None


RunGroup = Callable[[Sequence[Request]], Awaitable[list[list[Row]]]]


class GroupCommitter:
    """Queues statements and commits them in groups (see the module docstring).

    ``run_group`` sends one transaction for the requests it is given (already
    in lock order) and returns each one's rows.
    """

    def __init__(self, run_group: RunGroup, *, committers: int = 3, max_group: int = 256) -> None:
        self._run_group = run_group
        self._committers = committers
        self._max_group = max_group
        self._pending: deque[Request] = deque()
        self._running = 0
        self._groups = 0
        self._members = 0
        self._largest = 0

    def statistics(self) -> GroupStatistics:
        return GroupStatistics(self._groups, self._members, self._largest)

    async def submit(
        self, nursery: trio.Nursery, kind: Kind, session_id: str, params: Sequence[Param]
    ) -> list[Row]:
        """Queue one statement and wait for its rows.

        Raises what its lone replay raised (after a rejected group), or
        ``PgConnectionError`` when the group's connection was lost.

        Cancellation: see the module docstring.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        request = Request(kind, session_id, params)
        if self._running == 0:
            # Nothing in flight, so nothing to group with: commit it in this
            # task. A committer task cost ~80 µs of CPU per lone statement (a
            # task, an event, two scheduler passes). Requests arriving while
            # it is in flight queue for committer tasks, as before.
            self._running += 1
            request.taken = True
            try:
                await self._commit([request])
            finally:
                self._running -= 1
                self._start_committers(nursery)
            if request.error is not None:
                raise request.error
            return request.rows
        self._pending.append(request)
        self._start_committers(nursery)
        try:
            await request.done.wait()
        except BaseException:
            if not request.taken:
                self._pending.remove(request)
            else:
                request.withdrawn = True
                if request.scope is not None:
                    request.scope.cancel(reason="a member's caller was cancelled")
                # Bounded: a cancelled pipeline gives up on the server within 1 s.
                with trio.CancelScope(shield=True):
                    await request.done.wait()
            raise
        if request.error is not None:
            raise request.error
        return request.rows

    def _start_committers(self, nursery: trio.Nursery) -> None:
        if self._pending and self._running < self._committers:
            self._running += 1
            nursery.start_soon(self._commit_loop)

    async def _commit_loop(self) -> None:
        try:
            while self._pending:
                group: list[Request] = []
                while self._pending and len(group) < self._max_group:
                    request = self._pending.popleft()
                    request.taken = True
                    group.append(request)
                await self._commit(group)
        finally:
            self._running -= 1

    async def _commit(self, group: list[Request]) -> None:
        ordered = sorted(group, key=lambda r: (r.session_id, _ORDER[r.kind]))
        finished = ordered
        try:
            with trio.CancelScope() as scope:
                for request in ordered:
                    request.scope = scope
                await self._attempt(ordered)
            if scope.cancelled_caught:
                again = [r for r in ordered if not r.withdrawn and not r.done.is_set()]
                for request in reversed(again):
                    request.taken = False
                    request.scope = None
                    self._pending.appendleft(request)
                finished = [r for r in ordered if r not in again]
        except BaseException:
            # The store is closing under us: nobody may wait forever.
            for request in ordered:
                if request.error is None and not request.answered:
                    request.error = trio.ClosedResourceError("the Postgres store closed")
            raise
        finally:
            for request in finished:
                request.done.set()

    async def _attempt(self, ordered: list[Request]) -> None:
        try:
            answers = await self._run_group(ordered)
        except PgError as exc:
            if len(ordered) == 1:
                ordered[0].error = exc
                return
            async with trio.open_nursery() as nursery:
                for request in ordered:
                    nursery.start_soon(self._alone, request)
        except Exception as exc:
            for request in ordered:
                # Each caller raises its own instance, chained to the cause.
                error = PgConnectionError(f"group of {len(ordered)} lost: {exc}")
                error.__cause__ = exc
                request.error = error
        else:
            for request, rows in zip(ordered, answers, strict=True):
                request.rows = rows
                request.answered = True
            self._groups += 1
            self._members += len(ordered)
            self._largest = max(self._largest, len(ordered))

    async def _alone(self, request: Request) -> None:
        if request.withdrawn:
            return
        with trio.CancelScope() as request.scope:
            try:
                [request.rows] = await self._run_group([request])
                request.answered = True
            except Exception as exc:
                request.error = exc
        request.done.set()
