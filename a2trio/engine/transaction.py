"""The app's own transaction: its SQL and its appends, committed together.

:func:`open_transaction` (``Server.transaction``) opens the store's
transaction (``store.transactions``: SQLite, Postgres) for the block, and
:class:`Transaction` is what the app holds: its own statements run on it, and
``session.append(..., transaction=tx)`` appends through it. The write path
does everything an append does that the store does not see (waking drains,
arming watchdogs, counting) only once the commit succeeded, through the hooks
it registers here (:meth:`Transaction.on_commit`); a rollback, an exception
or a cancellation leaves nothing of them behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..errors import A2Error, ErrorCode
from ..stores.base import AppTransactions, SqlValue, Store, StoreTransaction

__all__ = ["Transaction", "open_transaction"]


class Transaction:
    """An app transaction open on a store: the app's own SQL and its
    appends (``session.append(..., transaction=tx)``) commit together when
    the ``async with server.transaction() as tx:`` block ends, or roll back
    together when it raises or is cancelled.

    One statement runs at a time: tasks that share it take turns. The events
    appended through it are visible, claimable and live (feeds, handlers,
    other processes) only once it committed.
    """

    __slots__ = ("_hooks", "_inner", "_open", "store")

    def __init__(self, store: Store, inner: StoreTransaction) -> None:
        #: The store it is open on: sessions of any server on that store
        #: append through it.
        self.store = store
        self._inner = inner
        self._hooks: list[Callable[[], None]] = []
        self._open = True

    def __repr__(self) -> str:
        state = "open" if self._open else "over"
        return f"Transaction({type(self.store).__name__}, {state})"

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """Run one of the app's statements in the transaction, with the
        database's placeholders (``$1`` on Postgres, ``?`` on SQLite).

        Raises:
          SqlError: the database refused it (on Postgres the transaction is
            then aborted: the block rolls back), or it was ``commit`` or
            ``rollback`` (the block's to do).
          A2Error: ``STORE_UNAVAILABLE``.
          TypeError: a parameter that is not str, int, float, bool, bytes or None.
          RuntimeError: the block is over.

        Cancellation: the whole transaction rolls back.
        """
        self._check_open()
        await self._inner.execute(sql, params)

    async def fetch(self, sql: str, params: Sequence[SqlValue] = ()) -> list[tuple[Any, ...]]:
        """Run one of the app's statements and return its rows, as tuples.

        Raises, and cancellation: as :meth:`execute`.
        """
        self._check_open()
        return await self._inner.fetch(sql, params)

    # -- the write path's side --------------------------------------------

    def writing(self, store: Store) -> StoreTransaction:
        """The store's transaction, for an append to ``store``.

        Raises:
          ValueError: it is open on another store.
          RuntimeError: the block is over.
        """
        self._check_open()
        if store is not self.store:
            raise ValueError(
                f"this transaction is open on {self.store!r}, not on the session's store {store!r}"
            )
        return self._inner

    def on_commit(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once the transaction committed (never after a rollback)."""
        self._hooks.append(hook)

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(
                "this transaction is over: use it inside its `async with server.transaction()`"
            )


@asynccontextmanager
async def open_transaction(store: Store) -> AsyncIterator[Transaction]:
    """An app transaction on ``store`` for the block (see the module docstring).

    Raises:
      A2Error: ``TRANSACTIONS_NOT_SUPPORTED`` (the store has none: memory,
        Redis); ``STORE_UNAVAILABLE``.
      SqlError: the block swallowed an error that aborted the transaction.
    """
    # A store written before the capability has no attribute: it has none.
    capability: AppTransactions | None = getattr(store, "transactions", None)
    if capability is None:
        raise A2Error(
            ErrorCode.TRANSACTIONS_NOT_SUPPORTED,
            f"the store {type(store).__name__} has no app transactions: use the SQLite or"
            " the Postgres store to commit your own rows with your events",
        )
    async with capability.begin() as inner:
        tx = Transaction(store, inner)
        try:
            yield tx
        finally:
            tx._open = False
    for hook in tx._hooks:
        hook()
