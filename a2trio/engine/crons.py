"""Recurring schedules: :func:`cron` and the task that fires them.

Theory of operation. A cron needs no scheduler service and no lock: every
process that runs the server fires it. For a slot (an instant the spec
names, in the cron's time zone) the task calls ``events(slot)`` and appends
what it returns with ids derived from (contract, session, cron name, slot,
position) (:func:`~a2trio.ids.cron_event_id`). The second process to append
a slot sends a batch whose ids are all stored, which the store replays
(``stores/rules/fences.py``, ``replayed_batch``): exactly one append per slot
lands, on any store.

The store is also the cron's memory. A slot has *fired* when its first event
is stored, so the last fired slot is found by walking back from now, one
``find_event`` per slot, for at most :data:`CATCH_UP_WINDOW` slots: the
startup cost is bounded (one read in steady state, when the latest slot
fired; at most ``CATCH_UP_WINDOW`` reads per cron) and nothing but the events
is written. The slots after the last fired one were missed while no process
ran; ``catch_up`` says which of them fire at startup. No fired slot inside
the window reads as a first start: nothing is caught up. A slot whose
``events`` returned no event leaves no trace, so a later start fires it again
under ``catch_up="all"`` (appending nothing again).

Each cron is one task in the server's nursery. It sleeps on Trio's clock
until the next slot of the engine's clock (so ``MockClock`` with
:class:`~a2trio.TrioClock` moves it), fires, and sleeps again. A slot whose
``events`` raised or whose append failed is logged (logger ``a2trio.cron``)
and retried at the next wake: the earlier of the next slot and a backoff
(:data:`RETRY`); a start whose look-back failed is retried after the backoff.
When one wake finds several unfired slots due (a retried slot and newer ones,
a process that was suspended), ``catch_up="all"`` fires them in order and the
others fire the newest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
import trio

from ..backoff import Backoff
from ..contract import AppendInput
from ..identifiers import check_cron_name, check_session_id
from ..ids import cron_event_id
from .context import Engine
from .session import Session
from .writes import Writes

__all__ = ["CATCH_UP_WINDOW", "RETRY", "CatchUp", "Cron", "CronInfo", "Crons", "cron"]

logger = logging.getLogger("a2trio.cron")

#: ``"none"``: skip the slots missed while no process ran; ``"latest"``: fire
#: the most recent of them; ``"all"``: fire every one, in order.
CatchUp = Literal["none", "latest", "all"]

#: How many slots a start looks back for the last fired one (one
#: ``find_event`` each): a minute cron catches up at most 100 minutes of
#: downtime, a daily one 100 days. Bounds the startup reads per cron.
CATCH_UP_WINDOW = 100

#: The wait before a failed slot is tried again (unless the next slot comes
#: first): 1 s, doubling to a minute. No jitter: every process retries the
#: same ids, and the store keeps one append.
RETRY = Backoff(base_s=1.0, factor=2.0, cap_s=60.0, jitter=0.0)

#: ``events(slot) -> list[AppendInput]``.
CronEvents = Callable[[datetime], Sequence[AppendInput]]


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ModuleNotFoundError as missing:
        if missing.name != "croniter":
            raise
        raise ModuleNotFoundError(
            "a2trio.cron needs croniter: pip install 'a2trio[cron]'", name="croniter"
        ) from missing
    return croniter


class Cron:
    """A recurring schedule; build it with :func:`cron` and give it to
    ``Server(crons=[...])``.

    Attributes:
      name: unique per server; part of every event id it appends.
      spec: the 5-field cron expression.
      session_id: the session its events are appended to.
      events: ``events(slot) -> list[AppendInput]``.
      timezone: the IANA zone the spec is read in.
      catch_up: which slots missed while no process ran fire at startup.
    """

    __slots__ = ("_iter", "_zone", "catch_up", "events", "name", "session_id", "spec", "timezone")

    def __init__(
        self,
        name: str,
        spec: str,
        session_id: str,
        events: CronEvents,
        timezone: str,
        catch_up: CatchUp,
    ) -> None:
        self.name = name
        self.spec = spec
        self.session_id = session_id
        self.events = events
        self.timezone = timezone
        self.catch_up: CatchUp = catch_up
        self._zone = ZoneInfo(timezone)
        self._iter = _croniter()

    def __repr__(self) -> str:
        return (
            f"a2trio.cron({self.name!r}, {self.spec!r}, session={self.session_id!r}, "
            f"timezone={self.timezone!r}, catch_up={self.catch_up!r})"
        )

    def after(self, ms: int) -> datetime:
        """The first slot later than epoch ``ms``."""
        start = datetime.fromtimestamp(ms // 1000, self._zone)
        slot: datetime = self._iter(self.spec, start).get_next(datetime)
        return slot

    def at_or_before(self, ms: int) -> datetime:
        """The last slot at or before epoch ``ms``."""
        # Slots are whole minutes: strictly before the next whole second.
        start = datetime.fromtimestamp(ms // 1000 + 1, self._zone)
        slot: datetime = self._iter(self.spec, start).get_prev(datetime)
        return slot

    def before(self, slot: datetime) -> datetime:
        """The slot before ``slot``."""
        previous: datetime = self._iter(self.spec, slot).get_prev(datetime)
        return previous


Cron.__module__ = "a2trio"


def cron(
    name: str,
    spec: str,
    *,
    session: str,
    events: CronEvents,
    timezone: str = "UTC",
    catch_up: CatchUp = "latest",
) -> Cron:
    """A recurring schedule: at every slot of ``spec``, append ``events(slot)``
    to ``session``. Give it to ``Server(crons=[...])``; every process that runs
    the server fires it, and one append per slot lands (see ``docs/schedules.md``).

    Args:
      name: unique per server; the slot's event ids derive from it, the
        slot and the position, so renaming a cron starts it afresh.
      spec: a 5-field cron expression (minute hour day month weekday), read
        by ``croniter``: ``"*/15 * * * *"``, ``"30 2 * * 1-5"``.
      session: the session id the events are appended to.
      events: ``events(slot)``, called once per slot with the slot as an aware
        datetime in ``timezone``, returns the append inputs
        (``contract.event(...)`` or an event type's handle), without ids.
      timezone: an IANA zone name (``zoneinfo``): ``"Europe/Paris"``.
      catch_up: at startup, for the slots missed while no process ran (up to
        :data:`CATCH_UP_WINDOW` slots back): ``"none"`` skips them,
        ``"latest"`` fires the most recent one, ``"all"`` fires every one in
        order.

    Raises:
      ModuleNotFoundError: croniter is not installed (``pip install 'a2trio[cron]'``).
      TypeError: a name or session that is not a non-empty string, a spec
        that is not a string, ``events`` that is not callable.
      ValueError: an invalid spec, an unknown timezone, a ``catch_up`` other
        than ``"none"``, ``"latest"`` or ``"all"``, a bad name or session id.
    """
    iterator = _croniter()
    check_cron_name(name)
    if not isinstance(spec, str):
        raise TypeError(f"cron spec must be a string, got {spec!r}")
    if len(spec.split()) != 5 or not iterator.is_valid(spec):
        raise ValueError(
            f"cron spec {spec!r} is not a valid 5-field cron expression "
            "(minute hour day month weekday, for example '*/15 * * * *')"
        )
    check_session_id(session)
    if not callable(events):
        raise TypeError(
            f"cron events must be a callable slot -> list of append inputs, got {events!r}"
        )
    if not isinstance(timezone, str):
        raise TypeError(f"cron timezone must be an IANA zone name, got {timezone!r}")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"cron timezone {timezone!r} is not a known IANA time zone (for example "
            "'UTC' or 'Europe/Paris')"
        ) from exc
    if catch_up not in get_args(CatchUp):
        raise ValueError(f"cron catch_up must be 'none', 'latest' or 'all', got {catch_up!r}")
    return Cron(name, spec, session, events, timezone, catch_up)


class CronInfo(msgspec.Struct, frozen=True):
    """A cron as inspection shows it (``server.inspect.crons()``).

    Attributes:
      last_slot: the last slot whose events are stored, found within
        :data:`CATCH_UP_WINDOW` slots of now; None if none is.
      next_slot: the next slot after now.
    """

    name: str
    spec: str
    session_id: str
    timezone: str
    catch_up: str
    last_slot: datetime | None
    next_slot: datetime


CronInfo.__module__ = "a2trio"


class Crons:
    """The server's crons: the task that fires them and what inspection reads.

    Args:
      engine: the server's engine (store, clock, key namespace).
      writes: the write path the slots' appends go through.
      crons: checked by ``Server`` (unique names).
    """

    def __init__(self, engine: Engine, writes: Writes, crons: Sequence[Cron]) -> None:
        self._engine = engine
        self._writes = writes
        self.crons = tuple(crons)

    async def serve(self) -> None:
        """Fire every cron until cancelled (the server's nursery owns it).

        Cancellation: cancelled between slots, nothing is half done; cancelled
        during an append, the next start replays or re-fires the slot by its ids.
        """
        async with trio.open_nursery() as nursery:
            for each in self.crons:
                nursery.start_soon(self._run, each)

    async def info(self) -> list[CronInfo]:
        """Each cron with its last fired and next slot, read from the store.

        Cancellation: a read; nothing to undo.
        """
        now = self._engine.clock.now_ms()
        infos = []
        for each in self.crons:
            last, _ = await self._look_back(each, now)
            infos.append(
                CronInfo(
                    each.name,
                    each.spec,
                    each.session_id,
                    each.timezone,
                    each.catch_up,
                    last,
                    each.after(now),
                )
            )
        return infos

    async def _fired(self, each: Cron, slot: datetime) -> bool:
        engine = self._engine
        first = cron_event_id(
            engine.contract.name, each.session_id, each.name, _ms(slot), position=0
        )
        return await engine.store.find_event(engine.key(each.session_id), first) is not None

    async def _look_back(self, each: Cron, now_ms: int) -> tuple[datetime | None, list[datetime]]:
        """The last fired slot within the window and the unfired slots after
        it, oldest first; (None, []) when no slot in the window fired."""
        slot = each.at_or_before(now_ms)
        unfired: list[datetime] = []
        for _ in range(CATCH_UP_WINDOW):
            if await self._fired(each, slot):
                return slot, unfired[::-1]
            unfired.append(slot)
            slot = each.before(slot)
        return None, []

    async def _start(self, each: Cron) -> tuple[int, list[datetime]]:
        """Now and the missed slots ``catch_up`` fires, once the store answers
        (a failed look-back is logged and tried again after :data:`RETRY`)."""
        clock = self._engine.clock
        failures = 0
        while True:
            now = clock.now_ms()
            try:
                _, missed = await self._look_back(each, now)
            except Exception:
                failures += 1
                logger.exception("cron %r: reading its last fired slot failed; retrying", each.name)
                await trio.sleep(RETRY.delay(failures))
                continue
            return now, _caught_up(each.catch_up, missed)

    async def _run(self, each: Cron) -> None:
        clock = self._engine.clock
        now, pending = await self._start(each)
        upcoming = each.after(now)
        failures = 0
        while True:
            while pending and await self._fire(each, pending[0]):
                pending.pop(0)
                failures = 0
            wake = _ms(upcoming)
            if pending:
                failures += 1
                wake = min(wake, clock.now_ms() + int(RETRY.delay(failures) * 1000))
            await _sleep_until_ms(clock.now_ms, wake)
            now = clock.now_ms()
            if now >= _ms(upcoming):
                due = self._due(each, upcoming, now)
                pending = pending + due if each.catch_up == "all" else due[-1:]
                upcoming = each.after(now)

    @staticmethod
    def _due(each: Cron, first: datetime, now_ms: int) -> list[datetime]:
        """The slots from ``first`` through now, oldest first: at most
        :data:`CATCH_UP_WINDOW` of them, the newest."""
        slot = each.at_or_before(now_ms)
        due: list[datetime] = []
        while slot >= first and len(due) < CATCH_UP_WINDOW:
            due.append(slot)
            slot = each.before(slot)
        return due[::-1]

    async def _fire(self, each: Cron, slot: datetime) -> bool:
        """Append the slot's events; False (logged) if ``events`` or the append failed."""
        engine = self._engine
        slot_ms = _ms(slot)
        try:
            inputs = list(each.events(slot))
            for given in inputs:
                if not isinstance(given, AppendInput):
                    raise TypeError(
                        f"cron events returns append inputs (contract.event(...)), got {given!r}"
                    )
                if given.id is not None:
                    raise TypeError(
                        f"cron events derive their ids from the cron and the slot: "
                        f"leave id unset, got id={given.id!r}"
                    )
            with_ids = [
                AppendInput(
                    e.type,
                    e.payload,
                    cron_event_id(
                        engine.contract.name, each.session_id, each.name, slot_ms, position
                    ),
                )
                for position, e in enumerate(inputs)
            ]
            if with_ids:
                await Session(engine, self._writes, each.session_id).append(*with_ids)
        except Exception:
            logger.exception(
                "cron %r: slot %s failed; retrying at the next wake", each.name, slot.isoformat()
            )
            return False
        return True


def _caught_up(catch_up: CatchUp, missed: list[datetime]) -> list[datetime]:
    if catch_up == "all":
        return list(missed)
    if catch_up == "latest":
        return missed[-1:]
    return []


def _ms(slot: datetime) -> int:
    return int(slot.timestamp()) * 1000


async def _sleep_until_ms(now_ms: Callable[[], int], at_ms: int) -> None:
    """Sleep on Trio's clock until the engine clock reads ``at_ms``."""
    while True:
        await trio.sleep_until(trio.current_time() + max(0, at_ms - now_ms()) / 1000)
        if now_ms() >= at_ms:
            return
