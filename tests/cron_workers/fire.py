"""A process that serves a minute cron for a few virtual minutes, then prints
the slots its ``events`` was called for and how many errors it logged.

    python -m tests.cron_workers.fire STORE START_WALL MINUTES

``STORE`` is ``sqlite:PATH`` or ``postgres:SCHEMA:DSN``. Every process sleeps
(real time) until ``START_WALL`` (epoch seconds), then runs Trio on a
``MockClock`` at :data:`RATE`, so all of them start virtual time 0
(2025-01-01T00:00:00Z on ``TrioClock``) at one real instant and fire each
slot together, within a few milliseconds times the rate.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime

import msgspec
import trio
import trio.testing

import a2trio
from a2trio.stores.base import Store

#: Virtual seconds per real second: a minute slot every 2 s.
RATE = 30.0


class Tick(msgspec.Struct, frozen=True):
    slot: str


ticks = a2trio.event_type("tick", Tick)
clock_app = a2trio.contract("clock_app", events=[ticks])


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.errors += 1


def _store(spec: str) -> Store:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        from a2trio.stores.sqlite import sqlite

        return sqlite(rest, clock=a2trio.TrioClock())
    from a2trio.stores.postgres import postgres

    schema, _, dsn = rest.partition(":")
    return postgres(dsn, schema=schema, clock=a2trio.TrioClock())


async def _serve(spec: str, minutes: int, called: list[str]) -> None:
    def counted(slot: datetime) -> list[a2trio.AppendInput]:
        called.append(slot.isoformat())
        return [ticks(Tick(slot.isoformat()))]

    cron = a2trio.cron("minutely", "* * * * *", session="s", events=counted)
    async with a2trio.Server(clock_app, store=_store(spec), crons=[cron]):
        await trio.sleep_until(minutes * 60 + 10)


def main() -> None:
    spec, start_wall, minutes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    errors = _Count()
    logging.getLogger("a2trio.cron").addHandler(errors)
    called: list[str] = []
    time.sleep(max(0.0, start_wall - time.time()))
    trio.run(_serve, spec, minutes, called, clock=trio.testing.MockClock(rate=RATE))
    print(json.dumps({"called": called, "errors": errors.errors}))


if __name__ == "__main__":
    main()
