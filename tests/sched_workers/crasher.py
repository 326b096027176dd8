"""A process that is SIGKILLed mid-batch, for the durable scheduler's crash tests.

Usage: ``python crasher.py schedule TARGET`` or ``python crasher.py deliver
TARGET STORE``. TARGET is a ``postgresql://`` DSN or a sqlite file path.

* ``schedule``: 32 tasks schedule ``task-<n>`` concurrently (so their inserts
  share group commits) and print each id once ``schedule()`` has returned,
  until killed.
* ``deliver``: a server on the sqlite event store at STORE delivers the
  queued tasks (one event each) and prints ``delivered <id>`` as each one's
  append returns, until killed mid-delivery.
"""

from __future__ import annotations

import itertools
import sys

import msgspec
import trio

import a2trio
from a2trio.scheduler import AppendTask, ScheduledEvent
from a2trio.schedulers import DurableScheduler


class Tick(msgspec.Struct, frozen=True):
    n: int


fleet = a2trio.contract("fleet", events={"tick": Tick})
WRITERS = 32


def open_scheduler(target: str, max_in_flight: int = 64) -> DurableScheduler:
    if target.startswith("postgresql://"):
        return DurableScheduler.postgres(target, max_in_flight=max_in_flight)
    return DurableScheduler.sqlite(target, max_in_flight=max_in_flight)


def task(n: int, due_at_ms: int) -> AppendTask:
    return AppendTask(
        f"task-{n}",
        "fleet",
        f"s{n % 10}",
        due_at_ms,
        [ScheduledEvent(f"tick-{n}", "tick", {"n": n})],
    )


async def schedule(target: str) -> None:
    numbers = itertools.count()
    clock = a2trio.SystemClock()
    async with open_scheduler(target) as scheduler:

        async def writer() -> None:
            for n in numbers:
                await scheduler.schedule(task(n, clock.now_ms()))
                print(f"task-{n}", flush=True)

        async with trio.open_nursery() as nursery:
            for _ in range(WRITERS):
                nursery.start_soon(writer)


#: Few deliveries at once, each held a little after its append, so the kill
#: lands while appended tasks wait for their deletes.
DELIVERIES = 4
HOLD_S = 0.01


class Announcing(a2trio.Server):
    """Prints each delivered task once its append has returned."""

    async def deliver(self, task: a2trio.SchedulerTask) -> None:
        await super().deliver(task)
        print(f"delivered {a2trio.scheduler.task_id(task)}", flush=True)
        await trio.sleep(HOLD_S)


async def deliver(target: str, store_path: str) -> None:
    store = a2trio.stores.sqlite(store_path)
    scheduler = open_scheduler(target, max_in_flight=DELIVERIES)
    async with Announcing(fleet, store=store, scheduler=scheduler):
        await trio.sleep_forever()


if __name__ == "__main__":
    if sys.argv[1] == "schedule":
        trio.run(schedule, sys.argv[2])
    else:
        trio.run(deliver, sys.argv[2], sys.argv[3])
