"""A Trio-native Postgres connection and pool on psycopg's public ``pq`` layer.

psycopg's ``AsyncConnection`` is asyncio-only. Rather than bridging it (trio-
asyncio costs ~110 µs and an asyncio task per call; threads cost a context
switch per query and cannot be cancelled), this module drives libpq's
non-blocking API directly through ``psycopg.pq``, psycopg's documented libpq
wrapper, and waits on the socket with ``trio.lowlevel.wait_readable`` /
``wait_writable``. No private psycopg name is used, so no version gate is needed.

Every round trip is a libpq *pipeline*: a list of statements is sent at once
(prepared on first use per connection, in the same round trip) and their
results read back in order. A store transaction is therefore usually one
round trip: ``begin; lock; work; commit``.

Cancellation: a connection is only ever returned to the pool idle, with no
transaction open. A task cancelled while a pipeline is in flight cannot know
what the server has done, so :meth:`PgPool.connection` closes that connection
instead (the server rolls back whatever was not committed). An error raised by
the server inside a transaction is rolled back before the connection is reused.

Errors: a statement the server rejected raises :class:`PgError`, a connection
that could not be made or broke :class:`PgConnectionError`. :func:`errors` is
the store's one translation of them (and of anything else the driver raises)
into :class:`~a2trio.errors.A2Error`: every module of the store that runs a
statement runs it inside it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import msgspec
import psycopg
import trio
from psycopg import pq

from ...errors import store_unavailable

__all__ = [
    "PgConnection",
    "PgConnectionError",
    "PgError",
    "PgPool",
    "Preamble",
    "Statement",
    "errors",
]

Param = str | int | bool | bytes | None | list[int] | list[str]
Row = tuple[Any, ...]

_json_decode = msgspec.json.Decoder().decode
# A cancel request normally takes one local round trip; never wait longer.
_CANCEL_TIMEOUT_S = 1.0
_names = itertools.count()
#: SQLSTATE classes that refuse the data itself (22: data exception, 54: a
#: program limit such as NOTIFY's payload): a retry fails the same way.
_REFUSED_DATA = ("22", "54")


class PgError(Exception):
    """The server rejected a statement. ``sqlstate`` is the SQLSTATE code."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{message} (SQLSTATE {sqlstate})")
        self.sqlstate = sqlstate
        self.message = message


class PgConnectionError(Exception):
    """The connection could not be made or broke; it is closed."""


def _refused_data(exc: Exception) -> bool:
    return isinstance(exc, PgError) and exc.sqlstate.startswith(_REFUSED_DATA)


def errors(what: str) -> store_unavailable:
    """The Postgres store's one error translation (see ``store_unavailable``):
    data the server refuses for what it is is ``INVALID_PAYLOAD``; anything
    else, a lost connection, a timeout, a serialization failure, is
    ``STORE_UNAVAILABLE``."""
    return store_unavailable(what, permanent=_refused_data)


class Statement:
    """A SQL statement with ``$n`` parameters, prepared once per connection."""

    __slots__ = ("name", "sql")

    def __init__(self, sql: str) -> None:
        self.sql = sql.encode()
        self.name = f"a2_{next(_names)}".encode()

    def __repr__(self) -> str:
        return f"Statement({self.sql[:40]!r}...)"


#: A statement run at the head of every pipeline that starts outside a
#: transaction (see :class:`PgPool`'s ``preamble``).
Preamble = tuple[Statement, Sequence[Param]]


def _encode_param(value: Param) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int | str):
        return str(value).encode()
    # Arrays in text form: ints as is, strings double-quoted with \ and " escaped.
    items = (
        str(v) if isinstance(v, int) else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in value
    )
    return ("{" + ",".join(items) + "}").encode()


def _text(raw: bytes) -> str:
    return raw.decode()


def _bool(raw: bytes) -> bool:
    return raw == b"t"


def _decimal(raw: bytes) -> Decimal:
    return Decimal(raw.decode())


def _bytea(raw: bytes) -> bytes:
    # Text form of bytea (bytea_output = hex, the default): \x0a1b...
    return bytes.fromhex(raw[2:].decode())


def _int_array(raw: bytes) -> list[int]:
    # Text form of a one-dimensional int array without nulls: {1,2,3}.
    return [int(v) for v in raw[1:-1].split(b",")] if raw != b"{}" else []


# Decoders for text-format results, by type OID (pg_type.dat). The store's
# statements return bools, ints, int arrays and JSON; floats, numerics and
# bytea are an app's own (an app transaction's rows).
_DECODERS: dict[int, Callable[[bytes], Any]] = {
    16: _bool,
    17: _bytea,
    700: float,
    701: float,
    1700: _decimal,
    1016: _int_array,
    20: int,
    21: int,
    23: int,
    114: _json_decode,
    3802: _json_decode,
}


def _rows(result: pq.abc.PGresult) -> list[Row]:
    fields = range(result.nfields)
    decoders = [_DECODERS.get(result.ftype(i), _text) for i in fields]
    get = result.get_value
    rows: list[Row] = []
    for r in range(result.ntuples):
        row = []
        for c in fields:
            raw = get(r, c)
            row.append(None if raw is None else decoders[c](raw))
        rows.append(tuple(row))
    return rows


def _error(result: pq.abc.PGresult) -> PgError:
    sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE) or b"XX000"
    message = result.get_error_message().strip()
    return PgError(sqlstate.decode(), message)


class PgConnection:
    """One libpq connection in non-blocking pipeline mode. Not shared between
    tasks: the pool hands it to one task at a time."""

    def __init__(
        self, pgconn: pq.abc.PGconn, *, prepare: bool, preamble: Preamble | None = None
    ) -> None:
        self._pg = pgconn
        self._prepare = prepare
        self._preamble = preamble
        self._prepared: set[bytes] = set()
        self.broken = False

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        *,
        timeout_s: float,
        prepare: bool,
        preamble: Preamble | None = None,
    ) -> PgConnection:
        """Open a connection, failing with :class:`PgConnectionError` after ``timeout_s``.

        Cancellation: the half-open connection is closed.
        """
        pgconn = pq.PGconn.connect_start(conninfo.encode())
        try:
            with trio.move_on_after(timeout_s) as scope:
                while True:
                    if pgconn.status == pq.ConnStatus.BAD:
                        raise PgConnectionError(pgconn.get_error_message().strip())
                    status = pgconn.connect_poll()
                    if status == pq.PollingStatus.OK:
                        break
                    if status == pq.PollingStatus.FAILED:
                        raise PgConnectionError(pgconn.get_error_message().strip())
                    if status == pq.PollingStatus.READING:
                        await trio.lowlevel.wait_readable(pgconn.socket)
                    else:
                        await trio.lowlevel.wait_writable(pgconn.socket)
            if scope.cancelled_caught:
                raise PgConnectionError(f"connection timed out after {timeout_s} s")
            pgconn.nonblocking = 1
            pgconn.enter_pipeline_mode()
        except BaseException:
            pgconn.finish()
            raise
        return cls(pgconn, prepare=prepare, preamble=preamble)

    @property
    def idle(self) -> bool:
        """Usable and outside any transaction."""
        return (
            not self.broken
            and self._pg.status == pq.ConnStatus.OK
            and self._pg.transaction_status == pq.TransactionStatus.IDLE
        )

    @property
    def failed(self) -> bool:
        """Inside a transaction that a statement's error aborted."""
        return self._pg.transaction_status == pq.TransactionStatus.INERROR

    @property
    def socket(self) -> int:
        return self._pg.socket

    def close(self) -> None:
        self.broken = True
        self._pg.finish()

    def _check(self) -> None:
        if self.broken or self._pg.status != pq.ConnStatus.OK:
            self.broken = True
            raise PgConnectionError(self._pg.get_error_message().strip() or "connection closed")

    async def _flush(self) -> None:
        while self._pg.flush():
            await trio.lowlevel.wait_writable(self._pg.socket)

    async def _result(self) -> pq.abc.PGresult | None:
        pg = self._pg
        while pg.is_busy():
            await trio.lowlevel.wait_readable(pg.socket)
            pg.consume_input()
        return pg.get_result()

    async def _until_end_of_command(self) -> None:
        while await self._result() is not None:
            pass

    async def run(
        self, batch: Sequence[tuple[Statement, Sequence[Param]]], *, prepared: bool = True
    ) -> list[list[Row]]:
        """Send every statement in one round trip; return each one's rows.
        ``prepared=False`` sends them unnamed, whatever the connection's
        setting (an app's own statements, each prepared for its one run).

        Raises:
          PgError: the first statement the server rejected (later ones were
            skipped). An explicit transaction is left failed; the pool rolls
            it back.
          PgConnectionError: the connection broke; it is closed.

        Cancellation: the connection's state is unknown afterwards; the pool
        closes it.
        """
        self._check()
        if self._preamble is None or self._pg.transaction_status != pq.TransactionStatus.IDLE:
            return await self._run(batch, prepared)
        # Its transaction-local settings hold to the pipeline's end: the
        # statements before the sync share one transaction, implicit or not
        # (a `begin` later in the pipeline continues it).
        [_, *rows] = await self._run([self._preamble, *batch], prepared)
        return rows

    async def _run(
        self, batch: Sequence[tuple[Statement, Sequence[Param]]], prepared: bool
    ) -> list[list[Row]]:
        pg = self._pg
        # What each result in the pipeline answers: a prepare or an execution.
        kinds: list[bool] = []
        fresh: list[bytes] = []
        try:
            for statement, params in batch:
                values = [_encode_param(p) for p in params]
                if not self._prepare or not prepared:
                    pg.send_query_params(statement.sql, values)
                    kinds.append(True)
                    continue
                if statement.name not in self._prepared and statement.name not in fresh:
                    pg.send_prepare(statement.name, statement.sql)
                    fresh.append(statement.name)
                    kinds.append(False)
                pg.send_query_prepared(statement.name, values)
                kinds.append(True)
            pg.pipeline_sync()
            await self._flush()
            return await self._read(kinds, fresh)
        except trio.Cancelled:
            await self._cancel_on_server()
            self.close()
            raise
        except (psycopg.Error, OSError) as exc:
            self.close()
            raise PgConnectionError(str(exc)) from exc
        except PgConnectionError:
            self.close()
            raise

    async def _cancel_on_server(self) -> None:
        """Ask the server to cancel the statement in flight (best effort).

        Without this, a pipeline cancelled while it waits on a lock would run
        to its ``commit`` once the lock frees, and a long statement would hold
        its locks to the end: closing the socket is noticed only between
        statements. Shielded and bounded, so cancellation stays prompt.
        """
        if self._pg.transaction_status == pq.TransactionStatus.IDLE:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CANCEL_TIMEOUT_S):
            try:
                cancel = self._pg.cancel_conn()
                cancel.start()
                try:
                    while True:
                        status = cancel.poll()
                        if status == pq.PollingStatus.READING:
                            await trio.lowlevel.wait_readable(cancel.socket)
                        elif status == pq.PollingStatus.WRITING:
                            await trio.lowlevel.wait_writable(cancel.socket)
                        else:
                            break
                finally:
                    cancel.finish()
            except (psycopg.Error, OSError):
                pass

    async def _read(self, kinds: list[bool], fresh: list[bytes]) -> list[list[Row]]:
        error: PgError | None = None
        out: list[list[Row]] = []
        preparing = iter(fresh)
        for is_execution in kinds:
            result = await self._result()
            if result is None:
                self._check()
                raise PgConnectionError("pipeline ended early")
            status = result.status
            if not is_execution:
                name = next(preparing)
                # A named statement outlives its pipeline's failure (prepares
                # are not transactional): remember each one the server made,
                # or the next use would prepare it again and fail (42P05).
                if status == pq.ExecStatus.COMMAND_OK:
                    self._prepared.add(name)
            if status == pq.ExecStatus.FATAL_ERROR:
                error = error or _error(result)
            elif is_execution and status == pq.ExecStatus.TUPLES_OK:
                out.append(_rows(result))
            elif is_execution:
                out.append([])
            await self._until_end_of_command()
        sync = await self._result()
        if sync is None or sync.status != pq.ExecStatus.PIPELINE_SYNC:
            self._check()
            raise PgConnectionError("pipeline lost its sync point")
        if error is not None:
            raise error
        return out

    async def script(self, sql: bytes) -> None:
        """Run a multi-statement script (DDL, LISTEN) through the simple protocol.

        Raises:
          PgError: a statement failed (the rest were skipped).

        Cancellation: the connection's state is unknown afterwards; its owner
        closes it (the pool does so for borrowed connections).
        """
        self._check()
        pg = self._pg
        error: PgError | None = None
        try:
            pg.exit_pipeline_mode()
            pg.send_query(sql)
            await self._flush()
            while (result := await self._result()) is not None:
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    error = error or _error(result)
            pg.enter_pipeline_mode()
        except (psycopg.Error, OSError) as exc:
            self.close()
            raise PgConnectionError(str(exc)) from exc
        if error is not None:
            raise error

    def alive(self) -> bool:
        """Whether an idle connection still works: reads what the server sent
        meanwhile (a shutdown notice after a restart) without blocking."""
        if self.broken or self._pg.status != pq.ConnStatus.OK:
            return False
        try:
            self._pg.consume_input()
        except psycopg.Error:
            return False
        return self._pg.status == pq.ConnStatus.OK

    def notifies(self) -> list[tuple[str, str]]:
        """Consume buffered input and return (channel, payload) notifications."""
        self._check()
        pg = self._pg
        try:
            pg.consume_input()
        except psycopg.Error as exc:
            self.close()
            raise PgConnectionError(str(exc)) from exc
        out = []
        while (note := pg.notifies()) is not None:
            out.append((note.relname.decode(), note.extra.decode()))
        self._check()
        return out


_ROLLBACK = Statement("rollback")


class PgPool:
    """A small Trio pool of :class:`PgConnection`: lazily connected, bounded.

    Args:
      conninfo: a libpq connection string or URL.
      max_size: at most this many connections are open at once.
      connect_timeout_s: each connection attempt fails after this long.
      prepare: use named prepared statements (off behind transaction-mode
        poolers that do not support them).
      preamble: a statement run first in every pipeline that starts outside a
        transaction, for session settings a transaction-mode pooler cannot
        carry in the startup packet (``set_config(..., true)``: they last
        until the pipeline's sync). Not run before a rollback, nor by
        :meth:`PgConnection.script`.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 10,
        connect_timeout_s: float = 5.0,
        prepare: bool = True,
        preamble: Preamble | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"`max_size` must be at least 1, got {max_size}")
        self.conninfo = conninfo
        self.connect_timeout_s = connect_timeout_s
        self.prepare = prepare
        self.preamble = preamble
        self._slots = trio.Semaphore(max_size)
        self._idle: list[PgConnection] = []
        self._closed = False

    async def open_connection(self) -> PgConnection:
        """A new connection outside the pool (the caller closes it)."""
        return await PgConnection.connect(
            self.conninfo,
            timeout_s=self.connect_timeout_s,
            prepare=self.prepare,
            preamble=self.preamble,
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PgConnection]:
        """Borrow a connection; it goes back only idle, never mid-transaction.

        A server error inside a transaction is rolled back first; a broken
        connection is closed, and so is every idle one (after a server restart
        they are all dead). Cancellation inside the block closes the connection.
        """
        if self._closed:
            raise trio.ClosedResourceError("the Postgres pool is closed")
        # A free slot is taken without a scheduler pass (`async with` on the
        # semaphore always yields: ~0.08 ms per statement on the latency path);
        # the pipeline that follows is the checkpoint.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        try:
            conn = await self._checkout()
            # Cancellation (a BaseException) leaves `reusable` False: close.
            reusable = False
            try:
                yield conn
                reusable = True
            except PgConnectionError:
                self.discard_idle()
                raise
            except Exception:
                reusable = True
                raise
            finally:
                if reusable and not conn.idle:
                    reusable = await self._rollback(conn)
                if reusable and conn.idle and not self._closed:
                    self._idle.append(conn)
                elif not conn.broken:
                    conn.close()
        finally:
            self._slots.release()

    async def _checkout(self) -> PgConnection:
        while self._idle:
            conn = self._idle.pop()
            if conn.alive():
                return conn
            # The server closed it (a restart): its siblings are likely dead too.
            conn.close()
        return await self.open_connection()

    @staticmethod
    async def _rollback(conn: PgConnection) -> bool:
        """Roll back a failed transaction; False if the connection is unusable."""
        if conn.broken:
            return False
        try:
            await conn.run([(_ROLLBACK, ())])
        except Exception:
            conn.close()
            return False
        except BaseException:
            conn.close()
            raise
        return conn.idle

    def discard_idle(self) -> None:
        """Close every idle connection (they are re-opened on demand)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    @property
    def size(self) -> int:
        """Idle connections held (for tests)."""
        return len(self._idle)

    def close(self) -> None:
        """Close idle connections and refuse new borrows. Idempotent."""
        self._closed = True
        self.discard_idle()
