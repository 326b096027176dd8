"""The writer connection's thread: queued writes group-committed, one wake per batch.

Theory of operation. Each write used to cost its own ``trio.to_thread`` call,
its own ``BEGIN IMMEDIATE`` and its own ``COMMIT``: the thread hop and the
commit were most of an append (issue 30). Here one long-lived thread owns the
writer ``sqlite3.Connection``; Trio tasks put their writes on a queue and
park. The thread takes everything queued (up to :data:`MAX_BATCH`) and runs
it as one transaction, each write inside its own savepoint, then wakes the
Trio side once for the whole batch (``TrioToken.run_sync_soon``), which
reschedules each parked task with its own result or exception. A lone write
runs without a savepoint, as before.

The thread is the pool's: started by its first use, ended by
:meth:`Writer.close` (``ConnectionPool.aclose``, which the store's
``async with`` exit reaches), which waits for it to finish; a pool dropped
unclosed tells it to stop. It opens the connection (and migrates) lazily, on
the first item it takes, and again after a failure or a connection left
broken (inside a transaction after a failed ``ROLLBACK``).

Verdicts. A write that raises rolls back to its savepoint and gets its
exception; the others commit. A failure that ends the whole transaction (an
interrupt, a full disk) or a failed ``COMMIT`` leaves no verdict for the
writes that had run: each is run again alone, in its own transaction, so each
caller gets what it would have got alone (replaying a write that was rolled
back is what a retry does; every store write is idempotent anyway).

Exclusive calls. An app transaction's statements (``ConnectionPool.held``),
a ``:memory:`` store's reads and opening run alone on the thread
(:meth:`Writer.call`), never batched; the pool's ``trio.Lock`` keeps other
writes out of an app transaction's block.

Cancellation. A caller is cancelled at once while its write waits in the
queue, or in a batch whose ``BEGIN IMMEDIATE`` waits for another process's
lock (given up between :data:`~.conn.BUSY_SLICE_S` slices once no write of
the batch is still wanted): it was never run. Once the thread has started
it, the caller waits for the batch's end: if its write committed, the call
returns its result (the task sees ``Cancelled`` at its next checkpoint); if
not, it raises ``Cancelled``. So a cancelled write is never half done and
never unknown: ``Cancelled`` means nothing of it was written. When no write
of the running batch is still wanted (a lone write, typically) the running
statement is interrupted (``Connection.interrupt()``) and the batch rolls
back, so a long statement still ends promptly.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import trio

from ..group import GroupStatistics

__all__ = ["MAX_BATCH", "Op", "Writer", "begin"]

T = TypeVar("T")

#: Writes per transaction; a longer queue is several batches.
MAX_BATCH: Final = 256

_QUEUED, _RUNNING, _DONE, _ABANDONED = range(4)


def begin(
    conn: sqlite3.Connection, statement: str, give_up: Callable[[], bool], timeout_s: float
) -> None:
    """Run ``statement`` (a ``BEGIN``), retrying ``SQLITE_BUSY`` until
    ``timeout_s`` ran out or ``give_up()``.

    SQLite's own busy handler cannot be interrupted, so the connection's
    ``busy_timeout`` is one slice; between slices a call nobody waits for any
    more gives up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute(statement)
            return
        except sqlite3.OperationalError as exc:
            if (
                exc.sqlite_errorcode != sqlite3.SQLITE_BUSY
                or give_up()
                or time.monotonic() >= deadline
            ):
                raise


class Op(Generic[T]):
    """One queued call: the Trio side's task and the thread's verdict."""

    __slots__ = (
        "cancel",
        "error",
        "exclusive",
        "result",
        "state",
        "task",
        "token",
        "work",
    )

    def __init__(self, work: Callable[[sqlite3.Connection, Op[T]], T], *, exclusive: bool) -> None:
        self.work = work
        self.exclusive = exclusive
        self.state = _QUEUED
        #: ``raise_cancel`` once the caller was cancelled after the thread took it.
        self.cancel: Callable[[], object] | None = None
        self.result: T | None = None
        self.error: BaseException | None = None
        self.task = trio.lowlevel.current_task()
        self.token = trio.lowlevel.current_trio_token()

    def gave_up(self) -> bool:
        """Thread side: the caller no longer waits for this call's result."""
        return self.cancel is not None or self.state == _ABANDONED

    def wanted(self) -> bool:
        return self.state in (_QUEUED, _RUNNING) and self.cancel is None


_Stop = object()

_Item = Op[object] | object


class Writer:
    """The writer connection and its thread (see the module docstring).

    Args:
      connect: opens the connection (blocking; run on the thread).
      prepare: run in the connection's first transaction (the migration).
      begin_write: the statement that opens a write transaction.
      timeout_s: how long a ``BEGIN`` waits for another process's lock.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        prepare: Callable[[sqlite3.Connection], object],
        begin_write: str,
        timeout_s: float,
    ) -> None:
        self._connect = connect
        self._prepare = prepare
        self._begin_write = begin_write
        self._timeout_s = timeout_s
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        #: Guards every op's ``state`` and ``cancel``, and ``_running``.
        self._lock = threading.Lock()
        self._running: list[Op[object]] = []
        self.raw: sqlite3.Connection | None = None
        self._groups = 0
        self._members = 0
        self._largest = 0
        #: The connection has been opened at least once (``:memory:`` data exists).
        self.opened = False
        self._thread = threading.Thread(target=self._loop, name="a2trio sqlite writer", daemon=True)
        self._thread.start()

    def statistics(self) -> GroupStatistics:
        """Write transactions committed and how many writes they held (tests,
        benchmarks); exclusive calls and failed writes are not counted."""
        return GroupStatistics(self._groups, self._members, self._largest)

    @property
    def in_transaction(self) -> bool:
        """Inside a transaction (read while the thread is idle: an app
        transaction's, between its calls)."""
        return self.raw is not None and self.raw.in_transaction

    # -- the Trio side ----------------------------------------------------

    async def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a ``BEGIN IMMEDIATE`` transaction, batched with
        the writes queued beside it. Cancellation: see the module docstring."""
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self._submit(Op(lambda raw, _: work(raw), exclusive=False))

    async def call(self, work: Callable[[sqlite3.Connection, Op[T]], T]) -> T:
        """Run ``work`` alone on the connection (no transaction of its own).

        Cancellation: a queued call is withdrawn; a running one is
        interrupted. Raises ``Cancelled`` unless it ran to its end."""
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self._submit(Op(work, exclusive=True))

    def stop_soon(self) -> None:
        """Tell the thread to close the connection and end (an unclosed pool's
        finalizer; :meth:`close` waits for it)."""
        self._queue.put(_Stop)

    async def close(self) -> None:
        """Close the connection and end the thread. Cancellation: shielded."""
        with trio.CancelScope(shield=True):
            self.stop_soon()
            await trio.to_thread.run_sync(self._thread.join)

    async def _submit(self, op: Op[T]) -> T:
        self._queue.put(op)

        def abort(raise_cancel: Callable[[], object]) -> trio.lowlevel.Abort:
            with self._lock:
                if op.state == _QUEUED:
                    op.state = _ABANDONED
                    return trio.lowlevel.Abort.SUCCEEDED
                op.cancel = raise_cancel
                if op.state == _RUNNING and not any(o.wanted() for o in self._running):
                    # Nobody waits for this transaction any more: end it now.
                    # Under the lock, so it cannot hit the next batch.
                    raw = self.raw
                    if raw is not None:
                        with contextlib.suppress(sqlite3.Error):
                            raw.interrupt()
                return trio.lowlevel.Abort.FAILED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if op.error is not None:
            if op.cancel is not None:
                op.cancel()
            raise op.error
        return op.result  # type: ignore[return-value]

    # -- the thread ---------------------------------------------------------

    def _loop(self) -> None:
        carry: _Item | None = None
        while True:
            item = self._queue.get() if carry is None else carry
            carry = None
            if item is _Stop:
                self._close_raw()
                self._refuse_queued()
                return
            assert isinstance(item, Op)
            if item.exclusive:
                self._guarded([item], self._exclusive)
                continue
            batch: list[Op[object]] = [item]
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _Stop or (isinstance(more, Op) and more.exclusive):
                    carry = more
                    break
                assert isinstance(more, Op)
                batch.append(more)
            self._guarded(batch, self._write_batch)

    def _refuse_queued(self) -> None:
        # The pool queues nothing after its stop; should anything be there,
        # its caller must not wait forever.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Op):
                self._finish_all([item], trio.ClosedResourceError("the sqlite writer is closed"))

    def _guarded(self, ops: list[Op[object]], run: Callable[[list[Op[object]]], None]) -> None:
        # A bug here must not leave callers parked forever.
        try:
            run(ops)
        except BaseException as exc:
            self._finish_all(ops, exc)
        finally:
            with self._lock:
                self._running = []
            raw = self.raw
            if raw is not None and raw.in_transaction and not (len(ops) == 1 and ops[0].exclusive):
                self._rollback_or_discard()

    def _open(self, ops: list[Op[object]]) -> sqlite3.Connection | None:
        if self.raw is not None:
            return self.raw
        try:
            raw = self._connect()
        except BaseException as exc:
            self._finish_all(ops, exc)
            return None
        try:
            begin(raw, self._begin_write, lambda: not any(o.wanted() for o in ops), self._timeout_s)
            self._prepare(raw)
            raw.execute("commit")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                raw.close()
            self._finish_all(ops, exc)
            return None
        self.raw = raw
        self.opened = True
        return raw

    def _start(self, op: Op[object]) -> bool:
        with self._lock:
            if op.state != _QUEUED:
                return False
            op.state = _RUNNING
            return True

    def _exclusive(self, ops: list[Op[object]]) -> None:
        [op] = ops
        with self._lock:
            self._running = ops
        raw = self._open(ops)
        if raw is None or not self._start(op):
            return
        try:
            result = op.work(raw, op)
        except BaseException as exc:
            self._deliver([(op, None, exc)])
        else:
            self._deliver([(op, result, None)])

    def _write_batch(self, batch: list[Op[object]]) -> None:
        again = self._group(batch)
        for op in again:
            self._group([op])

    def _group(self, ops: list[Op[object]]) -> list[Op[object]]:
        """One transaction for ``ops``; returns the ones to run again alone."""
        with self._lock:
            self._running = ops
        raw = self._open(ops)
        if raw is None:
            return []
        try:
            begin(raw, self._begin_write, lambda: not any(o.wanted() for o in ops), self._timeout_s)
        except BaseException as exc:
            self._finish_all(ops, exc)
            return []
        lone = len(ops) == 1
        ran: list[tuple[Op[object], object]] = []
        verdicts: list[tuple[Op[object], object, BaseException | None]] = []
        for at, op in enumerate(ops):
            if not self._start(op):
                continue
            try:
                if lone:
                    result = op.work(raw, op)
                else:
                    raw.execute("savepoint a2_batch")
                    result = op.work(raw, op)
                    raw.execute("release a2_batch")
            except BaseException as exc:
                verdicts.append((op, None, exc))
                if lone or not self._undo_savepoint(raw):
                    # The transaction ended (or must): what ran has no verdict.
                    self._rollback_or_discard()
                    self._deliver(verdicts)
                    return self._again([o for o, _ in ran]) + self._queued(ops[at + 1 :])
                continue
            ran.append((op, result))
        try:
            raw.execute("commit")
        except BaseException as exc:
            self._rollback_or_discard()
            if lone and ran:
                verdicts.append((ran[0][0], None, exc))
                ran = []
            self._deliver(verdicts)
            return self._again([o for o, _ in ran])
        self._groups += 1
        self._members += len(ran)
        self._largest = max(self._largest, len(ran))
        verdicts.extend((op, result, None) for op, result in ran)
        self._deliver(verdicts)
        return []

    def _undo_savepoint(self, raw: sqlite3.Connection) -> bool:
        """Roll the failed write back to its savepoint; whether the
        transaction is still open for the others."""
        if not raw.in_transaction:
            return False
        try:
            raw.execute("rollback to a2_batch")
            raw.execute("release a2_batch")
        except sqlite3.Error:
            return False
        return True

    def _again(self, ops: list[Op[object]]) -> list[Op[object]]:
        """Ops whose run was rolled back: queued again, unless their caller
        gave up (they get ``Cancelled``: nothing of them was written)."""
        lost = sqlite3.OperationalError("the transaction was rolled back")
        again: list[Op[object]] = []
        dropped: list[tuple[Op[object], object, BaseException | None]] = []
        with self._lock:
            for op in ops:
                if op.cancel is not None:
                    dropped.append((op, None, lost))
                else:
                    op.state = _QUEUED
                    again.append(op)
        self._deliver(dropped)
        return again

    @staticmethod
    def _queued(ops: list[Op[object]]) -> list[Op[object]]:
        return [op for op in ops if op.state == _QUEUED]

    def _finish_all(self, ops: list[Op[object]], exc: BaseException) -> None:
        """Every op still waiting fails with its own copy of ``exc``."""
        many = len(ops) > 1
        self._deliver([(op, None, copy.copy(exc) if many else exc) for op in ops])

    def _deliver(
        self,
        verdicts: list[tuple[Op[object], object, BaseException | None]],
    ) -> None:
        """Settle ``verdicts`` (abandoned ops drop out) and wake their tasks:
        one ``run_sync_soon`` per Trio run (there is one, normally)."""
        woken: dict[trio.lowlevel.TrioToken, list[Op[object]]] = {}
        with self._lock:
            for op, result, error in verdicts:
                if op.state in (_ABANDONED, _DONE):
                    continue
                op.state = _DONE
                op.result = result
                op.error = error
                woken.setdefault(op.token, []).append(op)
        for token, settled in woken.items():
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_wake, settled)

    def _rollback_or_discard(self) -> None:
        raw = self.raw
        if raw is None:
            return
        with contextlib.suppress(sqlite3.Error):
            raw.execute("rollback")
        if raw.in_transaction:
            self._close_raw()

    def release(self, raw: sqlite3.Connection, _: object) -> None:
        """Exclusive call: roll back what an app transaction left open,
        closing a connection that cannot (it reopens on the next use)."""
        if raw.in_transaction:
            self._rollback_or_discard()

    def _close_raw(self) -> None:
        raw, self.raw = self.raw, None
        if raw is not None:
            with contextlib.suppress(sqlite3.Error):
                raw.close()


def _wake(ops: list[Op[object]]) -> None:
    for op in ops:
        trio.lowlevel.reschedule(op.task)
