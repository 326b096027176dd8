"""A payments worker whose gateway fails: find the dead letter, redrive it.

Run it with the inspector enabled (the embedded sqlite store at
``.a2/dev.db``; ``--store memory:`` keeps nothing)::

    python -m a2trio.serve examples.payments:app

Charge a card whose first attempt the gateway refuses::

    curl -X POST localhost:8000/payments/acct-1 -d '{"events": [{"type": "charge",
         "payload": {"charge_id": "c1", "cents": 1250, "card": "flaky"}}]}'

What happens: the ``collect`` handler's first attempt raises (the gateway
"times out"); with ``max_failures=1`` the charge is dead-lettered at once, and
the ``payments`` lane stalls behind it. Open http://localhost:8000/_a2/inspect
and press **Redrive**: the second attempt succeeds, returns a ``collected``
event, and the lane moves on. The same from the command line::

    python -m a2trio.inspect --app examples.payments:server dead-letters
    python -m a2trio.inspect --app examples.payments:server redrive acct-1 1 --reason "gateway back"

An ``expired`` card fails every attempt: redrive it and it is dead-lettered
again, and the inspector lists each failed attempt under it with its own
traceback (``a2trio inspect ... event acct-2 1`` prints them whole).

Its numbers, as Prometheus text (with the ``metrics`` extra installed; the
core install serves everything else and no ``/_a2/metrics``): the dead letter
shows as ``a2trio_dead_letters{contract="payments"} 1.0`` and the failed
attempt in ``a2trio_handler_attempts_total``::

    curl localhost:8000/_a2/metrics

Who may look and act: :func:`operators_on_this_machine`, the app's
``authorize`` policy, lets loopback clients inspect, act and scrape the
metrics, and everyone push. A real app checks its operators' credentials
there instead.
"""

from __future__ import annotations

import importlib.util

import msgspec

import a2trio
from a2trio.metrics import PrometheusMetrics
from a2trio.transport import (
    InspectOperation,
    MetricsOperation,
    Operation,
    RedriveOperation,
    Request,
    RetryNowOperation,
    SkipOperation,
    asgi,
)

__all__ = ["app", "operators_on_this_machine", "payments", "server"]


class Charge(msgspec.Struct, frozen=True):
    charge_id: str
    cents: int
    card: str


class Collected(msgspec.Struct, frozen=True):
    charge_id: str
    attempt: int


payments = a2trio.contract("payments", events={"charge": Charge, "collected": Collected})


async def collect(ctx: a2trio.HandlerContext[Charge]) -> a2trio.Returned:
    """Collect a charge; a ``flaky`` card's first attempt fails, an
    ``expired`` card's every attempt."""
    charge = ctx.event.payload
    if charge.card == "flaky" and ctx.attempt == 1:
        raise ConnectionError(f"the gateway timed out collecting {charge.charge_id}")
    if charge.card == "expired":
        raise ValueError(f"card expired: {charge.charge_id} declined (attempt {ctx.attempt})")
    return payments.event("collected", Collected(charge.charge_id, ctx.attempt))


server = a2trio.Server(
    payments,
    handlers={"charge": a2trio.handler(collect, lane="payments")},
    timings=a2trio.Timings(max_failures=1),
    metrics=PrometheusMetrics(),
)


def operators_on_this_machine(request: Request, op: Operation) -> bool:
    """Inspection, operator actions and metrics from loopback only; pushes from anyone."""
    operator = InspectOperation | RedriveOperation | SkipOperation | RetryNowOperation
    if isinstance(op, operator | MetricsOperation):
        return request.client is not None and request.client[0] in ("127.0.0.1", "::1")
    return True


# The metrics endpoint is written by prometheus_client (the `metrics` extra):
# without it the example still serves, inspects and repairs.
SCRAPED = importlib.util.find_spec("prometheus_client") is not None

app = asgi(server, inspect=True, metrics=SCRAPED, authorize=operators_on_this_machine)
