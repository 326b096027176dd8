"""The background: the server's nursery as the engine's parts see it.

Background drains, snapshot write-backs, watchdog arms, state-read batches
and shared feeds live in the nursery :class:`a2trio.Server` opens in
``async with server:``; leaving the block cancels them. :class:`Background`
is the one owner of that nursery's handle and of the count of tasks started
through it, which ``Server.settle()`` waits on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["Background"]


class Background:
    """The server's nursery while it is open, and the tasks counted in it.

    Args:
      contract_name: the server's contract, for the "not open" message.
    """

    def __init__(self, contract_name: str) -> None:
        self.contract_name = contract_name
        self._nursery: trio.Nursery | None = None
        self._background = 0
        self._idle = trio.Event()
        self._idle.set()

    def attach(self, nursery: trio.Nursery | None) -> None:
        """Give the engine the server's nursery (None when the server closes)."""
        self._nursery = nursery

    @property
    def nursery(self) -> trio.Nursery | None:
        """The server's nursery, or None while the server is not open."""
        return self._nursery

    @property
    def is_open(self) -> bool:
        """Whether background work can start (the server is open)."""
        return self._nursery is not None

    def require_open(self) -> None:
        """Raise RuntimeError unless the server is open."""
        if self._nursery is None:
            raise RuntimeError(
                f"the server for '{self.contract_name}' is not open: use `async with server:`"
            )

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the server's nursery, counted for :meth:`settle`.

        Raises:
          RuntimeError: the server is not open.
        """
        self.require_open()
        assert self._nursery is not None
        if self._background == 0:
            self._idle = trio.Event()
        self._background += 1
        self._nursery.start_soon(self._tracked, fn, *args)

    async def _tracked(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        finally:
            self._background -= 1
            if self._background == 0:
                self._idle.set()

    @property
    def tasks(self) -> int:
        """Background tasks running now."""
        return self._background

    async def settle(self) -> None:
        """Wait until no background task runs (see ``Server.settle``).

        Cancellation: only waits; cancelling it leaves the tasks alone.
        """
        while self._background:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()
