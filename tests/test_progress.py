"""The multi-process tests' hang guard: slow is fine, stuck fails."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.progress import while_progressing


async def test_a_block_that_keeps_moving_runs_past_the_stall_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    count = 0

    async def progress() -> int:
        return count

    async with while_progressing(progress, what="counting", stall_s=10):
        for _ in range(10):
            await trio.sleep(5)
            count += 1
    assert trio.current_time() == 50


async def test_a_block_that_stops_moving_is_cancelled_and_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reached: list[float] = []

    async def progress() -> int:
        return len(reached)

    with pytest.raises(AssertionError, match=r"the sleeper: no progress in 10 s \(stuck at 1\)"):
        async with while_progressing(progress, what="the sleeper", stall_s=10):
            reached.append(trio.current_time())
            await trio.sleep_forever()
    assert 10 <= trio.current_time() <= 11


async def test_a_sample_that_hangs_counts_as_no_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def progress() -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    with pytest.raises(AssertionError, match="no progress in 10 s"):
        async with while_progressing(progress, what="a store that is down", stall_s=10):
            await trio.sleep_forever()
    assert trio.current_time() == 10
