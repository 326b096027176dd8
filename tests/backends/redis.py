"""The Redis store as a conformance backend: a fresh key prefix per store.

Every store gets its own prefix, ``a2t-<random>``, on the server at
``A2_TEST_REDIS_URL`` (default: the local server), and its keys are deleted
on exit (``SCAN MATCH <prefix>:*``, then ``UNLINK``), so concurrent test runs
never see or delete each other's keys. The server itself is never flushed,
restarted or reconfigured. If it is unreachable the checks skip with the
reason, unless ``A2_TEST_REDIS_REQUIRED=1`` (CI), where they fail.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import coredis
import pytest
import trio
from coredis.retry import NoRetryPolicy

from a2trio.clock import Clock
from a2trio.stores.base import Store
from a2trio.stores.redis import RedisStore, redis
from tests.backends import unreachable_port

__all__ = [
    "REDIS_URL",
    "REQUIRED",
    "Throwaway",
    "delete_prefix",
    "new_prefix",
    "open_store",
    "open_unreachable_store",
    "reachable",
    "throwaway_redis",
]

# Read at import: the autouse fixture clears A2_* variables before each test.
REDIS_URL = os.environ.get("A2_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRED = os.environ.get("A2_TEST_REDIS_REQUIRED") == "1"

_checked: str | None = None


def new_prefix() -> str:
    """A key prefix no other store or test run uses."""
    return f"a2t-{secrets.token_hex(6)}"


def _client(url: str) -> coredis.Redis[bytes]:
    return coredis.Redis.from_url(url, retry_policy=NoRetryPolicy(), connect_timeout=3)


async def reachable(url: str = REDIS_URL) -> None:
    """Skip (or, under ``A2_TEST_REDIS_REQUIRED=1``, fail) when Redis is down."""
    global _checked
    if _checked == url:
        return
    try:
        async with _client(url) as client:
            await client.ping()
    except Exception as exc:
        if REQUIRED:
            raise
        pytest.skip(f"Redis at {url} is unreachable ({exc}); start it or unset it")
    _checked = url


async def delete_prefix(prefix: str, url: str = REDIS_URL) -> int:
    """Delete every key under ``prefix:`` (only those). Returns how many."""
    deleted = 0
    with trio.CancelScope(shield=True):
        async with _client(url) as client:
            batch: list[bytes] = []
            async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += await client.unlink(batch)
                    batch = []
            if batch:
                deleted += await client.unlink(batch)
    return deleted


@asynccontextmanager
async def open_store(clock: Clock, **options: Any) -> AsyncIterator[Store]:
    """A new Redis store under a fresh key prefix on ``clock``; its keys are
    deleted and the store closed on exit."""
    await reachable()
    prefix = new_prefix()
    store: RedisStore = redis(REDIS_URL, key_prefix=prefix, clock=clock, **options)
    try:
        async with store:
            yield store
    finally:
        await store.aclose()
        await delete_prefix(prefix)


@asynccontextmanager
async def open_unreachable_store(clock: Clock) -> AsyncIterator[Store]:
    """A Redis store pointed at a loopback port where nothing listens (bound,
    never listening, so each connection is refused), not entered; closed on exit."""
    with unreachable_port() as port:
        store = redis(f"redis://127.0.0.1:{port}/0", key_prefix=new_prefix(), clock=clock)
        try:
            yield store
        finally:
            await store.aclose()


class Throwaway:
    """A redis-server of a test's own on a free loopback port, in a temporary
    directory, with AOF ``appendfsync always`` (so a SIGKILL loses nothing):
    the test may kill and restart it at will. Never the machine's shared one."""

    def __init__(self, directory: str, port: int) -> None:
        self.directory = directory
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: trio.Process | None = None

    async def start(self) -> None:
        command = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.directory,
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--logfile",
            "redis.log",
        ]
        self.process = await trio.lowlevel.open_process(command)
        # A hang guard: the server answers once it has started, however slowly.
        with trio.fail_after(120):
            while not await self._answers():  # noqa: ASYNC110 - another process
                await trio.sleep(0.02)

    async def _answers(self) -> bool:
        """Whether the server answers PING (over a plain socket: a coredis
        client that fails to connect leaves its streams to the collector)."""
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        except OSError:
            return False
        async with stream:
            try:
                await stream.send_all(b"PING\r\n")
                return (await stream.receive_some(64)).startswith(b"+PONG")
            except trio.BrokenResourceError:
                return False

    async def kill(self) -> None:
        """SIGKILL the server and wait for it to die."""
        process = self.process
        if process is not None:
            process.kill()
            await process.wait()
            self.process = None

    async def restart(self) -> None:
        await self.kill()
        await self.start()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def throwaway_redis() -> AsyncIterator[Throwaway]:
    """Start a redis-server of the test's own; kill it and delete its files on
    exit. Skips when ``redis-server`` is not installed (fails under
    ``A2_TEST_REDIS_REQUIRED=1``)."""
    import shutil
    import tempfile

    if shutil.which("redis-server") is None:
        reason = "redis-server is not installed: cannot run a throwaway server"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    directory = tempfile.mkdtemp(prefix="a2trio-redis-")
    server = Throwaway(directory, _free_port())
    try:
        await server.start()
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await server.kill()
            shutil.rmtree(directory, ignore_errors=True)
