"""What metrics cost the engine, in CPU rather than wall time (issue 35).

    python bench/metrics_cost.py                       # process_time, 3 rounds
    python bench/metrics_cost.py --events 20000 --rounds 5
    valgrind --tool=callgrind --callgrind-out-file=/tmp/off.out \\
        python bench/metrics_cost.py --only off --rounds 1
    valgrind --tool=callgrind --callgrind-out-file=/tmp/on.out \\
        python bench/metrics_cost.py --only prometheus --rounds 1

Two measures. The whole engine: a fixed in-memory workload under Trio's
mock clock (no sleeping, no I/O): ``--events`` single-event appends to
``--sessions`` sessions, each handled by a no-op handler that returns one
event, run to the end with ``settle()``. It
runs with no metrics (``off``), with :class:`a2trio.metrics.PrometheusMetrics`
(``prometheus``) and with :class:`a2trio.otel.OpenTelemetryMetrics` over the
SDK with an in-memory reader (``otel``), and prints each one's CPU seconds
(``time.process_time``, the best of ``--rounds``, so a loaded machine skews
it less than wall time) and its cost against ``off``. Under callgrind
compare the instruction counts (``Ir`` in the summary) of one round each
instead, less those of ``--events 0`` (the interpreter's start and imports).

Measured (issue 35, 1,000 events, callgrind): the workload costs 1.77 M
instructions per event with metrics off; one event's Prometheus calls cost
23 k more (``--hooks``), 1.3 %; with the OpenTelemetry SDK (an in-memory
reader) the workload costs 2.16 M, 22 % more: the SDK's own work per
measurement. ``time.process_time``, 4,000 events, best of 5: +0.4 % and +21 %.
Across runs of the same command the counts drift by a percent or two
(garbage collection, address-dependent hashing), as much as the cost itself,
so the second measure isolates it:

    valgrind --tool=callgrind python bench/metrics_cost.py --hooks on --events 20000
    valgrind --tool=callgrind python bench/metrics_cost.py --hooks off --events 20000

replays, ``--events`` times, what the engine does for one appended and
handled event of this workload with metrics on (two ``appended``, one
``attempt_ended``, three store calls through ``measured``) or off (the same
three calls awaited bare). The difference per event, over the workload's
instructions per event, is what metrics cost it.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Coroutine

import msgspec
import trio
import trio.testing

import a2trio
from a2trio.stores import memory


class Ordered(msgspec.Struct, frozen=True):
    item: str


class Shipped(msgspec.Struct, frozen=True):
    item: str


shop = a2trio.contract("shop", events={"ordered": Ordered, "shipped": Shipped})


async def ship(ctx: a2trio.HandlerContext[Ordered]) -> a2trio.AppendInput:
    return shop.event("shipped", Shipped(ctx.event.payload.item))


def _metrics(kind: str) -> Callable[[], a2trio.Metrics | None]:
    if kind == "off":
        return lambda: None
    if kind == "prometheus":
        from a2trio.metrics import PrometheusMetrics

        return PrometheusMetrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from a2trio.otel import OpenTelemetryMetrics

    return lambda: OpenTelemetryMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def workload(metrics: a2trio.Metrics | None, events: int, sessions: int) -> None:
    server = a2trio.Server(
        shop,
        store=memory(clock=a2trio.TrioClock()),
        handlers={"ordered": ship},
        metrics=metrics,
        sweep=False,
    )
    async with server:
        handles = [server.session(f"s{n}") for n in range(sessions)]
        for n in range(events):
            await handles[n % sessions].append(shop.event("ordered", Ordered(str(n))))
        await server.settle()


def hooks(on: bool, events: int) -> None:
    """One event's metrics calls, ``events`` times (see the module docstring)."""
    from a2trio.engine.attempt import Outcome
    from a2trio.engine.context import measured
    from a2trio.engine.runs import outcome_label
    from a2trio.metrics import PrometheusMetrics

    metrics = PrometheusMetrics() if on else None
    done = Outcome("processed")

    async def call() -> int:
        return 1

    def drive(coro: Coroutine[None, None, int]) -> None:
        try:
            coro.send(None)
        except StopIteration:
            pass

    for _ in range(events):
        m = metrics
        if m is None:
            drive(call())
            drive(call())
            drive(call())
            continue
        drive(measured(m, "append", call()))
        m.appended("shop", "ordered", "external")
        drive(measured(m, "claim", call()))
        drive(measured(m, "complete", call()))
        m.appended("shop", "shipped", "handler")
        m.attempt_ended("shop", "ordered", outcome_label(done), 0.0001)


def measure(kind: str, events: int, sessions: int) -> float:
    make = _metrics(kind)
    gc.collect()
    started = time.process_time()
    trio.run(workload, make(), events, sessions, clock=trio.testing.MockClock(autojump_threshold=0))
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("off", "prometheus", "otel"))
    parser.add_argument("--hooks", choices=("on", "off"), help="replay one event's metrics calls")
    args = parser.parse_args()
    if args.hooks:
        hooks(args.hooks == "on", args.events)
        return
    kinds = [args.only] if args.only else ["off", "prometheus", "otel"]
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for kind in kinds:  # interleaved, so drift hits each alike
            took = measure(kind, args.events, args.sessions)
            best[kind] = min(best.get(kind, took), took)
    print(f"{args.events} events over {args.sessions} sessions, best of {args.rounds}")
    print(f"{'metrics':<12}{'CPU s':>10}{'vs off':>10}")
    for kind in kinds:
        versus = f"{(best[kind] / best['off'] - 1) * 100:+.1f}%" if "off" in best else ""
        print(f"{kind:<12}{best[kind]:>10.3f}{versus:>10}")


if __name__ == "__main__":
    main()
