"""sqlite3 connections driven from Trio: the writer's thread and the readers.

Theory of operation. ``sqlite3`` blocks, so no statement runs on the Trio
thread. Writes go to the writer connection's own thread (:mod:`.writer`),
which group-commits what is queued together: one ``BEGIN IMMEDIATE``, each
write in its own savepoint, one ``COMMIT``, one wake of the Trio side. Reads
run *whole* in a worker thread (``trio.to_thread``) on a reader connection:
``BEGIN``, the statements, ``COMMIT`` (or ``ROLLBACK`` on any error) are one
thread call. A Trio task therefore never holds a connection between two
awaits in the middle of a transaction, except in an app transaction.

Cancellation. A write: see :mod:`.writer` (``Cancelled`` means nothing of
it was written). A read's thread call is made with ``abandon_on_cancel=True``
so that Trio notices the cancellation at once, but the connection is not
abandoned:

* if the thread has not started the transaction yet, it is told not to, and
  the connection was never touched;
* if it has, ``Connection.interrupt()`` makes the running statement fail with
  ``SQLITE_INTERRUPT``, the thread rolls back, and the cancelled task waits,
  shielded, until the thread is done. A ``BEGIN`` waiting for another
  process's lock cannot be interrupted inside SQLite, so it waits in slices
  of :data:`BUSY_SLICE_S` and gives up between them. An interrupt that lands
  between statements is a no-op, and the transaction simply runs to its end.

Either way the connection goes back to the pool idle. An app transaction
(:meth:`ConnectionPool.held`) holds the writer (and the file's write lock)
for its block, one exclusive call on the writer's thread per statement, each
interrupted as above on cancellation, and is rolled back if the block does
not end normally; other writes wait for it on the pool's ``trio.Lock``
before they queue. A connection left inside a transaction (a failed
``ROLLBACK``) is closed instead of reused.

Writes serialize anyway (SQLite has one writer per file), so the pool keeps
one writer connection and a few reader connections, which in WAL mode read a
consistent snapshot without waiting for the writer. A ``:memory:`` database
is private to its connection, so there the writer serves reads too (one
exclusive call each).

Errors. :func:`errors` is the store's one translation of sqlite3 failures;
:class:`Transactions` runs the store's transactions (its presence, inspection
and operator planes' too) on the pool inside it, so no module translates
again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final, Literal, TypeVar

import trio

from ...errors import store_unavailable
from ..group import GroupStatistics
from .schema import migrate
from .writer import Writer, begin

__all__ = ["BEGIN_READ", "BEGIN_WRITE", "ConnectionPool", "Transactions", "errors", "use_wal"]

T = TypeVar("T")

BEGIN_WRITE: Final = "begin immediate"
BEGIN_READ: Final = "begin"

#: How long a write waits for another process's write lock before failing with
#: ``database is locked`` (STORE_UNAVAILABLE). Transactions here last
#: milliseconds, so 10 s only runs out when a process is wedged.
BUSY_TIMEOUT_S: Final = 10.0

#: SQLite's busy handler sleeps uninterruptibly, so it is given this slice at a
#: time; it bounds how late a cancelled write that waits on the lock returns.
BUSY_SLICE_S: Final = 0.05

#: Reader connections per store. Reads are short and the GIL is released only
#: inside sqlite, so a couple of readers keep feeds polling while a write is in
#: flight; more only add threads.
READERS: Final = 2


class _Abandoned(Exception):
    """The task gave up on the call before its thread touched the connection."""


class _Call:
    """What the Trio side and the thread agree on for one cancellable call."""

    __slots__ = ("abandoned", "finished", "gate", "running", "token")

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.running = False
        self.abandoned = False
        self.finished = trio.Event()
        self.token = trio.lowlevel.current_trio_token()

    def enter(self) -> bool:
        """Thread side: may the transaction start (the task has not given up)?"""
        with self.gate:
            if self.abandoned:
                return False
            self.running = True
            return True

    def leave(self) -> None:
        """Thread side: the connection is idle again; wake a waiting task."""
        with self.gate:
            self.running = False
            notify = self.abandoned
        if notify:
            self.token.run_sync_soon(self.finished.set)

    def abandon(self) -> bool:
        """Trio side: give up; returns whether the thread is mid-transaction."""
        with self.gate:
            self.abandoned = True
            return self.running


def _transaction(
    conn: sqlite3.Connection,
    statement: str,
    work: Callable[[sqlite3.Connection], T],
    give_up: Callable[[], bool],
) -> T:
    begin(conn, statement, give_up, BUSY_TIMEOUT_S)
    try:
        result = work(conn)
        conn.execute("commit")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("rollback")
        raise
    return result


class Connection:
    """One ``sqlite3.Connection``; see the module docstring for ``run``."""

    def __init__(self, raw: sqlite3.Connection, generation: int) -> None:
        self.raw = raw
        self.generation = generation

    @property
    def broken(self) -> bool:
        """Still inside a transaction after a call: unusable, close it."""
        return self.raw.in_transaction

    async def run(self, begin: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` inside one transaction in a worker thread.

        Cancellation: prompt; on return the transaction has committed entirely
        or not at all, and no thread is using the connection.
        """
        return await self.call(
            lambda raw, call: _transaction(raw, begin, work, lambda: call.abandoned)
        )

    async def call(self, work: Callable[[sqlite3.Connection, _Call], T]) -> T:
        """Run ``work`` in a worker thread, interrupted if the task is cancelled.

        Cancellation: prompt; on return no thread is using the connection (a
        statement interrupted may have rolled an open transaction back).
        """
        call = _Call()

        def in_thread() -> T:
            if not call.enter():
                raise _Abandoned
            try:
                return work(self.raw, call)
            finally:
                call.leave()

        try:
            return await trio.to_thread.run_sync(in_thread, abandon_on_cancel=True)
        except trio.Cancelled:
            if call.abandon():
                self.raw.interrupt()
                with trio.CancelScope(shield=True):
                    await call.finished.wait()
            raise


def use_wal(raw: sqlite3.Connection, *, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """Switch the file to WAL, waiting out other connections opening it.

    SQLite answers ``database is locked`` at once, without its busy handler,
    when another connection is switching or reading the file at that moment
    (two stores, or two schedulers, opening one file together): retry until
    ``timeout_s`` has passed. Blocking: call it from a worker thread.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            raw.execute("pragma journal_mode = wal")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)  # a worker thread: opening is not cancellable anyway


def _connect(path: str, *, writer: bool, synchronous: str = "normal") -> sqlite3.Connection:
    if writer and path != ":memory:":
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
    raw = sqlite3.connect(path, timeout=BUSY_SLICE_S, isolation_level=None, check_same_thread=False)
    try:
        if writer and path != ":memory:":
            # WAL is a property of the file, so the writer sets it once: readers
            # then never block the writer and vice versa, across processes too.
            # Switching needs the file to itself: wait the full timeout for it
            # (opening is not cancellable anyway).
            raw.execute(f"pragma busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            use_wal(raw)
            raw.execute(f"pragma busy_timeout = {int(BUSY_SLICE_S * 1000)}")
        # NORMAL in WAL mode syncs at checkpoints, not at every commit: a
        # process crash loses nothing; a power cut may lose the last commits.
        raw.execute(f"pragma synchronous = {synchronous}")
    except BaseException:
        raw.close()
        raise
    return raw


class ConnectionPool:
    """A writer connection on its own thread and a few readers on one database file.

    Opening is lazy (the first call starts the writer's thread, which opens
    the writer, creates the folder and migrates the schema) and retried after
    a failure. :meth:`aclose` closes every connection and ends the writer's
    thread; a later call opens new ones, except on ``:memory:`` whose data
    died with its connection.

    Args:
      path: the database file, or ``":memory:"``.
      migrate: run in the writer's first transaction (default: the store's
        schema); another component keeping its own tables passes its own.
      synchronous: SQLite's ``synchronous`` setting: ``"normal"`` (the
        store's: a process crash loses nothing, a power cut may lose the last
        commits) or ``"full"`` (every commit is flushed to disk).
    """

    def __init__(
        self,
        path: str,
        *,
        migrate: Callable[[sqlite3.Connection], object] = migrate,
        synchronous: Literal["normal", "full"] = "normal",
    ) -> None:
        self.path = path
        self._migrate = migrate
        self._synchronous = synchronous
        self._memory = path == ":memory:"
        self._writer: Writer | None = None
        #: Held by an app transaction (:meth:`held`) or by :meth:`aclose`:
        #: other writes wait for it before they queue.
        self._write_lock = trio.Lock()
        self._idle: list[Connection] = []
        self._reader_slots = trio.Semaphore(READERS)
        self._generation = 0
        self._closed_memory = False

    def group_statistics(self) -> GroupStatistics:
        """How the writer's thread group-committed writes, since it started
        (zeros before the first write and after :meth:`aclose`)."""
        writer = self._writer
        return GroupStatistics(0, 0, 0) if writer is None else writer.statistics()

    def check_open(self) -> None:
        """Raise ``trio.ClosedResourceError`` if this is a closed ``:memory:`` pool."""
        if self._closed_memory:
            raise trio.ClosedResourceError(
                "this ':memory:' sqlite store was closed and its data is gone: create a new store"
            )

    async def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a ``BEGIN IMMEDIATE`` transaction on the writer,
        group-committed with the writes queued beside it (:mod:`.writer`).

        Cancellation: ``Cancelled`` means nothing of it was written; a write
        the thread had started returns its result once committed."""
        if self._write_lock.locked():
            await self._wait_writer_free()
        return await self._open_writer().write(work)

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a read transaction: one consistent snapshot."""
        if self._memory:
            if self._write_lock.locked():
                await self._wait_writer_free()
            return await self._open_writer().call(
                lambda raw, op: _transaction(raw, BEGIN_READ, work, op.gave_up)
            )
        await self._ensure_ready()
        async with self._reader_slots:
            if self._idle:
                conn = self._idle.pop()
            else:
                raw = await trio.to_thread.run_sync(
                    lambda: _connect(self.path, writer=False, synchronous=self._synchronous)
                )
                conn = Connection(raw, self._generation)
            try:
                return await conn.run(BEGIN_READ, work)
            finally:
                if conn.broken or conn.generation != self._generation:
                    await _close(conn)
                else:
                    self._idle.append(conn)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[Writer]:
        """The writer, held by this task for the block inside one ``BEGIN
        IMMEDIATE`` (an app transaction), which the block commits; whatever
        it left open is rolled back (shielded: a local, short write). Every
        other write, here or in another process, waits."""
        async with self._write_lock:
            writer = self._open_writer()
            try:
                await writer.call(
                    lambda raw, op: begin(raw, BEGIN_WRITE, op.gave_up, BUSY_TIMEOUT_S)
                )
                yield writer
            finally:
                with trio.CancelScope(shield=True):
                    await writer.call(writer.release)

    def check_not_holding(self, *, read: bool = False) -> None:
        """Raise ``RuntimeError`` for a write (or, with ``read``, a read of a
        ``:memory:`` store, which shares the writer) from the task that holds
        the writer for an app transaction (:meth:`held`): it would wait for
        itself."""
        if read and not self._memory:
            return
        if (
            self._write_lock.locked()
            and self._write_lock.statistics().owner is trio.lowlevel.current_task()
        ):
            raise RuntimeError(
                "this task's open app transaction holds the SQLite writer: write"
                " (and, on ':memory:', read) through it (transaction=tx)"
            )

    async def _wait_writer_free(self) -> None:
        # An app transaction (or aclose) holds the writer: queue after it.
        async with self._write_lock:
            pass

    async def _ensure_ready(self) -> None:
        writer = self._open_writer()
        if not writer.opened:
            # Readers need the file to exist, in WAL mode, migrated.
            await writer.call(_nothing)

    def _open_writer(self) -> Writer:
        if self._writer is not None:
            return self._writer
        self.check_open()
        writer = Writer(
            lambda: _connect(self.path, writer=True, synchronous=self._synchronous),
            self._migrate,
            BEGIN_WRITE,
            BUSY_TIMEOUT_S,
        )
        # A pool dropped unclosed still ends its thread.
        weakref.finalize(self, writer.stop_soon)
        self._writer = writer
        return writer

    async def aclose(self) -> None:
        """Close every connection and end the writer's thread; in-use readers
        close when their call ends.

        Cancellation: shielded; always closes.
        """
        with trio.CancelScope(shield=True):
            self._generation += 1
            idle, self._idle = self._idle, []
            for conn in idle:
                await _close(conn)
            async with self._write_lock:
                writer, self._writer = self._writer, None
                if writer is not None:
                    await writer.close()
                    if self._memory and writer.opened:
                        self._closed_memory = True


def _nothing(raw: sqlite3.Connection, _: object) -> None:
    pass


async def _close(conn: Connection) -> None:
    await trio.to_thread.run_sync(conn.raw.close)


def errors(what: str) -> store_unavailable:
    """The SQLite store's one error translation (see ``store_unavailable``):
    data SQLite refuses for what it is (``sqlite3.DataError``: a string or blob
    over its limits) is ``INVALID_PAYLOAD``; anything else, a locked or full
    database, an I/O error, is ``STORE_UNAVAILABLE``."""
    return store_unavailable(f"sqlite {what}", permanent=_refused_data)


def _refused_data(exc: Exception) -> bool:
    return isinstance(exc, sqlite3.DataError)


class Transactions:
    """A store's transactions: :class:`ConnectionPool` calls inside :func:`errors`.

    ``what`` names the operation in the error message (``"append"``). A closed
    ``:memory:`` store raises ``trio.ClosedResourceError`` untranslated.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    async def write(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`ConnectionPool.write`, its failures translated."""
        self._pool.check_open()
        self._pool.check_not_holding()
        with errors(what):
            return await self._pool.write(work)

    async def read(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`ConnectionPool.read`, its failures translated."""
        self._pool.check_open()
        self._pool.check_not_holding(read=True)
        with errors(what):
            return await self._pool.read(work)
