"""A hang guard for tests that wait on other processes: it fails a run that
stops moving, not one that is slow.

A fixed bound on a whole multi-process run (``fail_after(240)``) is a bet on
the machine's load: beside other test suites on two cores a run that takes
15 s alone has taken over 60 s, and a busier machine loses the bet although
nothing is wrong. :func:`while_progressing` instead samples what the run
produces (rows appended, events processed) and cancels the block only when
that sample has not changed for ``stall_s`` seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

__all__ = ["STALL_S", "while_progressing"]

#: How long a run may go without visible progress before it counts as hung:
#: well beyond any pause a loaded machine causes (a process starting under
#: coverage, a server restarting), far below a CI job's own limit.
STALL_S = 120.0


@asynccontextmanager
async def while_progressing(
    progress: Callable[[], Awaitable[object]],
    *,
    what: str,
    stall_s: float = STALL_S,
    interval_s: float = 0.5,
) -> AsyncIterator[None]:
    """Run the block while ``progress()`` keeps changing.

    Args:
        progress: a sample of the run's state (say, a row count); any change
            between two samples is progress. A sample that takes longer than
            ``stall_s`` (a store that is down) counts as no change.
        what: what the block waits for, for the failure message.
        stall_s: how long the sample may stay the same.
        interval_s: the pause between samples.

    Raises:
        AssertionError: the sample stayed the same for ``stall_s``; the block
            was cancelled.

    Cancellation:
        Cancelling the caller cancels the block and the sampling alike.
    """
    stalled: list[object] = []

    async def watch(cancel_scope: trio.CancelScope) -> None:
        last: object = None
        since = trio.current_time()
        while True:
            with trio.move_on_after(stall_s):
                sample = await progress()
                if sample != last:
                    last, since = sample, trio.current_time()
            if trio.current_time() - since >= stall_s:
                stalled.append(last)
                cancel_scope.cancel(reason=f"no progress in {stall_s} s")
                return
            await trio.sleep(interval_s)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        yield
        nursery.cancel_scope.cancel(reason="the block ended")
    if stalled:
        raise AssertionError(f"{what}: no progress in {stall_s} s (stuck at {stalled[0]!r})")
