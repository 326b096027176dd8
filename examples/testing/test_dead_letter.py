"""A retry that becomes a dead letter.

A handler that raises fails its attempt. The drain arms a watchdog at the
claim's expiry plus grace (35 s), which retries the event; after
``Timings.max_failures`` (10) failures the event is dead-lettered and its
lane stays blocked until someone intervenes.
"""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory

pytestmark = pytest.mark.trio


class Invoiced(msgspec.Struct, frozen=True):
    amount: int


class Charged(msgspec.Struct, frozen=True):
    amount: int


billing = a2trio.contract("billing", events={"invoiced": Invoiced, "charged": Charged})


async def charge(ctx: a2trio.HandlerContext[Invoiced]) -> a2trio.Returned:
    raise ConnectionError("payment provider is down")


async def test_retries_end_in_a_dead_letter(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    app = await a2_app(billing, handlers={"invoiced": charge})
    s = app.session("invoice-7")
    await s.append(billing.event("invoiced", Invoiced(120)))
    await app.settle()
    await app.assert_outcome(s, 1, "failed", failures=1)

    await app.advance(10 * 60)  # ten minutes of watchdog retries, in no real time
    outcome = await app.assert_outcome(s, 1, "dead_lettered", failures=10, attempts=10)
    assert outcome.last_error is not None
    assert "ConnectionError: payment provider is down" in outcome.last_error

    spans = app.telemetry.find("a2.event", {"a2.event.type": "invoiced"})
    assert [span.attributes["a2.event.outcome"] for span in spans] == 9 * ["failed"] + [
        "dead_lettered"
    ]
    await app.assert_log(s, ["invoiced"])
