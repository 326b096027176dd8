"""Cancellation and closing: a cancelled append or completion commits all or
nothing, and ``aclose`` is idempotent and ends only the store's own tasks."""

from __future__ import annotations

import trio

from ...errors import A2Error, ErrorCode
from .kit import (
    CANCEL_DELAYS_S,
    FEED_DEADLINE_S,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    new_uid,
    receive,
)

__all__ = [
    "check_aclose_inside_the_block_ends_only_the_stores_tasks",
    "check_aclose_is_idempotent",
    "check_cancelled_calls_commit_all_or_nothing",
]


async def check_cancelled_calls_commit_all_or_nothing(open_store: StoreFactory) -> None:
    """An append or completion cancelled at any point either committed or did
    not, and retrying it with the same ids is safe."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("cancel")
        batches = [
            [ev("c", {"b": b, "i": i}, id=new_uid("c")) for i in range(3)] for b in range(12)
        ]
        for delay, batch in zip(CANCEL_DELAYS_S, batches, strict=True):
            with trio.move_on_after(delay):
                await store.append(sid, batch)
            retried = await store.append(sid, batch)
            assert [e.id for e in retried.events] == [e.id for e in batch]
        rows = await store.read(sid)
        assert indexes_of(rows) == list(range(1, 37))
        assert [r.id for r in rows] == [e.id for batch in batches for e in batch]

        claimed = claimed_events(await claim(store, sid, ttl_ms=60_000))
        for delay, parent in zip(CANCEL_DELAYS_S, claimed[:12], strict=True):
            returned = [ev("r", {"of": parent.index}, id=new_uid("r")) for _ in range(2)]
            with trio.move_on_after(delay):
                await store.complete_attempt(sid, index=parent.index, attempt=1, events=returned)
            done = await store.complete_attempt(sid, index=parent.index, attempt=1, events=returned)
            assert done.outcome == "completed"
            assert [e.id for e in done.events] == [e.id for e in returned]
        rows = await store.read(sid)
        assert indexes_of(rows) == list(range(1, 37 + 24))
        assert all(r.processed_by_attempt == 1 for r in rows[:12])
        children = [r.cause.index for r in rows[36:] if r.cause is not None]
        assert children == [i for i in range(1, 13) for _ in range(2)]


async def check_aclose_is_idempotent(open_store: StoreFactory) -> None:
    """``aclose`` may be called twice, and before the factory leaves the store."""
    async with open_store(ManualClock()) as store:
        await append_n(store, new_sid("aclose"), 1)
        await store.aclose()
        await store.aclose()


async def check_aclose_inside_the_block_ends_only_the_stores_tasks(
    open_store: StoreFactory,
) -> None:
    """``aclose`` inside ``async with store`` (as the factory enters it), under
    a cancel scope and a feed of the block's own, never cancels the block: the
    code after it runs, and each later call raises ``STORE_UNAVAILABLE`` or
    works (a store that reopens on use), never anything else."""
    ran_on = False
    async with open_store(ManualClock()) as store:
        sid = new_sid("early-close")
        await append_n(store, sid, 1)
        with trio.fail_after(FEED_DEADLINE_S):
            async with store.stream(sid) as feed:
                assert indexes_of(await receive(feed, 1)) == [1]
                await store.aclose()
                await trio.lowlevel.checkpoint()
        for call in (
            lambda: store.read(sid),
            lambda: store.append(sid, [ev("after close")]),
            lambda: store.claim_available(sid, holder="h", ttl_ms=1_000),
        ):
            try:
                await call()
            except A2Error as exc:
                if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                    raise AssertionError(f"after aclose: {exc!r}") from exc
        await store.aclose()
        ran_on = True
    assert ran_on, "aclose cancelled the block that entered the store"
