"""``stores.tasks.StoreTasks``: a store's tasks end, never the block that entered it."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.tasks import StoreTasks


async def test_close_in_the_block_ends_the_tasks_under_the_blocks_own_scope() -> None:
    tasks = StoreTasks("test store")
    nursery = await tasks.enter()
    ended: list[str] = []

    async def task() -> None:
        try:
            await trio.sleep_forever()
        finally:
            ended.append("task")

    nursery.start_soon(task)
    with trio.move_on_after(60) as scope:
        await trio.testing.wait_all_tasks_blocked()
        await tasks.close()
        assert ended == ["task"]
        assert tasks.nursery is None
        await trio.lowlevel.checkpoint()  # not cancelled
    assert not scope.cancelled_caught
    await tasks.exit()


async def test_a_failing_task_ends_the_tasks_and_the_exit_is_store_unavailable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = StoreTasks("test store")
    nursery = await tasks.enter()
    failure = OSError("the driver's task failed")

    async def fail() -> None:
        raise failure

    nursery.start_soon(fail)
    await trio.testing.wait_all_tasks_blocked()
    assert tasks.nursery is None
    await trio.lowlevel.checkpoint()  # the block is not cancelled
    with pytest.raises(A2Error) as raised:
        await tasks.exit()
    assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
    assert isinstance(raised.value.__cause__, ExceptionGroup)
    assert raised.value.__cause__.exceptions == (failure,)
    assert "the test store's tasks failed" in caplog.text
