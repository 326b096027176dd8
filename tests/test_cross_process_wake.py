"""Work appended through one Postgres store starts at once in a server on another.

Two store instances on one schema stand for two processes: the appending one
declares the handlers but does not run them (``run_handlers=False``: an API
process), the other runs them (a worker). The worker hears the append through
its store's one LISTEN connection and drains, with no append of its own and no
scheduler. The worker runs no sweep, so nothing but the notification can
wake it: the bounds below are hang guards, not the assertion.
"""

from __future__ import annotations

import secrets

import trio

import a2trio
from a2trio.stores.base import AppendEvent
from a2trio.stores.postgres import ListenerStatistics

from .apps import Ordered, Shipped, orders
from .backends.postgres import database_dsn

#: A hang guard, long enough for a loaded machine: with the sweep off, a
#: wake-up that never comes fails however long the bound. (With the sweep on,
#: its 5 s pass found the work inside the old 10 s bound whether the wake-up
#: came or not, and the bound was a bet on the load all the same.)
GUARD_S = 60


async def test_a_worker_server_drains_what_another_process_appended() -> None:
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    ran: list[tuple[str, int]] = []
    handled = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
        ran.append((ctx.event.session_id, ctx.attempt))
        handled.set()
        return orders.event("shipped", Shipped(ctx.event.payload.item))

    api_store = a2trio.stores.postgres(dsn, schema=schema)
    worker_store = a2trio.stores.postgres(dsn, schema=schema)
    api = a2trio.Server(orders, store=api_store, handlers={"ordered": ship}, run_handlers=False)
    worker = a2trio.Server(orders, store=worker_store, handlers={"ordered": ship}, sweep=False)
    async with api, worker:
        await worker_store.wait_listening()
        await api.session("o1").append(orders.event("ordered", Ordered("book")))
        with trio.fail_after(GUARD_S):
            await handled.wait()
            await worker.settle()
        history = await api.session("o1").history()
    assert ran == [("o1", 1)]
    assert [e.type for e in history] == ["ordered", "shipped"]


async def test_a_servers_own_appends_are_not_drained_twice() -> None:
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    claims = 0
    store = a2trio.stores.postgres(dsn, schema=schema)
    original = store.claim_available

    async def counting(*args: object, **kwargs: object) -> a2trio.stores.base.ClaimResult:
        nonlocal claims
        claims += 1
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    store.claim_available = counting  # type: ignore[method-assign]
    # Another process's commit after ours: its notification follows our echo.
    # Its key is no contract's, so the server wakes no drain for it.
    other = a2trio.stores.postgres(dsn, schema=schema)
    sentinel = trio.Event()

    def heard(key: str) -> None:
        if key == "sentinel":
            sentinel.set()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        return None

    server = a2trio.Server(orders, store=store, handlers={"ordered": ship})
    async with other, server:
        store.pending.watch_pending(heard)
        await store.wait_listening()
        await server.session("o1").append(orders.event("ordered", Ordered("a")))
        await server.settle()
        await other.append("sentinel", [AppendEvent("note", {}, settled=True)])
        with trio.fail_after(GUARD_S):
            await sentinel.wait()
        assert store.listener_statistics() == ListenerStatistics(notifications=2, own=1)
        await server.settle()
    # The append claimed the event itself and the completion said nothing was
    # left, so any claim at all would come from the echo.
    assert claims == 0


async def test_another_process_appending_right_after_our_own_write_still_wakes_us() -> None:
    # The worker writes to the session, then the API process appends to the
    # same session at once: that notification is not an echo of ours.
    dsn = await database_dsn()
    schema = f"s_{secrets.token_hex(6)}"
    ran: list[str] = []
    handled = trio.Event()

    async def ship(ctx: a2trio.HandlerContext[Ordered]) -> None:
        ran.append(ctx.event.payload.item)
        if len(ran) == 2:
            handled.set()

    api_store = a2trio.stores.postgres(dsn, schema=schema)
    worker_store = a2trio.stores.postgres(dsn, schema=schema)
    api = a2trio.Server(orders, store=api_store, handlers={"ordered": ship}, run_handlers=False)
    worker = a2trio.Server(orders, store=worker_store, handlers={"ordered": ship}, sweep=False)
    async with api, worker:
        await worker_store.wait_listening()
        await worker.session("o1").append(orders.event("ordered", Ordered("mine")))
        await worker.settle()
        await api.session("o1").append(orders.event("ordered", Ordered("theirs")))
        with trio.fail_after(GUARD_S):
            await handled.wait()
    assert ran == ["mine", "theirs"]
