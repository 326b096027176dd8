"""The scheduler engine (``a2trio/schedulers/_engine.py``) over a queue that
fails on cue, on the autojump clock.

``DurableScheduler`` takes any :class:`TaskQueue`; here it is the in-memory
queue with scripted failures, so the worker's backoff, the delivery's lease
renewals and the cleanup's failure are exact instants of Trio time.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

import a2trio
from a2trio.scheduler import AppendTask, DrainTask, ScheduledEvent, task_id
from a2trio.schedulers import DurableScheduler, LocalScheduler
from a2trio.schedulers._engine import REFILL_WAIT_S, retry_delay_s
from a2trio.schedulers._queue import MemoryQueue
from a2trio.stores import memory
from a2trio.stores.base import AppendEvent

from .apps import Note, Ordered, orders

EPOCH_MS = a2trio.TrioClock().epoch_ms


class ScriptedQueue(MemoryQueue):
    """A memory queue whose calls fail as scripted, recording when each ran."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, list[float]] = {}
        self.claim_failures = 0
        #: The renewals (1-based) that raise, and the one that reports the lease lost.
        self.failing_renewals: set[int] = set()
        self.lost_on_renewal: int | None = None
        self.delete_failures = 0

    def _record(self, name: str) -> int:
        instants = self.calls.setdefault(name, [])
        instants.append(trio.current_time())
        return len(instants)

    async def claim(self, contract: str, now_ms: int, lease_ms: int, token: str, limit: int) -> Any:
        self._record("claim")
        if self.claim_failures:
            self.claim_failures -= 1
            await trio.lowlevel.checkpoint()
            raise OSError("queue unreachable")
        return await super().claim(contract, now_ms, lease_ms, token, limit)

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        n = self._record("renew")
        await trio.lowlevel.checkpoint()
        if n in self.failing_renewals:
            raise OSError("renewal lost in transit")
        if n == self.lost_on_renewal:
            return False
        return await super().renew(task_id, token, until_ms)

    async def delete(self, task_id: str, token: str) -> None:
        self._record("delete")
        if self.delete_failures:
            self.delete_failures -= 1
            await trio.lowlevel.checkpoint()
            raise OSError("delete lost")
        await super().delete(task_id, token)


def note_task(task_id: str, due_s: float) -> AppendTask:
    event = ScheduledEvent(f"{task_id}-e", "note", {"text": task_id})
    return AppendTask(task_id, "orders", "s1", EPOCH_MS + int(due_s * 1000), [event])


async def test_a_worker_backs_off_while_its_queue_is_unreachable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = ScriptedQueue()
    queue.claim_failures = 3
    scheduler = DurableScheduler(queue)
    assert repr(scheduler) == f"DurableScheduler({queue!r})"
    async with scheduler:
        await scheduler.schedule(note_task("t", 0))
    server = a2trio.Server(orders, store=memory(clock=a2trio.TrioClock()), scheduler=scheduler)
    async with server:
        await trio.sleep(10)
        [event] = await server.session("s1").history()
    # Passes at 0, 1, 3 fail (backoff 1, 2, 4 s); the pass at 7 delivers.
    backoff = [retry_delay_s(n) for n in (1, 2, 3)]
    assert backoff == [1.0, 2.0, 4.0]
    assert queue.calls["claim"][:4] == [0.0, 1.0, 3.0, 7.0]
    assert event.created_at == a2trio.clock.ms_to_datetime(EPOCH_MS + 7_000)
    assert event.payload == Note("t")
    stats = scheduler.statistics()
    assert (stats.delivered, stats.queue_errors) == (1, 3)


async def test_a_long_delivery_renews_its_lease_until_told_it_is_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    finished: list[float] = []

    async def slow(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(9)
        finished.append(trio.current_time())

    queue = ScriptedQueue()
    queue.failing_renewals = {2}
    queue.lost_on_renewal = 4
    scheduler = DurableScheduler(queue, lease_s=6)
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store, handlers={"ordered": slow}, scheduler=scheduler)
    # Written behind the server's back: only the watchdog below drains it.
    await store.append(server.key("s1"), [AppendEvent("ordered", {"item": "a"})])
    async with scheduler:
        await scheduler.schedule(DrainTask("orders", "s1", EPOCH_MS))
    async with server:
        await trio.sleep(20)
    assert finished == [9.0]
    # Every lease_s / 3 = 2 s: the 2nd renewal fails (retried at the next
    # beat), the 4th reports the lease lost, and renewing stops.
    assert queue.calls["renew"] == [2.0, 4.0, 6.0, 8.0]
    stats = scheduler.statistics()
    assert (stats.delivered, stats.queue_errors) == (1, 1)
    assert queue.calls["delete"] == [9.0]


async def test_a_cleanup_that_fails_leaves_the_lease_to_lapse_and_redelivers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = ScriptedQueue()
    queue.delete_failures = 1
    scheduler = DurableScheduler(queue, lease_s=30)
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(orders, store=store, scheduler=scheduler)
    async with scheduler:
        await scheduler.schedule(note_task("t", 0))
    async with server:
        await trio.sleep(40)
        history = await server.session("s1").history()
    # Delivered at 0; the delete failed, so the task came back once its lease
    # lapsed (t=30) and was delivered again: the append's id made it a replay.
    assert queue.calls["delete"] == [0.0, 30.0]
    assert [e.payload for e in history] == [Note("t")]
    stats = scheduler.statistics()
    assert (stats.delivered, stats.queue_errors) == (1, 1)
    assert await queue.count() == 0


async def test_a_local_scheduler_opens_as_a_context_manager_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scheduler = LocalScheduler()
    async with scheduler as opened:
        assert opened is scheduler
        await scheduler.schedule(note_task("t", 5))
        assert await scheduler.queued() == 1
    assert repr(scheduler) == "LocalScheduler()"


class RenewalLog(MemoryQueue):
    """A memory queue recording each renewal as (instant, task id)."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[tuple[float, str]] = []

    async def renew(self, task_id: str, token: str, until_ms: int) -> bool:
        self.renewals.append((trio.current_time(), task_id))
        return await super().renew(task_id, token, until_ms)


async def test_one_beat_renews_every_delivery_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(4.5)

    queue = RenewalLog()
    scheduler = DurableScheduler(queue, lease_s=6)
    store = memory(clock=a2trio.TrioClock())
    # sweep=False: only the scheduler's drain tasks start the handlers.
    server = a2trio.Server(
        orders, store=store, handlers={"ordered": slow}, scheduler=scheduler, sweep=False
    )
    for sid in ("s1", "s2"):
        await store.append(server.key(sid), [AppendEvent("ordered", {"item": sid})])
    async with scheduler:
        await scheduler.schedule(DrainTask("orders", "s1", EPOCH_MS))
        await scheduler.schedule(DrainTask("orders", "s2", EPOCH_MS + 3_000))
    async with server:
        await trio.sleep(10)
    s1 = task_id(DrainTask("orders", "s1", EPOCH_MS))
    s2 = task_id(DrainTask("orders", "s2", EPOCH_MS + 3_000))
    # Beats every lease_s / 3 = 2 s from the bind: s1 runs 0-4.5, s2 3-7.5;
    # the beat at 4 renews both.
    assert sorted(queue.renewals) == sorted([(2.0, s1), (4.0, s1), (4.0, s2), (6.0, s2)])
    assert scheduler.statistics().delivered == 2


async def test_long_deliveries_holding_most_slots_delay_a_due_task_by_the_refill_wait_at_most(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def long(ctx: a2trio.HandlerContext[Ordered]) -> None:
        await trio.sleep(100)

    scheduler = LocalScheduler(max_in_flight=4)
    store = memory(clock=a2trio.TrioClock())
    server = a2trio.Server(
        orders, store=store, handlers={"ordered": long}, scheduler=scheduler, sweep=False
    )
    for sid in ("s1", "s2", "s3"):
        await store.append(server.key(sid), [AppendEvent("ordered", {"item": sid})])
        await scheduler.schedule(DrainTask("orders", sid, EPOCH_MS))
    async with server:
        await trio.sleep(0.01)
        assert scheduler.statistics().in_flight == 3
        # One slot free of four: the worker waits for a refill's worth (two)
        # until REFILL_WAIT_S after its last claim (at 0), then claims anyway.
        await scheduler.schedule(note_task("late", 0))
        async with server.session("s1").stream(start_after=1) as feed:
            note = await feed.receive()
    assert note.payload == Note("late")
    assert REFILL_WAIT_S == 0.05
    assert note.created_at == a2trio.clock.ms_to_datetime(EPOCH_MS + 50)
