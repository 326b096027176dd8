"""Which Redis driver for the Trio store: coredis natively, redis-py through a
thread, or redis-py's asyncio client through trio-asyncio (as
``bench/pg_driver.py`` did for psycopg).

Usage: ``python bench/redis_driver.py [--url redis://127.0.0.1:6379/0] [--n 5000]``

For each driver, on a key prefix of its own (deleted afterwards):

* **cancellation**: 300 ``INCR``s, each cancelled after 0-1 ms, then an
  ``ECHO`` of a fresh token on the same client: a reply that does not match is
  a desynchronised connection (the worst failure: a later call gets an earlier
  call's answer). Counts the desyncs and how many cancelled calls ran anyway.
* **sequential**: ``--n`` round trips of a small ``EVALSHA`` (the shape of
  the store's scripts), one at a time: calls/s and client CPU per call.
* **concurrent**: the same from 16 tasks at once.

Prints a Markdown table (docs/performance.md keeps the measured one).
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

SCRIPT = "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]); return redis.call('HLEN', KEYS[1])"
CONCURRENCY = 16


class Driver:
    name = ""

    async def open(self, url: str) -> None: ...
    async def close(self) -> None: ...
    async def eval(self, key: str, field: str, value: str) -> Any: ...
    async def incr(self, key: str) -> Any: ...
    async def echo(self, token: str) -> Any: ...
    async def get(self, key: str) -> Any: ...


class CoredisDriver(Driver):
    name = "coredis 6 (native, anyio on Trio)"

    async def open(self, url: str) -> None:
        import coredis
        from coredis.commands.script import Script
        from coredis.retry import NoRetryPolicy

        self._client = coredis.Redis.from_url(url, retry_policy=NoRetryPolicy())
        self._cm = self._client.__aenter__()
        await self._cm
        self._script = Script(script=SCRIPT)

    async def close(self) -> None:
        await self._client.__aexit__(None, None, None)

    async def eval(self, key: str, field: str, value: str) -> Any:
        return await self._script([key], [field, value], client=self._client)

    async def incr(self, key: str) -> Any:
        return await self._client.incr(key)

    async def echo(self, token: str) -> Any:
        return (await self._client.echo(token)).decode()

    async def get(self, key: str) -> Any:
        return await self._client.get(key)


class ThreadDriver(Driver):
    name = "redis-py 8 sync, trio.to_thread"

    async def open(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, max_connections=64)
        self._script = self._client.register_script(SCRIPT)
        self._limiter = trio.CapacityLimiter(CONCURRENCY)

    async def close(self) -> None:
        self._client.close()

    async def _run(self, fn: Callable[[], Any]) -> Any:
        # abandon_on_cancel: a cancelled call returns at once; its thread
        # finishes the command on its own connection.
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=self._limiter)

    async def eval(self, key: str, field: str, value: str) -> Any:
        return await self._run(lambda: self._script(keys=[key], args=[field, value]))

    async def incr(self, key: str) -> Any:
        return await self._run(lambda: self._client.incr(key))

    async def echo(self, token: str) -> Any:
        return (await self._run(lambda: self._client.echo(token))).decode()

    async def get(self, key: str) -> Any:
        return await self._run(lambda: self._client.get(key))


class AsyncioDriver(Driver):
    name = "redis-py 8 asyncio, trio-asyncio"

    async def open(self, url: str) -> None:
        import redis.asyncio as aioredis
        import trio_asyncio

        self._aio = trio_asyncio.aio_as_trio
        self._client = aioredis.Redis.from_url(url, max_connections=64)
        self._script = self._client.register_script(SCRIPT)

    async def close(self) -> None:
        await self._aio(self._client.aclose)()

    async def eval(self, key: str, field: str, value: str) -> Any:
        return await self._aio(self._script)(keys=[key], args=[field, value])

    async def incr(self, key: str) -> Any:
        return await self._aio(self._client.incr)(key)

    async def echo(self, token: str) -> Any:
        return (await self._aio(self._client.echo)(token)).decode()

    async def get(self, key: str) -> Any:
        return await self._aio(self._client.get)(key)


async def _cancellation(driver: Driver, prefix: str) -> tuple[int, int, int]:
    """(cancelled calls, how many of them ran, desynced replies)."""
    key = f"{prefix}:counter"
    cancelled = desynced = 0
    for n in range(300):
        with trio.move_on_after((n % 11) * 1e-4) as scope:
            await driver.incr(key)
        cancelled += scope.cancelled_caught
        token = secrets.token_hex(4)
        try:
            if await driver.echo(token) != token:
                desynced += 1
        except Exception:
            desynced += 1
    await trio.sleep(0.2)  # abandoned threads finish
    ran = int(await driver.get(key) or 0)
    completed = 300 - cancelled
    return cancelled, ran - completed, desynced


async def _throughput(driver: Driver, prefix: str, n: int, tasks: int) -> tuple[float, float]:
    """(calls/s, client CPU µs per call)."""
    per_task = n // tasks

    async def worker(t: int) -> None:
        for i in range(per_task):
            await driver.eval(f"{prefix}:h{t}", str(i % 100), "v")

    cpu, wall = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for t in range(tasks):
            nursery.start_soon(worker, t)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    calls = per_task * tasks
    return calls / wall, cpu / calls * 1e6


async def _measure(driver: Driver, url: str, n: int) -> list[str]:
    prefix = f"a2bench-{secrets.token_hex(4)}"
    await driver.open(url)
    try:
        await driver.eval(f"{prefix}:warm", "a", "b")
        cancelled, ran, desynced = await _cancellation(driver, prefix)
        seq_rate, seq_cpu = await _throughput(driver, prefix, n, 1)
        con_rate, con_cpu = await _throughput(driver, prefix, n, CONCURRENCY)
    finally:
        await driver.close()
        await _delete(url, prefix)
    return [
        driver.name,
        f"{desynced}",
        f"{ran} of {cancelled}",
        f"{seq_rate:,.0f}",
        f"{seq_cpu:.0f}",
        f"{con_rate:,.0f}",
        f"{con_cpu:.0f}",
    ]


async def _delete(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.unlink(*keys)
    client.close()


async def _in_loop(fn: Callable[[], Awaitable[list[str]]]) -> list[str]:
    import trio_asyncio

    async with trio_asyncio.open_loop():
        return await fn()


async def main(url: str, n: int) -> None:
    rows = [
        await _measure(CoredisDriver(), url, n),
        await _measure(ThreadDriver(), url, n),
        await _in_loop(lambda: _measure(AsyncioDriver(), url, n)),
    ]
    header = [
        "driver",
        "desynced replies after cancels",
        "cancelled calls that ran anyway",
        "sequential calls/s",
        "CPU µs/call",
        f"{CONCURRENCY} tasks calls/s",
        "CPU µs/call",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    trio.run(main, args.url, args.n)
