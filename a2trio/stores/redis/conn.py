"""The Redis store's command client, the one way its calls reach Redis, and
its one error point.

Every call is a script (``scripts``), run by :meth:`Connection.run`:
``EVALSHA`` on the store's client, loading the script once per server.
Inside ``async with store`` one task of the store's nursery holds the client
(:meth:`Connection.serve`: its connection pool lives there, and a failed pool
is reopened after a backoff); outside it each call opens a short-lived client
of its own. The client never retries on its own: a lost connection is
``STORE_UNAVAILABLE`` (:func:`errors`) and the caller retries.

**Batches.** On the store's client, the drain's and the feeds' calls
(``scripts.BATCHED``) that arrive while others are in flight go out as one
``EVALSHA`` of ``scripts.BATCH`` (``batch``): coredis' cost is mostly per
round trip, and under load it was most of the client's CPU. Each call's
script runs as it would alone and answers alone. A call that finds nothing
in flight is its own script's ``EVALSHA`` at once.

**Cancellation.** A call's round trip is shielded (coredis loses a pool slot
to a connection cancelled mid-connect, and outside ``async with store`` its
own client's connection tasks would be cancelled under it; a batched call
waits uncancellably instead: ``batch``): a cancellation lands at the
checkpoint after the reply, so a cancelled call either ran whole or never
started, and waits at most the connect and command timeouts (a batched one
behind the batches ahead of it).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import coredis
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis.exceptions import NoScriptError, ResponseError
from coredis.retry import NoRetryPolicy

from ...backoff import STORE_RECONNECT
from ...errors import store_unavailable
from ..group import GroupStatistics
from . import codec
from .batch import Answer, Batches, Request
from .scripts import BATCH, BATCHED

__all__ = ["Connection", "errors"]

_log = logging.getLogger("a2trio.stores.redis")

#: Batches in flight at once: a second hides the first one's round trip.
_LEADERS = 2
#: Calls per batch: a batch holds Redis for its scripts' time.
_MAX_BATCH = 256


def errors(what: str) -> store_unavailable:
    """The Redis store's one error translation: every failure (a lost
    connection, a timeout, a script error, the store closed) is
    ``STORE_UNAVAILABLE``; verdicts pass through."""
    return store_unavailable(what)


def _closing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` whose ``run`` always closes the memory streams
    the connection made in its constructor. coredis 6.9 closes them only once
    connected, so a connection that failed (or was cancelled) while connecting
    leaked them (a ``ResourceWarning`` each, while Redis is down)."""

    class Closing(connection_class):  # type: ignore[misc]
        async def run(self, **kwargs: Any) -> None:
            try:
                await super().run(**kwargs)
            finally:
                for value in list(vars(self).values()):
                    if isinstance(value, MemoryObjectSendStream | MemoryObjectReceiveStream):
                        value.close()

    Closing.__name__ = Closing.__qualname__ = f"Closing{connection_class.__name__}"
    return Closing


class Connection:
    """One store's command client.

    Args:
      url: the store's URL.
      connect_timeout_s: each connection attempt fails after this long.
      command_timeout_s: a reply that takes longer fails.
    """

    def __init__(
        self, url: str, *, connect_timeout_s: float, command_timeout_s: float | None
    ) -> None:
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._shas: dict[str, str] = {}
        self._client: coredis.Redis[bytes] | None = None
        self._closed = False
        self._batches = Batches(self._round_trip, leaders=_LEADERS, max_batch=_MAX_BATCH)

    @property
    def client(self) -> coredis.Redis[bytes] | None:
        """The client :meth:`serve` holds, ``None`` while there is none."""
        return self._client

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran: every later call fails."""
        return self._closed

    def close(self) -> None:
        self._closed = True

    def pipeline_statistics(self) -> GroupStatistics:
        """How batched calls on the store's client were sent (tests,
        benchmarks): ``groups`` round trips for ``members`` calls."""
        return self._batches.statistics()

    def forget(self) -> None:
        """The store's tasks end: calls stop using the client :meth:`serve` held."""
        self._client = None

    def new_client(self) -> coredis.Redis[bytes]:
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self.url,
            decode_responses=False,
            retry_policy=NoRetryPolicy(),
            connect_timeout=self.connect_timeout_s,
            stream_timeout=self._command_timeout_s,
        )
        pool = client.connection_pool
        pool.connection_class = _closing(pool.connection_class)
        return client

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Hold the command client (its pool's tasks) until the store's tasks
        are cancelled; if the pool fails (its connections' tasks raise), open
        a new one after a backoff. Meanwhile calls open clients of their own."""
        tries = 0
        while True:
            try:
                async with self.new_client() as client:
                    self._client = client
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED
                    await trio.sleep_forever()
            except Exception:
                # The pool's task group failed: the store outlives it (callers
                # got STORE_UNAVAILABLE from their own calls). Cancellation is
                # a BaseException: it ends this.
                _log.warning("the Redis client failed; reopening it", exc_info=True)
            finally:
                self._client = None
            tries += 1
            await trio.sleep(STORE_RECONNECT.delay(tries))

    async def run(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script (``EVALSHA``, loading it once per server) on the
        store's client, or on a client of its own outside ``async with``.

        Raises:
          trio.ClosedResourceError: after :meth:`close` (callers' ``errors``
            make it ``STORE_UNAVAILABLE``).

        Cancellation: shielded; see the module docstring.
        """
        if self._closed:
            raise trio.ClosedResourceError("this Redis store was closed: create a new one")
        # Shielded: coredis leaks a pool slot for a connection cancelled
        # mid-connect (after its pool's 64 are gone, every call waits
        # forever). Outside ``async with`` the client's exit is shielded too:
        # its connection tasks run in its pool's task group, opened here, and
        # cancelled with the caller they cut the call's connection under it;
        # the pool's exit then let out the driver's error beside the
        # Cancelled. A call is bounded by the connect and command timeouts;
        # a cancellation lands at the checkpoint after it.
        client = self._client
        if client is not None and source in BATCHED:
            answer = await self._batches.submit(Request(client, source, keys, args))
            await trio.lowlevel.checkpoint()
            if answer.error is not None:
                raise answer.error
            return answer.reply
        with trio.CancelScope(shield=True):
            if client is not None:
                result: Any = await self._evalsha(client, source, keys, args)
            else:
                async with self.new_client() as own:
                    result = await self._evalsha(own, source, keys, args)
        await trio.lowlevel.checkpoint()
        return result

    def _sha(self, source: str) -> str:
        sha = self._shas.get(source)
        if sha is None:
            sha = self._shas[source] = hashlib.sha1(source.encode()).hexdigest()
        return sha

    async def _round_trip(self, requests: Sequence[Request]) -> list[Answer]:
        """``Batches``' round trip: a lone call's own script, or ``BATCH``
        on the first call's client (the store's client when they queued)."""
        client: coredis.Redis[bytes] = requests[0].client
        if len(requests) == 1:
            [request] = requests
            try:
                reply = await self._evalsha(client, request.source, request.keys, request.args)
            except ResponseError as error:
                return [Answer(None, error)]
            return [Answer(reply, None)]
        keys: list[str] = []
        args: list[Any] = []
        for request in requests:
            keys += request.keys
            args += (BATCHED[request.source], len(request.keys), len(request.args))
            args += request.args
        flat = await self._evalsha(client, BATCH, keys, args)
        return [
            Answer(flat[at + 1], None)
            if flat[at] == 1
            else Answer(None, ResponseError(codec.text(flat[at + 1])))
            for at in range(0, len(flat), 2)
        ]

    async def _evalsha(
        self, client: coredis.Redis[bytes], source: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """``EVALSHA``, loading the script after a ``NOSCRIPT`` (a new or
        restarted server). (Straight to the command: coredis' ``Script``
        wrapper costs a fifth more client CPU per call.)"""
        sha = self._sha(source)
        try:
            return await client.evalsha(sha, keys, args)
        except NoScriptError:
            await client.script_load(source)
            return await client.evalsha(sha, keys, args)
