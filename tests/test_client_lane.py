"""The reconnecting lane, the policy and the push budget, on Trio's mock clock.

The lane is transport-independent: here its tries are a scripted ``attach``,
so the policy's delays and pauses can be asserted at exact virtual instants.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.errors import A2Error, ErrorCode
from a2trio.transport import (
    DEFAULT_RECONNECT,
    Backoff,
    Closed,
    Connecting,
    ConnectionState,
    ConnectionWatch,
    Fold,
    Folded,
    Idle,
    Lane,
    LaneFrame,
    Live,
    Paused,
    wire,
)
from a2trio.transport.client.connection import retrying
from a2trio.transport.client.lane import LANE_BUFFER

Live_ = Callable[[], None]
Deliver = Callable[[LaneFrame], Awaitable[None]]
LOST = A2Error(ErrorCode.STORE_UNAVAILABLE, "socket lost: closed")


def event(index: int, session_id: str = "s1") -> wire.EventFrame:
    return wire.EventFrame(
        id=f"e-{index}",
        type="note",
        payload={"text": str(index)},
        index=index,
        session_id=session_id,
        created_at="2025-01-01T00:00:00.000Z",
    )


def state_of(lane: Lane) -> ConnectionState:
    return lane.connection.state


def test_backoff_grows_jitters_and_caps() -> None:
    backoff = Backoff(base_s=1.0, factor=2.0, cap_s=5.0, jitter=0.5, rng=random.Random(7))
    delays = [backoff.delay(n) for n in range(1, 7)]
    ceilings = [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert Backoff(jitter=0).delay(1) == 0.5
    assert Backoff(jitter=0)("s1", None, 3) == 2.0
    assert Backoff(jitter=0).delay(10_000) == 30.0
    assert repr(DEFAULT_RECONNECT) == "Backoff(base_s=0.5, factor=2.0, cap_s=30.0, jitter=0.5)"
    for bad, match in [
        ({"base_s": -1}, "must be non-negative"),
        ({"factor": 0.5}, "`factor` must be at least 1"),
        ({"jitter": 2}, r"`jitter` must be within \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            Backoff(**bad)  # type: ignore[arg-type]


async def test_the_policy_decides_each_delay_and_the_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tries: list[tuple[float, int]] = []
    calls: list[tuple[str, A2Error | None, int, float]] = []
    answers: list[float | bool] = [1.0, 2.5, False, 0.5, False]

    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        tries.append((trio.current_time(), start_after))
        if len(tries) == 4:
            live()
            await deliver(event(1))
            raise LOST
        if len(tries) == 3:
            return  # a clean end: the policy hears None
        raise LOST

    def policy(session_id: str, error: A2Error | None, attempt: int) -> float | bool:
        calls.append((session_id, error, attempt, trio.current_time()))
        return answers.pop(0)

    lane = Lane("s1", 0, policy)
    assert state_of(lane) == Idle()
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        await lane.connection.wait_for(lambda s: isinstance(s, Paused))
        assert state_of(lane) == Paused(3, None)
        assert trio.current_time() == 1.0 + 2.5
        await trio.sleep(100)  # paused: nothing retries by itself
        assert len(tries) == 3
        lane.reconnect()
        assert state_of(lane) == Connecting(3, None)
        assert (await lane.receive()).index == 1  # type: ignore[union-attr]
        await lane.connection.wait_for(lambda s: isinstance(s, Paused))
        nursery.cancel_scope.cancel()
    assert state_of(lane) == Closed()
    assert tries == [(0.0, 0), (1.0, 0), (3.5, 0), (103.5, 0), (104.0, 1)]
    # attempt counts up, and starts again at 1 after reconnect() and after live.
    assert [(c[2], c[3]) for c in calls] == [(1, 0.0), (2, 1.0), (3, 3.5), (1, 103.5), (2, 104.0)]
    assert [c[1] for c in calls] == [LOST, LOST, None, LOST, LOST]
    with pytest.raises(StopAsyncIteration):
        await lane.receive()


async def test_reconnect_skips_the_delay_and_restarts_a_live_try(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tries: list[float] = []

    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        tries.append(trio.current_time())
        if len(tries) == 1:
            raise LOST
        live()
        await trio.sleep_forever()

    lane = Lane("s1", 0, lambda *_: 60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        await lane.connection.wait_for(lambda s: isinstance(s, Connecting) and s.reconnects == 1)
        await trio.sleep(5)
        lane.reconnect()  # waiting 60 s: try now
        assert await lane.wait_live() == Live(1)
        lane.reconnect()  # live: replaced at once, no policy call
        state = await lane.connection.wait_for(lambda s: s == Live(2))
        assert state == Live(2)
        nursery.cancel_scope.cancel()
    assert tries == [0.0, 5.0, 5.0]


async def test_frames_are_deduplicated_gaps_lose_the_try_and_presence_repaints() -> None:
    tries: list[int] = []
    gate = trio.Event()

    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        tries.append(start_after)
        live()
        snapshot = {"ann": {"typing": wire.WirePresenceValue(True, 0, "t0")}}
        await deliver(wire.PresenceSnapshotFrame(snapshot, "s1"))
        if len(tries) == 1:
            await deliver(event(1))
            await deliver(event(1))  # a replay: skipped
            await deliver(wire.PresenceFrame("bob", {"typing": False}, 1, "t1", "s1"))
            await deliver(wire.PresenceFrame("ann", {"typing": None}, 1, "t1", "s1"))
            await gate.wait()
            await deliver(event(3))  # a gap: the try is lost
        await deliver(event(2))
        await trio.sleep_forever()

    lane = Lane("s1", 0, lambda *_: 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        frames = [await lane.receive() for _ in range(4)]
        assert lane.presence == {"bob": {"typing": wire.WirePresenceValue(False, 1, "t1")}}
        gate.set()
        frames.append(await lane.receive())
        assert lane.presence == {"ann": {"typing": wire.WirePresenceValue(True, 0, "t0")}}
        frames.append(await lane.receive())
        nursery.cancel_scope.cancel()
    assert [type(f).__name__ for f in frames] == [
        "PresenceSnapshotFrame",
        "EventFrame",
        "PresenceFrame",
        "PresenceFrame",
        "PresenceSnapshotFrame",
        "EventFrame",
    ]
    assert [f.index for f in frames if isinstance(f, wire.EventFrame)] == [1, 2]
    assert tries == [0, 1]


async def test_wait_live_raises_the_pause_error_or_says_it_ended() -> None:
    async def ends(start_after: int, live: Live_, deliver: Deliver) -> None:
        return

    lane = Lane("s1", 0, lambda *_: False)
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, ends)
        with pytest.raises(A2Error, match=r"^STORE_UNAVAILABLE: the stream ended \(paused\)$"):
            await lane.wait_live()
        nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="`start_after` must be a non-negative int"):
        Lane("s1", -1)


async def test_a_fold_only_moves_forward() -> None:
    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        live()
        for index in (3, 4, 5):
            await deliver(event(index))
        await trio.sleep_forever()

    def texts(state: tuple[str, ...], e: a2trio.Event[Any]) -> tuple[str, ...]:
        return (*state, e.payload["text"])

    reducer: a2trio.Reducer[tuple[str, ...]] = a2trio.Reducer("texts", (), texts)
    lane = Lane("s1", 2, lambda *_: 0)
    fold = Fold(lane, reducer, state=("1", "2"))
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        assert fold.index == 2
        assert await anext(fold) == Folded(("1", "2", "3"), 3)
        fold.index = 4  # as if a snapshot had moved it past event 4
        assert await anext(fold) == Folded(("1", "2", "3", "5"), 5)
        nursery.cancel_scope.cancel()


async def test_connection_watch_wakes_waiters_on_change() -> None:
    watch = ConnectionWatch()
    seen: list[ConnectionState] = []

    async def waiter() -> None:
        seen.append(await watch.wait_for(lambda s: isinstance(s, Live)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        watch.set(Connecting(0))
        watch.set(Connecting(0))  # no change, no wake-up
        await trio.testing.wait_all_tasks_blocked()
        assert seen == []
        watch.set(Live(0))
    assert seen == [Live(0)]
    assert await watch.wait_for() == Live(0)
    assert (Idle.status, Connecting.status, Paused.status, Live.status, Closed.status) == (
        "idle",
        "connecting",
        "paused",
        "live",
        "closed",
    )


async def test_pushes_get_three_attempts_on_store_unavailable_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    backoff = Backoff(base_s=1.0, jitter=0)

    async def flaky() -> str:
        times.append(trio.current_time())
        if len(times) < 3:
            raise LOST
        return "stored"

    assert await retrying(flaky, backoff=backoff) == "stored"
    assert times == [0.0, 1.0, 3.0]

    times.clear()

    async def down() -> str:
        times.append(trio.current_time())
        raise LOST

    with pytest.raises(A2Error) as spent:
        await retrying(down, backoff=backoff)
    assert spent.value is LOST
    assert len(times) == 3

    times.clear()
    refused = A2Error(ErrorCode.FORBIDDEN, "no")

    async def forbidden() -> str:
        times.append(trio.current_time())
        raise refused

    with pytest.raises(A2Error) as at_once:
        await retrying(forbidden, backoff=backoff)
    assert at_once.value is refused
    assert len(times) == 1


async def test_a_try_cancelled_mid_delivery_resumes_from_the_last_queued_event() -> None:
    tries: list[int] = []

    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        tries.append(start_after)
        live()
        for index in range(start_after + 1, LANE_BUFFER + 10):
            await deliver(event(index))
        await trio.sleep_forever()

    lane = Lane("s1", 0, lambda *_: 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        await trio.testing.wait_all_tasks_blocked()
        # The reader has read nothing: the buffer is full and the next send
        # waits, the index already on its frame.
        assert lane.index == LANE_BUFFER + 1
        lane.reconnect()  # cancels that send: its frame was never queued, the index moves back
        await trio.testing.wait_all_tasks_blocked()
        assert tries == [0, LANE_BUFFER]
        indexes = [(await lane.receive()).index for _ in range(LANE_BUFFER + 9)]  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert indexes == list(range(1, LANE_BUFFER + 10))


async def test_a_fold_iterates_with_async_for() -> None:
    async def attach(start_after: int, live: Live_, deliver: Deliver) -> None:
        live()
        await deliver(wire.PresenceSnapshotFrame({}, "s1"))
        for index in (1, 2):
            await deliver(event(index))
        await trio.sleep_forever()

    lane = Lane("s1", 0, lambda *_: 0)
    fold = Fold(lane, a2trio.Reducer("n", 0, lambda n, e: n + e.index))
    got: list[Folded[int]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(lane.run, attach)
        async for folded in fold:
            got.append(folded)
            if folded.index == 2:
                break
        nursery.cancel_scope.cancel()
    assert got == [Folded(1, 1), Folded(3, 2)]
