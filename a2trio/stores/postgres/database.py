"""The Postgres store's way to the server: its connection settings, its share
of the pool, the schema, and its statements in one round trip each.

``conn`` is the driver; this is how the store uses it. :class:`Database`
turns the store's arguments into the pool's conninfo (the schema's
``search_path`` and generic plans as startup options, or, behind a
transaction-mode pooler, as each pipeline's transaction-local settings) and
the key under which stores with matching settings share one pool
(``shared``), and the listener's conninfo. It takes the store's share of the
pool at the first statement, creates the schema once per revision and pool,
and runs a statement (:meth:`Database.query`), a transaction
(:meth:`Database.transaction`), lends a connection for an app transaction
(:meth:`Database.connection`) or a group commit's members in lock order
(:meth:`Database.run_group`, the store's side of :mod:`a2trio.stores.group`:
its :class:`Request` records and their :func:`lock_order`) as one pipeline.
Every module of the store runs its statements here, under ``conn.errors``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal, NamedTuple, cast

import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...ids import random_id
from . import sql as sql
from .conn import Param, PgConnection, PgError, PgPool, Preamble, Row, Statement
from .shared import PoolLease, acquire_pool

__all__ = ["GROUPED", "LOCKING", "Database", "Kind", "Request", "lock_order"]

# ``finish`` is a completion that returns no events (one set-based statement
# can finish many of a session's events); ``append_fresh`` an append with no
# supplied ids and no causes (a leaner statement).
Kind = Literal["complete", "finish", "append", "append_fresh", "claim"]
# Within a session: the writers that take its lock, then the claims, so a claim
# sees what the group's completions and appends made eligible.
_ORDER = {"complete": 0, "finish": 0, "append": 1, "append_fresh": 1, "claim": 2}
# ``finish`` takes the lock only for events with a lane (``LOCK_IF_LANED``).
LOCKING: frozenset[Kind] = frozenset({"complete", "append", "append_fresh"})


class Request(NamedTuple):
    """One group-committed statement: its kind, session and parameters, and
    for an append that may claim keyed rows at insert their concurrency
    ``keys`` (the group locks them first: ``LOCK_INSERT_KEYS``)."""

    kind: Kind
    session_id: str
    params: Sequence[Param]
    keys: Sequence[str] = ()


def lock_order(request: Request) -> tuple[str, int]:
    """A request's place in its group (its ``key``): sessions ascending, and
    in each its completions and appends before its claims. Statements run in
    order inside the transaction, so members on one session see each other
    exactly as serial transactions would, and a claim already sees the lane a
    completion handed on and the events an append added.

    Lock order: the concurrency keys of the group's appends that may claim
    keyed rows at insert (``LOCK_INSERT_KEYS``, first in the group), then
    sessions ascending; within a session its append lock (taken for appends,
    completions that return events, and completions of lane events) and then
    its event rows. Every writer outside a group touches one session, lock
    before rows (a keyed claim its keys before the rows, an append alone only
    tries its keys' locks, ``TRY_KEYS``), so no two writers wait on each other
    in a cycle. A hash collision between two session ids could still order two
    advisory locks differently; Postgres reports that as a deadlock, and the
    store retries the rolled-back group like any other.
    """
    return (request.session_id, _ORDER[request.kind])


#: The statement of each group-committed kind but ``finish``, which
#: :meth:`Database.run_group` merges per session into one ``FINISH``.
GROUPED: dict[Kind, Statement] = {
    "complete": sql.COMPLETE,
    "append": sql.APPEND,
    "append_fresh": sql.APPEND_FRESH,
    "claim": sql.CLAIM,
}
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# unique_violation (a concurrent append of the same id in another session) and
# deadlock_detected: the transaction rolled back, so running it again is safe.
_RETRYABLE = frozenset({"23505", "40P01"})
_ATTEMPTS = 3
_KEEPALIVE = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def _keepalive_for(given: dict[str, Any]) -> dict[str, str]:
    # A peer that vanishes mid-query (a partition, not a restart) is noticed
    # within ~30 s instead of the OS's two hours of keepalive.
    return {k: v for k, v in _KEEPALIVE.items() if k not in given}


def _with_keepalive(dsn: str) -> str:
    return make_conninfo(dsn, **_keepalive_for(conninfo_to_dict(dsn)))


_SESSION_SETTINGS = Statement(
    "select set_config('search_path', coalesce($1::text, current_setting('search_path')), true),"
    " set_config('plan_cache_mode', coalesce($2::text, current_setting('plan_cache_mode')), true)"
)


def _preamble(schema: str | None, options: str) -> Preamble:
    """What the startup options carry without a pooler (the schema's
    ``search_path``, generic plans), as transaction-local settings."""
    plans = None if "plan_cache_mode" in options else "force_generic_plan"
    return (_SESSION_SETTINGS, (None if schema is None else f'"{schema}"', plans))


def _check_pooler(pooler: str | None, *, listen: bool, listen_dsn: str | None) -> None:
    if pooler not in (None, "transaction"):
        raise ValueError(
            f"`pooler` must be None or 'transaction', got {pooler!r}"
            " (a session-mode pooler needs no option)"
        )
    if listen_dsn is not None and not listen:
        raise ValueError("`listen_dsn` is only used with `listen=True`: drop one of them")
    if pooler == "transaction" and listen and listen_dsn is None:
        raise ValueError(
            "LISTEN does not work through a transaction-mode pooler: pass"
            " `listen_dsn` (a direct connection to the same database) or `listen=False`"
        )


class Database:
    """One store's connection settings, pool share and schema (see the module
    docstring). Attributes: ``dsn`` (the store's ``dsn``), ``listen_conninfo``
    and ``connect_timeout_s`` (where the listener connects), ``origin`` (the
    store's instance id, which tags its notifications), ``channels`` (the
    schema's events and presence channels, once it is created).

    Raises ``ValueError`` for the arguments :func:`~a2trio.stores.postgres.postgres`
    refuses.
    """

    def __init__(
        self,
        dsn: str | PgPool,
        *,
        listen: bool,
        listen_dsn: str | None,
        pooler: Literal["transaction"] | None,
        schema: str | None,
        max_connections: int,
        connect_timeout_s: float,
        prepare: bool | None,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ValueError(
                f"schema {schema!r} must be a lowercase SQL identifier ([a-z_][a-z0-9_]*)"
            )
        _check_pooler(pooler, listen=listen, listen_dsn=listen_dsn)
        if prepare is None:
            # Transaction-mode poolers hand each transaction to any server
            # connection, where a statement prepared earlier may not exist.
            prepare = pooler != "transaction"
        if isinstance(dsn, PgPool):
            injected = dsn
            # Shared by identity; never closed here.
            self._pool_key: Hashable = injected
            self._make_pool: Callable[[], PgPool] = lambda: injected
            self._owns_pool = False
            listen_conninfo = injected.conninfo
            connect_timeout_s = injected.connect_timeout_s
        else:
            given = conninfo_to_dict(dsn)
            extra = _keepalive_for(given)
            # LISTEN needs none of the pool's options, so stores in other
            # schemas on the same server share the listener.
            listen_conninfo = make_conninfo(dsn, **extra)
            if pooler == "transaction":
                # The pooler refuses (or drops) startup `options`, and a
                # session setting would leak to its other clients: each
                # pipeline sets them for its own transaction instead.
                conninfo = make_conninfo(dsn, **extra)
                preamble: Preamble | None = _preamble(schema, str(given.get("options") or ""))
                dsn = conninfo
            else:
                if schema is not None:
                    # Keep the caller's options (e.g. -csynchronous_commit=off).
                    options = f"{given.get('options') or ''} -csearch_path={schema}"
                    extra["options"] = options.strip()
                dsn = make_conninfo(dsn, **extra)
                options = str(conninfo_to_dict(dsn).get("options") or "")
                if "plan_cache_mode" not in options:
                    # Every statement here is written to run well on a generic
                    # plan (tests/test_pg_plans.py). Left to choose, Postgres
                    # plans each one afresh for five runs per connection and
                    # keeps doing so when a custom plan looks cheaper (APPEND
                    # with no holder: ~1 ms of planning per append). Only the
                    # store's own connections get this; `dsn` stays as given.
                    options = f"{options} -cplan_cache_mode=force_generic_plan".strip()
                conninfo = make_conninfo(dsn, options=options)
                preamble = None
            # Matching settings share one pool (``shared``).
            self._pool_key = (conninfo, max_connections, connect_timeout_s, prepare, preamble)
            self._make_pool = partial(
                PgPool,
                conninfo,
                max_size=max_connections,
                connect_timeout_s=connect_timeout_s,
                prepare=prepare,
                preamble=preamble,
            )
            self._owns_pool = True
        self.listen_conninfo = (
            listen_conninfo if listen_dsn is None else _with_keepalive(listen_dsn)
        )
        self.connect_timeout_s = connect_timeout_s
        self.dsn: str = dsn if isinstance(dsn, str) else dsn.conninfo
        self._schema_script = sql.schema_sql(schema=schema, triggers=listen)
        self.channels: tuple[str, str] | None = None
        self._lease: PoolLease | None = None
        self.origin = random_id()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Refuse every later statement (``ClosedResourceError``); the pool
        goes back with :meth:`release`."""
        self._closed = True

    def release(self) -> None:
        """Give back this store's share of the pool; the last one closes it."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    async def _ready(self) -> PgPool:
        """The shared pool, taking this store's share of it on first use, and
        the schema created (once per revision and pool; a failure is retried
        by the next call)."""
        if self._closed:
            raise trio.ClosedResourceError("this Postgres store was closed: create a new one")
        lease = self._lease
        if lease is None:
            lease = self._lease = acquire_pool(
                self._pool_key, self._make_pool, owned=self._owns_pool
            )
        if self.channels is None:
            schema = await lease.schema(self._schema_script)
            self.channels = (f"{schema}.a2_events", f"{schema}.a2_presence")
        return lease.pool

    async def query(self, statement: Statement, params: Sequence[Param]) -> list[Row]:
        """One statement on a pooled connection, outside a transaction: its rows."""
        pool = await self._ready()
        async with pool.connection() as conn:
            [rows] = await conn.run([(statement, params)])
        return rows

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PgConnection]:
        """A pooled connection held for the block (an app transaction's), with
        the pool's guarantee: it goes back idle or is closed."""
        pool = await self._ready()
        async with pool.connection() as conn:
            yield conn

    async def transaction(
        self,
        batch: Sequence[tuple[Statement, Sequence[Param]]],
        *,
        lock: str | None,
    ) -> list[list[Row]]:
        """``begin; [lock;] batch; commit`` in one round trip, retried after a
        deadlock or a unique violation (both roll back). Returns the batch's rows."""
        pool = await self._ready()
        head: list[tuple[Statement, Sequence[Param]]] = [(sql.BEGIN, ())]
        if lock is not None:
            head.append((sql.LOCK, (lock, self.origin)))
        for attempt in range(_ATTEMPTS):
            try:
                async with pool.connection() as conn:
                    rows = await conn.run([*head, *batch, (sql.COMMIT, ())])
                return rows[len(head) : len(head) + len(batch)]
            except PgError as exc:
                if exc.sqlstate not in _RETRYABLE or attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_group(self, group: Sequence[Request]) -> list[list[Row]]:
        """One transaction for a group in lock order: the keys its appends may
        claim at insert, each session's lock before its first writer, then its
        statements (see :func:`lock_order`). A session's
        consecutive ``finish`` members on distinct events share one ``FINISH``
        statement, after the session's lock only if one of them has a lane
        (``LOCK_IF_LANED``); each member gets its own row back."""
        batch: list[tuple[Statement, Sequence[Param]]] = []
        answers: list[tuple[int, int | None]] = []  # (statement, row index filter)
        locked: str | None = None
        at = 0
        while at < len(group):
            request = group[at]
            if request.kind in LOCKING and request.session_id != locked:
                batch.append((sql.LOCK, (request.session_id, self.origin)))
                locked = request.session_id
            if request.kind != "finish":
                answers.append((len(batch), None))
                batch.append((GROUPED[request.kind], request.params))
                at += 1
                continue
            members = [request]
            indexes = {request.params[1]}
            at += 1
            while (
                at < len(group)
                and group[at].kind == "finish"
                and group[at].session_id == request.session_id
                and group[at].params[1] not in indexes
            ):
                members.append(group[at])
                indexes.add(group[at].params[1])
                at += 1
            if request.session_id != locked:
                laned = sorted(cast(int, m.params[1]) for m in members)
                batch.append((sql.LOCK_IF_LANED, (request.session_id, laned)))
            for member in members:
                answers.append((len(batch), cast(int, member.params[1])))
            params = (
                request.session_id,
                [m.params[1] for m in members],
                [m.params[2] for m in members],
                request.params[3],
            )
            batch.append((sql.FINISH, cast(Sequence[Param], params)))
        keys = sorted({k for request in group for k in request.keys})
        if keys:
            batch.insert(0, (sql.LOCK_INSERT_KEYS, (keys,)))
            answers = [(position + 1, index) for position, index in answers]
        rows = await self.transaction(batch, lock=None)
        # A FINISH answers a row per member, keyed by its index: split once
        # per statement (a scan per member was quadratic in the group).
        by_index: dict[int, dict[int, list[Row]]] = {}
        for position, index in answers:
            if index is not None and position not in by_index:
                split: dict[int, list[Row]] = {}
                for row in rows[position]:
                    split.setdefault(row[0], []).append(row)
                by_index[position] = split
        return [
            rows[position] if index is None else by_index[position].get(index, [])
            for position, index in answers
        ]

    async def channels_ready(self) -> tuple[str, str]:
        """The schema's events and presence channels, created if need be."""
        await self._ready()
        assert self.channels is not None
        return self.channels

    def notice(self, session_id: str) -> tuple[str, str]:
        """The events channel and payload that wake other processes' drains."""
        assert self.channels is not None
        return self.channels[0], f"{self.origin} {session_id}"
