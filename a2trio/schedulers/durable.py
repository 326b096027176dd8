"""The durable scheduler: tasks in a sqlite or Postgres table.

Independent of the event store: it has its own connection (it may share the
store's file or database, or use another), so any store can pair with it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from ._engine import DEFAULT_LEASE_S, DEFAULT_MAX_IN_FLIGHT, QueueScheduler

if TYPE_CHECKING:
    from ..clock import Clock
    from ._queue import TaskQueue

__all__ = ["DurableScheduler"]


class DurableScheduler(QueueScheduler):
    """Tasks in the table ``a2_scheduler_tasks``, keyed by task id.

    Build one with :meth:`sqlite` or :meth:`postgres`. ``schedule`` returns
    once the row is committed; re-scheduling a queued id is a no-op. Workers
    (in each bound server's lifetime) claim due tasks under renewed leases,
    deliver them, delete them on success and retry with backoff on failure.
    Tasks survive restarts; on Postgres any number of processes share the
    work and each task is delivered by one of them (at least once across
    crashes; see ``docs/schedules.md``).

    Lifetime: bound servers open and close the connection. To schedule
    without a bound server (a script, another service), use
    ``async with scheduler:``.
    """

    def __init__(
        self,
        queue: TaskQueue,
        *,
        clock: Clock | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(queue, clock=clock, lease_s=lease_s, max_in_flight=max_in_flight)

    def __repr__(self) -> str:
        return f"DurableScheduler({self.queue!r})"

    async def __aenter__(self) -> DurableScheduler:
        await super().__aenter__()
        return self

    @classmethod
    def sqlite(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> DurableScheduler:
        """A scheduler on the sqlite file ``path`` (created if missing; WAL).

        Single host: other processes on the file are noticed by polling every
        ``Timings.poll_idle_s``. Does no I/O until first used.

        Args:
          clock: epoch ms for claims and leases; default: each bound server's.
          lease_s: how long a delivery holds its task between renewals.
          max_in_flight: deliveries at once per bound server.
        """
        from ._sqlite_queue import SqliteQueue

        return cls(SqliteQueue(path), clock=clock, lease_s=lease_s, max_in_flight=max_in_flight)

    @classmethod
    def postgres(
        cls,
        dsn: str,
        *,
        clock: Clock | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        pooler: Literal["transaction"] | None = None,
        listen_dsn: str | None = None,
    ) -> DurableScheduler:
        """A scheduler on the Postgres database at ``dsn`` (needs ``psycopg``).

        Many processes and hosts: claims use ``FOR UPDATE SKIP LOCKED``;
        inserts ``NOTIFY`` other processes' workers. Does no I/O until first
        used. Other arguments as for :meth:`sqlite`.

        Args:
          pooler: ``"transaction"`` when ``dsn`` goes through a
            transaction-mode pooler (PgBouncer ``pool_mode=transaction``, as
            for the store): prepared statements off, since each transaction
            may run on another server connection, and the listener needs
            ``listen_dsn``.
          listen_dsn: where the one ``LISTEN`` connection connects (a direct
            connection to the same database); default ``dsn``.

        Raises:
          ValueError: an unknown ``pooler``, or a transaction pooler without
            ``listen_dsn``.
        """
        from ._pg_queue import PostgresQueue

        if pooler not in (None, "transaction"):
            raise ValueError(f"`pooler` must be None or 'transaction', got {pooler!r}")
        if pooler == "transaction" and listen_dsn is None:
            raise ValueError(
                "LISTEN does not work through a transaction-mode pooler: pass `listen_dsn` "
                "(a direct connection to the same database)"
            )
        queue = PostgresQueue(dsn, listen_dsn=listen_dsn, prepare=pooler != "transaction")
        return cls(queue, clock=clock, lease_s=lease_s, max_in_flight=max_in_flight)
