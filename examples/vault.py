"""A bank vault: an actor whose calls deposit and withdraw, with a public view.

    python -m a2trio.serve examples.vault:app --port 8000

    curl -s localhost:8000/vault/alice \
      -d '{"event": "deposit", "input": {"amount": 50}, "messageId": "m1"}'
    curl -s localhost:8000/vault/alice -d '{"event": "withdraw", "input": {"amount": 80}}'
    curl -s 'localhost:8000/vault/alice?snapshot=1'
    curl -sN localhost:8000/vault/alice -H 'accept: text/event-stream'

The vault's state keeps an internal audit trail beside the balance; the app's
``view`` shows every lane (call answers, snapshots, stream frames) only the
public part. A handler reacts to large deposits, as on any contract.

Declared in the typed forms: each event type is a handle (``deposited(...)``
takes only a ``Deposited``), each call's function is held to its input type
by ``a2trio.call``, and ``a2trio.on(deposited, review)`` to the handler's
payload type; mypy strict checks this file.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

import a2trio
from a2trio.transport import Request, asgi


class Deposited(msgspec.Struct, frozen=True):
    amount: int


class Withdrawn(msgspec.Struct, frozen=True):
    amount: int


class Flagged(msgspec.Struct, frozen=True):
    reason: str


Amount = Annotated[int, msgspec.Meta(gt=0)]


class Deposit(msgspec.Struct, frozen=True):
    amount: Amount


class Withdraw(msgspec.Struct, frozen=True):
    amount: Amount


class Vault(msgspec.Struct, frozen=True):
    """The whole state: the balance, and an audit trail only staff should see."""

    balance: int = 0
    audit: tuple[str, ...] = ()


class PublicVault(msgspec.Struct, frozen=True):
    """What the public mount shows."""

    balance: int


deposited = a2trio.event_type("deposited", Deposited)
withdrawn = a2trio.event_type("withdrawn", Withdrawn)
flagged = a2trio.event_type("flagged", Flagged)


def fold(state: Vault, event: a2trio.Event[Deposited | Withdrawn | Flagged]) -> Vault:
    payload = event.payload
    if isinstance(payload, Deposited):
        return Vault(state.balance + payload.amount, (*state.audit, f"+{payload.amount}"))
    if isinstance(payload, Withdrawn):
        return Vault(state.balance - payload.amount, (*state.audit, f"-{payload.amount}"))
    return Vault(state.balance, (*state.audit, f"flagged: {payload.reason}"))


async def deposit(state: Vault, input: Deposit) -> a2trio.AppendInput:
    return deposited(Deposited(input.amount))


async def withdraw(state: Vault, input: Withdraw) -> a2trio.AppendInput:
    if input.amount > state.balance:
        raise a2trio.Refused(f"insufficient funds: the balance is {state.balance}")
    return withdrawn(Withdrawn(input.amount))


vault = a2trio.actor(
    "vault",
    events=[deposited, withdrawn, flagged],
    state=a2trio.Reducer("vault-v1", Vault(), fold),
    calls={
        "deposit": a2trio.call(Deposit, deposit, emits=[deposited]),
        "withdraw": a2trio.call(Withdraw, withdraw, emits=[withdrawn]),
    },
)

#: Deposits at or above this are flagged for review by a handler.
LARGE_DEPOSIT = 10_000


async def review(ctx: a2trio.HandlerContext[Deposited]) -> a2trio.Returned:
    """Handlers work on actor events as on any session's."""
    if ctx.event.payload.amount >= LARGE_DEPOSIT:
        return flagged(Flagged(f"large deposit at #{ctx.event.index}"))
    return None


def public_view(state: Vault, request: Request) -> PublicVault:
    """The public mount's projection: the audit trail never leaves the server."""
    return PublicVault(state.balance)


server = a2trio.Server(vault, handlers=[a2trio.on(deposited, review)])
app = asgi(server, views={"vault": public_view})
