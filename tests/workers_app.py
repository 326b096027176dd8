"""The app ``serve --workers 2`` runs in tests/test_serve_workers.py: a ``ping``
handled into one ``pong`` (carrying the pid of the worker that ran it), and a
presence field. Its store comes from the test: ``A2_TEST_WORKERS_PG`` (a DSN)
with ``A2_TEST_WORKERS_SCHEMA``, ``A2_TEST_WORKERS_REDIS`` (a URL) with
``A2_TEST_WORKERS_PREFIX``, or else ``A2_STORE`` (``--store``)."""

from __future__ import annotations

import os

import msgspec

import a2trio
from a2trio.stores.base import Store

__all__ = ["answer", "pings", "server"]


class Ping(msgspec.Struct, frozen=True):
    n: int


class Pong(msgspec.Struct, frozen=True):
    n: int
    pid: int


pings = a2trio.contract("pings", events={"ping": Ping, "pong": Pong}, presence={"status": str})


async def answer(ctx: a2trio.HandlerContext[Ping]) -> a2trio.Returned:
    """One pong per ping, saying which process ran the handler."""
    return pings.event("pong", Pong(ctx.event.payload.n, os.getpid()))


def _store() -> Store | None:
    if "A2_TEST_WORKERS_PG" in os.environ:
        return a2trio.stores.postgres(
            os.environ["A2_TEST_WORKERS_PG"], schema=os.environ["A2_TEST_WORKERS_SCHEMA"]
        )
    if "A2_TEST_WORKERS_REDIS" in os.environ:
        return a2trio.stores.redis(
            os.environ["A2_TEST_WORKERS_REDIS"], key_prefix=os.environ["A2_TEST_WORKERS_PREFIX"]
        )
    return None


server = a2trio.Server(pings, store=_store(), handlers={"ping": answer})
