"""A store's background tasks inside ``async with store``, and their end.

A store that runs tasks (a listener, a client's holder) opens a
nursery in ``__aenter__``, and that nursery's cancel scope encloses the
caller's block: cancelling it would cancel the block as well (``aclose`` in
the block used to, and the ``Cancelled`` escaped the block). So the tasks run
in a second nursery, held by one task of the first: :meth:`StoreTasks.close`
cancels that one only, and waits for the tasks to end, wherever in the block
it is called (under the block's own cancel scopes or feeds, without
misnesting them). The outer nursery is exited by :meth:`StoreTasks.exit`, at
the block's end.

A task that fails (each store's tasks catch their own errors, so this is a
bug or a driver's surprise) ends the store's tasks, not the block: it is
logged at once, and comes out of :meth:`exit` as one
``A2Error(STORE_UNAVAILABLE)`` with the ``ExceptionGroup`` as ``__cause__``,
never as a bare group (nor as a cancellation of the block).
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager

import trio

from ..errors import A2Error, ErrorCode

__all__ = ["StoreTasks"]

_log = logging.getLogger("a2trio.stores")


class StoreTasks:
    """One store's task nursery, opened by :meth:`enter` (in ``__aenter__``).

    Args:
      store: the store's name, for messages (``"Redis store"``).
    """

    def __init__(self, store: str) -> None:
        self._store = store
        self._manager: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._outer: trio.Nursery | None = None
        self._tasks: trio.Nursery | None = None
        self._ended: trio.Event | None = None
        self._failure: BaseExceptionGroup[BaseException] | None = None

    @property
    def nursery(self) -> trio.Nursery | None:
        """Where the store starts its tasks; ``None`` outside ``async with
        store`` and once :meth:`close` ran."""
        return self._tasks

    @property
    def entered(self) -> bool:
        """Whether the outer nursery is open (until :meth:`exit`)."""
        return self._manager is not None

    async def enter(self) -> trio.Nursery:
        """Open both nurseries; return the tasks' one.

        Cancellation: a checkpoint; if cancelled, nothing is left open.
        """
        manager = trio.open_nursery()
        outer = await manager.__aenter__()
        try:
            tasks: trio.Nursery = await outer.start(self._host)
        except BaseException:
            # A nursery's exit waits for its tasks whatever the cancellation.
            outer.cancel_scope.cancel(reason=f"{self._store} not entered")
            await manager.__aexit__(None, None, None)
            raise
        self._manager, self._outer, self._tasks = manager, outer, tasks
        return tasks

    async def _host(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        ended = self._ended = trio.Event()
        try:
            async with trio.open_nursery() as tasks:
                task_status.started(tasks)
                await trio.sleep_forever()  # open to new tasks until cancelled
        except BaseExceptionGroup as group:
            _, failed = group.split(trio.Cancelled)
            if failed is None:
                raise  # the outer scope's cancellation, at exit
            self._tasks = None
            self._failure = group
            _log.error("the %s's tasks failed", self._store, exc_info=group)
        finally:
            ended.set()

    async def close(self) -> None:
        """Cancel the store's tasks (not the block) and wait until they ended.

        Cancellation: shielded; bounded by how promptly the tasks end once
        cancelled (each closes its connection as it unwinds).
        """
        tasks, self._tasks = self._tasks, None
        ended = self._ended
        if tasks is None or ended is None:
            return
        tasks.cancel_scope.cancel(reason=f"{self._store} closed")
        with trio.CancelScope(shield=True):
            await ended.wait()

    async def exit(self) -> None:
        """End the tasks and exit the outer nursery (at the block's end).

        Raises:
          A2Error: ``STORE_UNAVAILABLE`` if a task failed; the group is ``__cause__``.

        Cancellation: waits for the tasks, as a nursery's exit does (they end
        promptly once cancelled).
        """
        manager, outer = self._manager, self._outer
        self._manager = self._outer = self._tasks = None
        if manager is None or outer is None:
            return
        # The block is over: the outer scope encloses only the tasks' host now.
        outer.cancel_scope.cancel(reason=f"{self._store} closed")
        await manager.__aexit__(None, None, None)
        failure, self._failure = self._failure, None
        if failure is not None:
            raise A2Error(
                ErrorCode.STORE_UNAVAILABLE, f"the {self._store}'s tasks failed"
            ) from failure
