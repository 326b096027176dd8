"""Actor calls on every store: durable messageId answers, conflicts across
servers sharing one store (two processes' worth of state), refusals.

The store-level halves (``expected_index``, ``find_event``) are conformance
checks; this runs the whole call on each backend."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import a2trio
from a2trio.stores.base import Store
from a2trio.stores.conformance import ManualClock
from examples.vault import Deposit, Deposited, Vault, vault

BACKENDS = ["memory", "sqlite", "postgres", "redis"]


@asynccontextmanager
async def _store(backend: str) -> AsyncIterator[Store]:
    module = importlib.import_module(f"tests.backends.{backend}")
    async with module.open_store(ManualClock()) as store:
        yield store


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_retried_call_answers_the_original_on_every_store(backend: str) -> None:
    runs: list[int] = []

    async def deposit(state: Vault, input: Deposit) -> list[a2trio.AppendInput]:
        runs.append(input.amount)
        return [vault.event("deposited", Deposited(input.amount))] * 3

    triple = a2trio.actor(
        "vault",
        events=vault.events,
        state=vault.reducer,
        calls={"deposit": a2trio.call(Deposit, deposit)},
    )
    async with _store(backend) as store:
        async with a2trio.Server(triple, store=store) as server:
            alice = server.actor("alice")
            first = await alice.call("deposit", {"amount": 2}, message_id="m-1")
            assert (first.state.balance, first.index) == (6, 3)
            later = await alice.call("deposit", {"amount": 5})
            assert later.index == 6
            await server.settle()
        # A new server (a restarted process: no memory of the first call).
        async with a2trio.Server(triple, store=store) as server:
            again = await server.actor("alice").call("deposit", {"amount": 2}, message_id="m-1")
            assert again == first, "the original {state, index}, not the current one"
            assert runs == [2, 5]
            assert len(await server.session("alice").history()) == 6


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_servers_on_one_store_never_lose_a_deposit(backend: str) -> None:
    async with _store(backend) as store:
        async with (
            a2trio.Server(vault, store=store) as one,
            a2trio.Server(vault, store=store) as two,
        ):
            answers: list[int] = []

            async def deposit(server: a2trio.Server, n: int) -> None:
                answer = await server.actor("shared").call("deposit", {"amount": n})
                answers.append(answer.index)

            async with trio.open_nursery() as nursery:
                for n in range(1, 7):
                    nursery.start_soon(deposit, one if n % 2 else two, n)
            final = await one.actor("shared").state()
            assert final.state.balance == 21
            assert sorted(answers) == list(range(1, 7))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_refusal_writes_nothing_on_every_store(backend: str) -> None:
    async with _store(backend) as store, a2trio.Server(vault, store=store) as server:
        with pytest.raises(a2trio.Refused):
            await server.actor("bob").call("withdraw", {"amount": 1}, message_id="w")
        assert await server.session("bob").history() == []
        assert await server.actor("bob").state() == a2trio.ActorState(Vault(), 0)
