"""What Postgres stores with matching settings share in one Trio run: a query
pool, schema initialization, and one LISTEN connection (the seed's sharing).

**Pools.** Stores whose pool settings match (the effective conninfo, bound,
timeout, prepared statements, per-pipeline preamble) share one
:class:`PgPool`; a pool passed in by the caller is shared by identity. Each
store holds a :class:`PoolLease` from its first operation to its last ``async
with`` exit or ``aclose()``; the last lease released closes a pool the
registry made (never an injected one). The pool runs no task, so it needs no
nursery: it is a bounded set of connections, each borrowed by the task that
runs a pipeline on it.

**Schema.** The DDL runs once per revision (the script's exact text, which
names the schema and whether triggers are installed) per shared pool; later
stores reuse the answer. A failure is not remembered: the next caller retries.

**The listener.** Stores whose listener connects to the same conninfo share
one :class:`SharedListener`: one connection LISTENing on the union of their
channels, which hands each notification to the stores subscribed to its
channel. It opens when its first subscriber arrives and closes when the last
one leaves (reopening on demand).

Who owns the listener's task. It must outlive any one store (two stores share
it and either may leave first), so it cannot live in a store's nursery: the
first subscriber's nursery would cancel it, or hold that store's ``async
with`` open, when that store left first. It runs instead as a Trio *system
task* (``trio.lowlevel.spawn_system_task``), whose nursery is the run's own
and so exists as long as any user can; its lifetime is still bounded
structurally: the last subscriber leaving cancels it, a store leaving last
waits (shielded, bounded: closing is synchronous) until its connection is
closed, and the run's end cancels it in any case. A system task must never
raise (Trio would abort the run), so the loop catches every ``Exception``,
wakes every subscriber to catch up and reconnects with backoff; nothing it
calls blocks, and cancellation is its only way out. Subscribing a store still
happens in that store's nursery (its subscription task resolves the schema's
channel names first), so a store outside ``async with`` never listens.

**Per run.** Pools, sockets' wake-ups and events belong to one Trio run (tests
start many runs in one process), so the registry is a
:class:`trio.lowlevel.RunVar`: a new run starts empty, and whatever a run left
behind goes with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Protocol

import trio

from ...backoff import STORE_RECONNECT
from .conn import PgConnection, PgPool, Statement

__all__ = ["ListenSubscriber", "PoolLease", "SharedListener", "acquire_pool", "listener"]

logger = logging.getLogger("a2trio.stores.postgres")

_CURRENT_SCHEMA = Statement("select current_schema()")


class ListenSubscriber(Protocol):
    """A store's side of the shared listener."""

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels this subscriber hears (quoted in LISTEN as is)."""
        ...

    def heard(self, channel: str, payload: str) -> None:
        """A notification on one of :attr:`channels`."""
        ...

    def listening(self, on: bool) -> None:
        """``True``: every channel is LISTENed (feeds may catch up, then follow
        notifications). ``False``: the connection was lost (catch up, poll)."""
        ...


class _PoolEntry:
    def __init__(self, registry: _Registry, key: Hashable, pool: PgPool, owned: bool) -> None:
        self.registry = registry
        self.key = key
        self.pool = pool
        self.owned = owned
        self.leases = 0
        self.schemas: dict[bytes, str] = {}
        self.lock = trio.Lock()


class PoolLease:
    """One store's share of a pool: :attr:`pool`, :meth:`schema`, :meth:`release`."""

    def __init__(self, entry: _PoolEntry) -> None:
        self._entry = entry
        self.pool = entry.pool

    async def schema(self, script: bytes) -> str:
        """Run the DDL ``script`` unless this pool already ran that revision;
        the schema it made current (``current_schema()``).

        Cancellation: the DDL committed or not (it is one transaction); an
        unfinished one is retried by the next caller.
        """
        entry = self._entry
        done = entry.schemas.get(script)
        if done is not None:
            await trio.lowlevel.checkpoint()
            return done
        async with entry.lock:
            done = entry.schemas.get(script)
            if done is None:
                async with self.pool.connection() as conn:
                    await conn.script(script)
                    [[(done,)]] = await conn.run([(_CURRENT_SCHEMA, ())])
                entry.schemas[script] = done
        return done

    def release(self) -> None:
        """Give the share back, once; the last one closes a pool the registry made."""
        entry = self._entry
        entry.leases -= 1
        if entry.leases == 0:
            del entry.registry.pools[entry.key]
            if entry.owned:
                entry.pool.close()


class SharedListener:
    """One LISTEN connection for every subscriber with the same conninfo.

    Subscribing and unsubscribing are synchronous (they only wake the task);
    :meth:`closed` waits until the connection of a listener with no
    subscribers is closed.
    """

    def __init__(self, registry: _Registry, key: tuple[str, float]) -> None:
        self._registry = registry
        self._key = key
        self._subscribers: set[ListenSubscriber] = set()
        self._ready: set[ListenSubscriber] = set()
        self._scope = trio.CancelScope()
        self._started = False
        self._wait: trio.CancelScope | None = None
        self._done = trio.Event()

    @property
    def idle(self) -> bool:
        """No subscriber: the connection is closing or closed."""
        return not self._subscribers

    def subscribe(self, subscriber: ListenSubscriber) -> None:
        """Hear ``subscriber.channels`` from now on; its ``listening(True)``
        says when. The first subscriber opens the connection."""
        self._subscribers.add(subscriber)
        if not self._started:
            self._started = True
            trio.lowlevel.spawn_system_task(self._serve)
        elif self._wait is not None:
            self._wait.cancel()  # LISTEN the new channels now

    def unsubscribe(self, subscriber: ListenSubscriber) -> None:
        """Stop delivering to ``subscriber`` (once per :meth:`subscribe`). The
        last one out closes the connection and retires this listener:
        :func:`listener` makes the next."""
        self._subscribers.discard(subscriber)
        self._ready.discard(subscriber)
        if self._subscribers:
            if self._wait is not None:
                self._wait.cancel()  # UNLISTEN what nobody hears now
            return
        del self._registry.listeners[self._key]
        self._scope.cancel()

    async def closed(self) -> None:
        """Wait until the task a subscriber started has ended and closed its
        connection (it ends once the listener retired).

        Cancellation: a plain wait.
        """
        await self._done.wait()

    async def _serve(self) -> None:
        """The system task: hold the connection, reconnect after a loss, until
        the last subscriber cancels it (or the run ends)."""
        try:
            with self._scope:
                tries = 0
                while True:
                    try:
                        await self._listen_once()
                    except Exception as exc:
                        # A broken connection, a server restart or a
                        # subscriber's failing callback: none may end the
                        # task (a system task's exception aborts the run).
                        logger.debug("postgres listener lost: %r", exc)
                    self._lost()
                    tries += 1
                    await trio.sleep(STORE_RECONNECT.delay(tries))
        finally:
            self._done.set()

    def _lost(self) -> None:
        ready, self._ready = self._ready, set()
        for subscriber in ready:
            subscriber.listening(False)

    async def _listen_once(self) -> None:
        conninfo, timeout_s = self._key
        conn = await PgConnection.connect(conninfo, timeout_s=timeout_s, prepare=False)
        try:
            listened: set[str] = set()
            while True:
                wanted = {c for s in self._subscribers for c in s.channels}
                if wanted != listened:
                    await conn.script(_listen_script(listened, wanted))
                    listened = wanted
                    continue  # someone may have subscribed meanwhile
                for subscriber in self._subscribers - self._ready:
                    self._ready.add(subscriber)
                    subscriber.listening(True)
                for channel, payload in conn.notifies():
                    for subscriber in list(self._subscribers):
                        if channel in subscriber.channels:
                            subscriber.heard(channel, payload)
                with trio.CancelScope() as self._wait:
                    await trio.lowlevel.wait_readable(conn.socket)
                self._wait = None
        finally:
            self._wait = None
            conn.close()


def _listen_script(listened: set[str], wanted: set[str]) -> bytes:
    statements = [f'unlisten "{c}";' for c in sorted(listened - wanted)]
    statements += [f'listen "{c}";' for c in sorted(wanted - listened)]
    return " ".join(statements).encode()


class _Registry:
    def __init__(self) -> None:
        self.pools: dict[Hashable, _PoolEntry] = {}
        self.listeners: dict[tuple[str, float], SharedListener] = {}


_REGISTRY: trio.lowlevel.RunVar[_Registry] = trio.lowlevel.RunVar("a2trio.stores.postgres.shared")


def _registry() -> _Registry:
    try:
        return _REGISTRY.get()
    except LookupError:
        registry = _Registry()
        _REGISTRY.set(registry)
        return registry


def acquire_pool(key: Hashable, make: Callable[[], PgPool], *, owned: bool) -> PoolLease:
    """A share of the run's pool for ``key``, made by ``make()`` if there is none.

    ``owned``: the registry closes the pool when its last lease is released
    (False for a pool the caller passed in, keyed by the pool itself).
    """
    registry = _registry()
    entry = registry.pools.get(key)
    if entry is None:
        entry = registry.pools[key] = _PoolEntry(registry, key, make(), owned)
    entry.leases += 1
    return PoolLease(entry)


def listener(conninfo: str, *, timeout_s: float) -> SharedListener:
    """The run's listener for ``conninfo``, made (not yet connected) if there is
    none or the last one retired."""
    registry = _registry()
    key = (conninfo, timeout_s)
    found = registry.listeners.get(key)
    if found is None:
        found = registry.listeners[key] = SharedListener(registry, key)
    return found
