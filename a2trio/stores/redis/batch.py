"""Batches: the Redis store's calls that arrive while others are in flight
run as one script call.

Theory of operation
-------------------

coredis costs the client about as much CPU per round trip as the engine
costs per event (``docs/performance.md``), and the store's calls are one
script each, so under load the round trips were most of the client's CPU.
:class:`Batches` queues the calls that arrive while others are in flight and
sends everything queued as one request (``conn``: one ``EVALSHA`` of the
``scripts.BATCH`` script, which runs each call's script in turn, each as it
would run alone). It is the group commit the Postgres store has
(``stores.group``) with the Redis store's cancellation:

* A caller that finds fewer than ``leaders`` requests in flight leads: it
  takes what is queued (itself included, oldest first, up to ``max_batch``)
  and sends it, in its own task. A lone call is sent alone at once; a
  caller that finds one in flight first lets the scheduler run once, so the
  callers woken with it join its batch.
* Otherwise it waits, and a leader that finishes promotes the oldest waiting
  callers, one per free slot. A leader sends batches from the head of the
  queue until its own call has been taken.

**Cancellation.** None reaches a call once queued: its caller waits
uncancellably (``wait_task_rescheduled``, no cancel scope per call: one per
batch, around its round trip), and a cancellation lands at the checkpoint
after the answer (``conn``). So a cancelled call ran whole or never started,
as an unbatched one, and waits at most its batch's round trip (bounded by the
connect and command timeouts) behind the batches ahead of it.

**Verdicts.** Each call's answer is its own: its script's reply, or the
error it raised (the batch script catches each call's error). A batch whose
round trip failed (a lost connection, a timeout) fails each of its calls
with :class:`BatchLost` (a lone call with the driver's error), which may or
may not have run, as a lone call's would: retries replay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import trio

from ..group import GroupStatistics

__all__ = ["Answer", "BatchLost", "Batches", "Request"]


class BatchLost(Exception):
    """A batch's round trip failed: its call may or may not have run.
    ``__cause__`` is the driver's error."""


class Request(NamedTuple):
    """A script call: on ``client``, the store's client when it queued."""

    client: Any
    source: str
    keys: Sequence[str]
    args: Sequence[Any]


class Answer(NamedTuple):
    """A call's reply, or the error its script (or its round trip) raised."""

    reply: Any
    error: Exception | None


class _Call:
    __slots__ = ("answer", "parked", "promoted", "request", "taken", "task")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.answer: Answer | None = None
        self.taken = False
        #: Waiting in ``wait_task_rescheduled``: whoever answers or promotes
        #: it reschedules ``task``.
        self.parked = False
        self.promoted = False
        self.task: trio.lowlevel.Task | None = None


def _uncancellable(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class Batches:
    """Sends queued calls together (see the module docstring).

    Args:
      run: sends the given requests, in order, as one round trip and returns
        each one's answer; raises if the round trip failed.
      leaders: batches in flight at once.
      max_batch: calls per batch.
    """

    def __init__(
        self,
        run: Callable[[Sequence[Request]], Awaitable[list[Answer]]],
        *,
        leaders: int,
        max_batch: int,
    ) -> None:
        self._run = run
        self._leaders = leaders
        self._max_batch = max_batch
        self._queue: deque[_Call] = deque()
        self._leading = 0
        self._batches = 0
        self._calls = 0
        self._largest = 0

    def statistics(self) -> GroupStatistics:
        """Round trips (``groups``) for calls (``members``), the largest batch."""
        return GroupStatistics(self._batches, self._calls, self._largest)

    async def submit(self, request: Request) -> Answer:
        """Send ``request`` (alone or with others queued); its answer.

        Cancellation: none once called (a checkpoint only if it leads a
        batch); see the module docstring.
        """
        call = _Call(request)
        self._queue.append(call)
        if self._leading < self._leaders:
            self._leading += 1
            await self._lead(call, gather=self._leading > 1)
        while call.answer is None:
            call.task = trio.lowlevel.current_task()
            call.parked = True
            await trio.lowlevel.wait_task_rescheduled(_uncancellable)
            if call.promoted:
                call.promoted = False
                await self._lead(call, gather=False)
        return call.answer

    def _settle(self, call: _Call, answer: Answer) -> None:
        call.answer = answer
        if call.parked:
            call.parked = False
            assert call.task is not None
            trio.lowlevel.reschedule(call.task)

    def _promote(self) -> None:
        for call in self._queue:
            if self._leading >= self._leaders:
                return
            # A queued call that is not parked is a leader gathering its batch.
            if call.parked:
                call.parked = False
                call.promoted = True
                self._leading += 1
                assert call.task is not None
                trio.lowlevel.reschedule(call.task)

    async def _lead(self, me: _Call, *, gather: bool) -> None:
        """Send batches from the head of the queue until ``me`` is taken
        (``_leading`` counts this leader already)."""
        try:
            if gather:
                await trio.lowlevel.cancel_shielded_checkpoint()
            while not me.taken:
                batch: list[_Call] = []
                while self._queue and len(batch) < self._max_batch:
                    call = self._queue.popleft()
                    call.taken = True
                    batch.append(call)
                await self._send(batch)
        finally:
            self._leading -= 1
            self._promote()

    async def _send(self, batch: list[_Call]) -> None:
        try:
            with trio.CancelScope(shield=True):
                answers = await self._run([call.request for call in batch])
        except Exception as exc:
            if len(batch) == 1:
                answers = [Answer(None, exc)]
            else:
                answers = []
                for _ in batch:
                    # Each caller raises its own instance, chained to the cause.
                    lost = BatchLost(f"a batch of {len(batch)} calls was lost: {exc}")
                    lost.__cause__ = exc
                    answers.append(Answer(None, lost))
        except BaseException:
            # Nothing may wait for an answer that will not come.
            for call in batch:
                if call.answer is None:
                    self._settle(call, Answer(None, BatchLost("the batch's leader stopped")))
            raise
        else:
            self._batches += 1
            self._calls += len(batch)
            self._largest = max(self._largest, len(batch))
        for call, answer in zip(batch, answers, strict=True):
            self._settle(call, answer)
