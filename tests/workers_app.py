"""The app ``serve --workers 2`` runs in tests/test_serve_workers.py: a ``ping``
handled into one ``pong`` (carrying the pid of the worker that ran it), and a
presence field (``server``); a ``tally`` actor whose ``add`` call sums its
inputs; and ``app``, both mounted with the inspector open to everyone (a
test's loopback server only). Their store comes from the test:
``A2_TEST_WORKERS_PG`` (a DSN) with ``A2_TEST_WORKERS_SCHEMA``,
``A2_TEST_WORKERS_REDIS`` (a URL) with ``A2_TEST_WORKERS_PREFIX``, or else
``A2_STORE`` (``--store``)."""

from __future__ import annotations

import os

import msgspec

import a2trio
from a2trio.stores.base import Store
from a2trio.transport import asgi

__all__ = ["add", "answer", "app", "pings", "server", "tallies", "tally"]


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


_shared = _store()
server = a2trio.Server(pings, store=_shared, handlers={"ping": answer})


class Add(msgspec.Struct, frozen=True):
    amount: int


class Added(msgspec.Struct, frozen=True):
    amount: int


class Total(msgspec.Struct, frozen=True):
    sum: int = 0
    calls: int = 0


def _fold(state: Total, event: a2trio.Event[Added]) -> Total:
    return Total(state.sum + event.payload.amount, state.calls + 1)


added = a2trio.event_type("added", Added)


def add(state: Total, input: Add) -> a2trio.AppendInput:
    """Commit the amount: the state is the sum of every committed call."""
    return added(Added(input.amount))


tally = a2trio.actor(
    "tally",
    events=[added],
    state=a2trio.Reducer("total-v1", Total(), _fold),
    calls={"add": a2trio.call(Add, add, emits=[added])},
)

tallies = a2trio.Server(tally, store=_shared)

app = asgi(server, tallies, inspect=True, authorize=lambda request, op: True)
