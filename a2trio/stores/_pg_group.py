"""Group commit: completions that arrive close together share one transaction.

Every completion is a commit, and on a durable server every commit waits for a
WAL flush. Under load many drains complete at once, so the store queues them
here and a few *committer* tasks (in the store's nursery) each take everything
queued and send it as one pipeline::

    begin; lock(s1); complete(s1, i, a); lock(s2); complete(s2, j, b); ...; commit

Each member keeps its own fence: its ``COMPLETE`` statement checks its own
attempt and holder exactly as it would alone, and a superseded member only
reports ``superseded`` (the statement writes nothing for it) while the others
commit. Statements run in order inside the transaction, so two members on one
session see each other exactly as two serial transactions would.

Session locks are taken in sorted session order, so two groups never wait on
each other in a cycle; a hash collision between session ids could still order
two locks differently, which Postgres reports as a deadlock, and the store
retries the rolled-back group like any other.

A group that fails as a whole (a server error in one member, a broken
connection) is replayed member by member. That is safe because a completion is
idempotent: a member whose group did commit replays its stored result.

Cancellation: a caller cancelled before a committer took its request withdraws
it (nothing is written); a caller cancelled later leaves its completion to commit
or not, which is exactly what a cancelled single-statement completion does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from ._pg_conn import Param, Row

__all__ = ["GroupCommitter", "GroupStatistics", "Request"]


class GroupStatistics(msgspec.Struct, frozen=True):
    """How completions were committed: ``groups`` transactions for ``completions``."""

    groups: int
    completions: int
    largest: int


class Request:
    """One queued completion: its session and ``COMPLETE`` parameters, and its answer."""

    __slots__ = ("answered", "done", "error", "params", "rows", "session_id", "taken")

    def __init__(self, session_id: str, params: Sequence[Param]) -> None:
        self.session_id = session_id
        self.params = params
        self.taken = False
        self.answered = False
        self.done = trio.Event()
        self.rows: list[Row] = []
        self.error: Exception | None = None


RunGroup = Callable[[Sequence[Request]], Awaitable[list[list[Row]]]]


class GroupCommitter:
    """Queues completions and commits them in groups (see the module docstring).

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
        self._completions = 0
        self._largest = 0

    def statistics(self) -> GroupStatistics:
        return GroupStatistics(self._groups, self._completions, self._largest)

    async def submit(
        self, nursery: trio.Nursery, session_id: str, params: Sequence[Param]
    ) -> list[Row]:
        """Queue one completion and wait for its rows.

        Raises whatever its transaction raised (each member gets its own
        error, from its own replay when the group failed).

        Cancellation: see the module docstring.
        """
        # An already-cancelled caller must not queue work it cannot wait for.
        await trio.lowlevel.checkpoint_if_cancelled()
        request = Request(session_id, params)
        self._pending.append(request)
        if self._running < self._committers:
            self._running += 1
            nursery.start_soon(self._commit_loop)
        try:
            await request.done.wait()
        except BaseException:
            if not request.taken:
                self._pending.remove(request)
            raise
        if request.error is not None:
            raise request.error
        return request.rows

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
        ordered = sorted(group, key=lambda r: r.session_id)
        try:
            try:
                answers = await self._run_group(ordered)
            except Exception as exc:
                if len(ordered) == 1:
                    ordered[0].error = exc
                else:
                    async with trio.open_nursery() as nursery:
                        for request in ordered:
                            nursery.start_soon(self._alone, request)
            else:
                for request, rows in zip(ordered, answers, strict=True):
                    request.rows = rows
                    request.answered = True
                self._groups += 1
                self._completions += len(ordered)
                self._largest = max(self._largest, len(ordered))
        except BaseException:
            # The store is closing under us: nobody must wait forever.
            for request in ordered:
                if request.error is None and not request.answered:
                    request.error = trio.ClosedResourceError("the Postgres store closed")
            raise
        finally:
            for request in ordered:
                request.done.set()

    async def _alone(self, request: Request) -> None:
        try:
            [request.rows] = await self._run_group([request])
            request.answered = True
        except Exception as exc:
            request.error = exc
