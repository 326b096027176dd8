"""Recurring schedules (``a2trio.cron``, ``a2trio/engine/crons.py``; issue 33).

On the memory store the tests run on ``autojump_clock`` with the store on
``TrioClock``: Trio time 0 is 2025-01-01T00:00:00Z, so a minute cron's slots
are Trio seconds 60, 120, ... exactly. On SQLite and Postgres they run on
``mock_clock`` and jump it by hand once every task is blocked and no store
call is in flight (``docs/testing.md``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine.crons import CATCH_UP_WINDOW, CatchUp
from a2trio.ids import cron_event_id
from a2trio.stores import MemoryStore, memory
from a2trio.stores.base import Store
from a2trio.testing import FaultyStore


class Tick(msgspec.Struct, frozen=True):
    slot: str


ticks = a2trio.event_type("tick", Tick)
clock_app = a2trio.contract("clock_app", events=[ticks])
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def tick(slot: datetime) -> list[a2trio.AppendInput]:
    return [ticks(Tick(slot.isoformat()))]


def every_minute(catch_up: CatchUp = "latest", **options: Any) -> a2trio.Cron:
    return a2trio.cron(
        "minutely", "* * * * *", session="s", events=tick, catch_up=catch_up, **options
    )


async def slots(store: Store) -> list[str]:
    return [row.payload["slot"] for row in await store.read(clock_app.name + "\x1fs")]


@asynccontextmanager
async def serving(store: Store, *crons: a2trio.Cron) -> AsyncIterator[a2trio.Server]:
    async with a2trio.Server(clock_app, store=store, crons=list(crons)) as server:
        yield server


def fresh_store() -> MemoryStore:
    return memory(clock=a2trio.TrioClock())


def minute(n: int) -> str:
    return (T0 + timedelta(minutes=n)).isoformat()


# -- firing -------------------------------------------------------------------------


async def test_a_cron_fires_at_each_slot_and_no_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = fresh_store()
    async with serving(store, every_minute()):
        await trio.sleep(59.9)
        assert await slots(store) == []
        await trio.sleep_until(60)
        await trio.testing.wait_all_tasks_blocked()
        assert await slots(store) == [minute(1)]
        await trio.sleep_until(180.5)
    assert await slots(store) == [minute(1), minute(2), minute(3)]


async def test_the_events_ids_derive_from_the_cron_the_slot_and_the_position(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = fresh_store()

    def two(slot: datetime) -> list[a2trio.AppendInput]:
        return [*tick(slot), *tick(slot)]

    pair = a2trio.cron("pair", "*/5 * * * *", session="s", events=two)
    async with serving(store, pair):
        await trio.sleep_until(300.5)
    slot_ms = int((T0 + timedelta(minutes=5)).timestamp()) * 1000
    rows = await store.read(clock_app.name + "\x1fs")
    assert [row.id for row in rows] == [
        cron_event_id("clock_app", "s", "pair", slot_ms, position) for position in (0, 1)
    ]
    assert [row.payload["slot"] for row in rows] == [minute(5), minute(5)]


async def test_two_servers_on_one_memory_store_land_one_append_per_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = fresh_store()
    called: list[str] = []

    def counted(slot: datetime) -> list[a2trio.AppendInput]:
        called.append(slot.isoformat())
        return tick(slot)

    cron = a2trio.cron("minutely", "* * * * *", session="s", events=counted)
    async with serving(store, cron), serving(store, cron):
        await trio.sleep_until(120.5)
    assert called == [minute(1), minute(1), minute(2), minute(2)]
    assert await slots(store) == [minute(1), minute(2)]


async def test_events_that_raise_are_logged_and_the_slot_is_retried(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = fresh_store()
    failures = [RuntimeError("the API is down"), RuntimeError("still down")]

    def flaky(slot: datetime) -> list[a2trio.AppendInput]:
        if failures:
            raise failures.pop(0)
        return tick(slot)

    cron = a2trio.cron("flaky", "* * * * *", session="s", events=flaky)
    with caplog.at_level(logging.ERROR, logger="a2trio.cron"):
        async with serving(store, cron):
            await trio.sleep_until(60.5)
            assert await slots(store) == []
            # Retried after 1 s, then 2 s (RETRY), within the same minute.
            await trio.sleep_until(63.5)
            assert await slots(store) == [minute(1)]
    assert [r.getMessage() for r in caplog.records] == [
        f"cron 'flaky': slot {minute(1)} failed; retrying at the next wake"
    ] * 2
    assert str(caplog.records[0].exc_info[1]) == "the API is down"  # type: ignore[index]


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [("none", [minute(3)]), ("latest", [minute(3)]), ("all", [minute(1), minute(2), minute(3)])],
)
async def test_a_slot_failing_past_the_next_slot_gives_way_to_the_newest_unless_all(
    autojump_clock: trio.testing.MockClock,
    catch_up: CatchUp,
    expected: list[str],
) -> None:
    store = fresh_store()
    broken = True

    def until_fixed(slot: datetime) -> list[a2trio.AppendInput]:
        if broken:
            raise RuntimeError("broken")
        return tick(slot)

    cron = a2trio.cron("c", "* * * * *", session="s", events=until_fixed, catch_up=catch_up)
    async with serving(store, cron):
        # Failing at 60 and 120 and retried in between; fixed at 170, the
        # retries' next wake is the slot at 180.
        await trio.sleep_until(170)
        broken = False
        await trio.sleep_until(185)
    assert await slots(store) == expected


async def test_a_failed_append_is_logged_and_retried(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    faulty = FaultyStore(fresh_store())
    faulty.fail("append", times=1)
    with caplog.at_level(logging.ERROR, logger="a2trio.cron"):
        async with serving(faulty, every_minute()):
            await trio.sleep_until(60.5)
            assert await slots(faulty.inner) == []
            await trio.sleep_until(61.5)
            assert await slots(faulty.inner) == [minute(1)]
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage() == (
        f"cron 'minutely': slot {minute(1)} failed; retrying at the next wake"
    )


async def test_a_store_down_at_startup_delays_the_catch_up_and_crashes_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = fresh_store()
    async with serving(store, every_minute("all")):
        await trio.sleep_until(60.5)
    await trio.sleep_until(150)
    faulty = FaultyStore(store)
    faulty.fail("find_event", times=2)
    with caplog.at_level(logging.ERROR, logger="a2trio.cron"):
        async with serving(faulty, every_minute("all")):
            # Retried after 1 s and 2 s: minute 2 is caught up at 153.
            await trio.sleep_until(152.5)
            assert await slots(store) == [minute(1)]
            await trio.sleep_until(153.5)
            assert await slots(store) == [minute(1), minute(2)]
    assert [r.getMessage() for r in caplog.records] == [
        "cron 'minutely': reading its last fired slot failed; retrying"
    ] * 2


# -- catch-up after downtime ----------------------------------------------------------


async def run_with_downtime(clock: trio.testing.MockClock, catch_up: CatchUp) -> list[str]:
    """Up for minutes 1-2, down for 3-5, up again at 5:30 for a second."""
    store = fresh_store()
    async with serving(store, every_minute(catch_up)):
        await trio.sleep_until(150)
    await trio.sleep_until(330)
    async with serving(store, every_minute(catch_up)):
        await trio.sleep_until(331)
    return await slots(store)


async def test_catch_up_none_skips_the_missed_slots(autojump_clock: trio.testing.MockClock) -> None:
    assert await run_with_downtime(autojump_clock, "none") == [minute(1), minute(2)]


async def test_catch_up_latest_fires_the_most_recent_missed_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await run_with_downtime(autojump_clock, "latest") == [minute(1), minute(2), minute(5)]


async def test_catch_up_all_fires_every_missed_slot_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await run_with_downtime(autojump_clock, "all") == [minute(n) for n in range(1, 6)]


async def test_a_first_start_catches_nothing_up(autojump_clock: trio.testing.MockClock) -> None:
    await trio.sleep_until(600)
    store = fresh_store()
    async with serving(store, every_minute("all")):
        await trio.sleep_until(600.5)
        assert await slots(store) == []
        await trio.sleep_until(660.5)
    assert await slots(store) == [minute(11)]


async def test_the_look_back_stops_at_the_window(autojump_clock: trio.testing.MockClock) -> None:
    store = fresh_store()
    async with serving(store, every_minute("all")):
        await trio.sleep_until(60.5)
    # Down for longer than the window: the fired slot is out of sight, so the
    # start reads as a first one, after at most CATCH_UP_WINDOW reads.
    await trio.sleep_until(60 * (CATCH_UP_WINDOW + 2))
    faulty = FaultyStore(store)
    async with serving(faulty, every_minute("all")):
        await trio.sleep(0.5)
        assert await slots(store) == [minute(1)]
        assert faulty.statistics().calls["find_event"] == CATCH_UP_WINDOW


async def test_a_restart_after_the_latest_slot_fired_reads_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = fresh_store()
    async with serving(store, every_minute("all")):
        await trio.sleep_until(60.5)
    faulty = FaultyStore(store)
    async with serving(faulty, every_minute("all")):
        await trio.sleep(1)
        assert faulty.statistics().calls["find_event"] == 1


# -- time zones -----------------------------------------------------------------------


async def test_a_slot_in_the_spring_forward_gap_fires_at_the_end_of_the_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 2025-03-09: New York's clocks jump from 02:00 EST to 03:00 EDT, so 02:30
    # does not exist that day. croniter fires it at 03:00 EDT (07:00 UTC), the
    # first instant after the gap; the other days fire at 02:30 local.
    epoch = datetime(2025, 3, 8, 12, tzinfo=UTC)
    store = memory(clock=a2trio.TrioClock(int(epoch.timestamp() * 1000)))
    cron = a2trio.cron(
        "nightly", "30 2 * * *", session="s", events=tick, timezone="America/New_York"
    )
    async with serving(store, cron):
        await trio.sleep_until(3 * 86_400)
    assert await slots(store) == [
        "2025-03-09T03:00:00-04:00",
        "2025-03-10T02:30:00-04:00",
        "2025-03-11T02:30:00-04:00",
    ]


async def test_a_slot_in_the_repeated_fall_back_hour_fires_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 2025-11-02: New York's 01:00-02:00 happens twice (EDT, then EST); croniter
    # names both 01:30s, two distinct instants and so two slots.
    epoch = datetime(2025, 11, 1, 12, tzinfo=UTC)
    store = memory(clock=a2trio.TrioClock(int(epoch.timestamp() * 1000)))
    cron = a2trio.cron(
        "nightly", "30 1 * * *", session="s", events=tick, timezone="America/New_York"
    )
    async with serving(store, cron):
        await trio.sleep_until(2 * 86_400)
    assert await slots(store) == [
        "2025-11-02T01:30:00-04:00",
        "2025-11-02T01:30:00-05:00",
        "2025-11-03T01:30:00-05:00",
    ]


async def test_slots_are_read_in_the_cron_time_zone(autojump_clock: trio.testing.MockClock) -> None:
    store = fresh_store()
    cron = a2trio.cron("paris", "0 2 * * *", session="s", events=tick, timezone="Europe/Paris")
    async with serving(store, cron):
        await trio.sleep_until(86_400)
    # 02:00 in Paris on 2025-01-01 is 01:00 UTC.
    assert await slots(store) == ["2025-01-01T02:00:00+01:00"]
    assert (await store.read(clock_app.name + "\x1fs"))[0].created_at_ms == (
        a2trio.TrioClock().epoch_ms + 3_600_000
    )


# -- inspection -----------------------------------------------------------------------


async def test_inspection_lists_each_cron_with_its_last_and_next_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = fresh_store()
    hourly = a2trio.cron("hourly", "0 * * * *", session="h", events=tick, catch_up="none")
    server = a2trio.Server(clock_app, store=store, crons=[every_minute(), hourly])
    async with server:
        await trio.sleep_until(150)
        infos = await server.inspect.crons()
    assert infos == [
        a2trio.CronInfo(
            "minutely",
            "* * * * *",
            "s",
            "UTC",
            "latest",
            T0 + timedelta(minutes=2),
            T0 + timedelta(minutes=3),
        ),
        a2trio.CronInfo("hourly", "0 * * * *", "h", "UTC", "none", None, T0 + timedelta(hours=1)),
    ]
    # Only the store is needed (a2trio inspect opens no server).
    closed = a2trio.Server(clock_app, store=store, crons=[every_minute()])
    assert [info.last_slot for info in await closed.inspect.crons()] == [T0 + timedelta(minutes=2)]


# -- bad options ----------------------------------------------------------------------


def noop(slot: datetime) -> list[a2trio.AppendInput]:
    return []


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"spec": "* * * *"},
            ValueError,
            r"^cron spec '\* \* \* \*' is not a valid 5-field cron expression \(minute hour day "
            r"month weekday, for example '\*/15 \* \* \* \*'\)$",
        ),
        ({"spec": "61 * * * *"}, ValueError, r"^cron spec '61 \* \* \* \*' is not a valid"),
        ({"spec": "0 0 * * * *"}, ValueError, r"^cron spec '0 0 \* \* \* \*' is not a valid"),
        ({"spec": 5}, TypeError, r"^cron spec must be a string, got 5$"),
        (
            {"timezone": "Mars/Olympus"},
            ValueError,
            r"^cron timezone 'Mars/Olympus' is not a known IANA time zone \(for example 'UTC' or "
            r"'Europe/Paris'\)$",
        ),
        (
            {"catch_up": "some"},
            ValueError,
            r"^cron catch_up must be 'none', 'latest' or 'all', got 'some'$",
        ),
        (
            {"events": "tick"},
            TypeError,
            r"^cron events must be a callable slot -> list of append inputs, got 'tick'$",
        ),
        ({"name": ""}, TypeError, r"^cron name must be a non-empty string, got ''$"),
        ({"session": ""}, TypeError, r"^session id must be a non-empty string, got ''$"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments: dict[str, Any] = {
        "name": "c",
        "spec": "* * * * *",
        "session": "s",
        "events": noop,
        **options,
    }
    name, spec = arguments.pop("name"), arguments.pop("spec")
    with pytest.raises(error, match=message):
        a2trio.cron(name, spec, **arguments)


def test_the_server_refuses_two_crons_of_one_name_and_what_is_not_a_cron() -> None:
    store = fresh_store()
    with pytest.raises(
        ValueError,
        match=r"^crons holds two schedules named 'minutely': cron names must be unique$",
    ):
        a2trio.Server(clock_app, store=store, crons=[every_minute(), every_minute("all")])
    with pytest.raises(TypeError, match=r"^crons takes schedules built with a2trio.cron"):
        a2trio.Server(clock_app, store=store, crons=["* * * * *"])  # type: ignore[list-item]


def test_without_croniter_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "croniter", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'a2trio\[cron\]'"):
        a2trio.cron("c", "* * * * *", session="s", events=noop)


async def test_events_with_ids_or_of_another_kind_are_logged_and_retried(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = fresh_store()
    cases: list[Callable[[datetime], Sequence[Any]]] = [
        lambda slot: [ticks(Tick("x"), id="mine")],
        lambda slot: ["tick"],
    ]
    with caplog.at_level(logging.ERROR, logger="a2trio.cron"):
        async with serving(
            store,
            *(
                a2trio.cron(f"c{n}", "* * * * *", session="s", events=fn)
                for n, fn in enumerate(cases)
            ),
        ):
            await trio.sleep_until(60.5)
    assert await slots(store) == []
    assert {str(r.exc_info[1]) for r in caplog.records if r.exc_info} == {
        "cron events derive their ids from the cron and the slot: leave id unset, got id='mine'",
        "cron events returns append inputs (contract.event(...)), got 'tick'",
    }


# -- real stores: two servers, one store ----------------------------------------------


async def quiet(stores: Sequence[FaultyStore]) -> None:
    """Every task blocked and no store call in flight (jump mode's wait)."""
    while True:
        await trio.testing.wait_all_tasks_blocked(0.01)
        if not any(store.statistics().in_flight for store in stores):
            return
        for store in stores:
            await store.wait_idle()


async def two_servers_fire_once(
    clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    open_stores: Callable[[AsyncExitStack], Any],
) -> None:
    """Both servers fire every slot at the same instant; each slot's second
    append replays the first (no error, nothing retried)."""
    called: list[str] = []

    def counted(slot: datetime) -> list[a2trio.AppendInput]:
        called.append(slot.isoformat())
        return tick(slot)

    cron = a2trio.cron("minutely", "* * * * *", session="s", events=counted)
    async with AsyncExitStack() as stack:
        stores: list[FaultyStore] = [FaultyStore(s) for s in await open_stores(stack)]
        for store in stores:
            await stack.enter_async_context(serving(store, cron))
        for n in range(1, 4):
            await quiet(stores)
            clock.jump(60 * n - trio.current_time())
            await quiet(stores)
        assert sorted(called) == sorted([minute(n) for n in (1, 2, 3)] * 2)
        assert await slots(stores[0].inner) == [minute(1), minute(2), minute(3)]
        calls = [store.statistics().calls["append"] for store in stores]
        assert calls == [3, 3]
    assert [r for r in caplog.records if r.name == "a2trio.cron"] == []


async def test_two_servers_on_one_sqlite_file_land_one_append_per_slot(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from a2trio.stores.sqlite import sqlite

    async def open_stores(stack: AsyncExitStack) -> list[Store]:
        path = str(tmp_path / "app.db")
        return [sqlite(path, clock=a2trio.TrioClock()), sqlite(path, clock=a2trio.TrioClock())]

    await two_servers_fire_once(mock_clock, caplog, open_stores)


async def test_two_servers_on_one_postgres_schema_land_one_append_per_slot(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from a2trio.stores.postgres import postgres

    from .backends.postgres import database_dsn, run_sql

    dsn = await database_dsn()
    schema = f"cron_{secrets.token_hex(5)}"

    async def open_stores(stack: AsyncExitStack) -> list[Store]:
        stores = [postgres(dsn, schema=schema, clock=a2trio.TrioClock()) for _ in range(2)]
        for store in stores:
            stack.push_async_callback(store.aclose)
        return list(stores)

    try:
        await two_servers_fire_once(mock_clock, caplog, open_stores)
    finally:
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')


def test_the_digest_example_prints_three_mornings(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(root)
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "digest.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out[:2] == [
        "1: digest_due {'day': '2025-01-01'}",
        "2: digest {'day': '2025-01-01', 'text': 'the news of 2025-01-01'}",
    ]
    assert len(out) == 7
    assert out[-1] == (
        "cron morning-digest: last 2025-01-03 07:00:00+01:00, next 2025-01-04 07:00:00+01:00"
    )


# -- real processes -----------------------------------------------------------------


def fire_in_two_processes(store: str, read: Callable[[], list[str]]) -> None:
    """Two processes serve one minute cron for three virtual minutes from one
    real instant: both call ``events`` for every slot, one append per slot lands."""
    import json
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(root)
    start = f"{time.time() + 3:.3f}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.cron_workers.fire", store, start, "3"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    reports = [json.loads(out) for out in outputs]
    assert reports == [{"called": [minute(1), minute(2), minute(3)], "errors": 0}] * 2
    assert read() == [minute(1), minute(2), minute(3)]


def test_two_processes_on_one_sqlite_file_land_one_append_per_slot(tmp_path: Path) -> None:
    from a2trio.stores.sqlite import sqlite

    path = str(tmp_path / "cron.db")

    async def read() -> list[str]:
        async with sqlite(path) as store:
            return await slots(store)

    fire_in_two_processes(f"sqlite:{path}", lambda: trio.run(read))


def test_two_processes_on_one_postgres_schema_land_one_append_per_slot() -> None:
    from a2trio.stores.postgres import postgres

    from .backends.postgres import database_dsn, run_sql

    dsn = trio.run(database_dsn)
    schema = f"cron_{secrets.token_hex(5)}"

    async def read() -> list[str]:
        async with postgres(dsn, schema=schema) as store:
            return await slots(store)

    try:
        fire_in_two_processes(f"postgres:{schema}:{dsn}", lambda: trio.run(read))
    finally:
        trio.run(run_sql, dsn, f'drop schema if exists "{schema}" cascade')
