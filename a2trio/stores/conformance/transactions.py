"""The ``transactions`` capability (issue 35, the outbox): an app's own
statements and its appends commit together, invisible until then, gone
after a rollback; the appends keep every verdict of a lone append; other
appenders to a session the transaction holds index after it.

The app statements are portable SQL without parameters (placeholders differ
between backends), on a table of the check's own.
"""

from __future__ import annotations

from uuid import uuid4

import trio

from ...errors import ErrorCode
from ..base import AppTransactions, EventCause, Store
from .kit import (
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    ev,
    indexes_of,
    new_sid,
    new_uid,
    raises,
    receive,
)

__all__ = [
    "check_transaction_appends_keep_the_verdicts",
    "check_transaction_commits_with_the_apps_rows",
    "check_transaction_holds_its_sessions",
    "check_transaction_rolls_back_with_the_apps_rows",
]


def _transactions(store: Store) -> AppTransactions:
    if store.transactions is None:
        raise CapabilityMissing("transactions")
    return store.transactions


async def _table(store: Store) -> str:
    """A table of the check's own, created (and committed) in a transaction."""
    name = f"conformance_{uuid4().hex[:12]}"
    async with _transactions(store).begin() as tx:
        await tx.execute(f"create table {name} (id text primary key)")
    return name


async def _ids(store: Store, table: str) -> list[str]:
    async with _transactions(store).begin() as tx:
        return [str(row[0]) for row in await tx.fetch(f"select id from {table} order by id")]


async def check_transaction_commits_with_the_apps_rows(open_store: StoreFactory) -> None:
    """The app's row and the appended events commit together; until the
    commit no read and no feed sees the events, then the feed does."""
    async with open_store(ManualClock()) as store:
        table = await _table(store)
        sid = new_sid("tx-commit")
        async with store.stream(sid) as feed:
            async with _transactions(store).begin() as tx:
                await tx.execute(f"insert into {table} values ('a')")
                result = await tx.append(sid, [ev(payload={"n": 0}), ev(payload={"n": 1})])
                assert indexes_of(result.events) == [1, 2]
                assert result.has_pending
                assert result.claimed == []
                assert await tx.fetch(f"select id from {table}") == [("a",)]
                assert await store.read(sid) == []
                with trio.move_on_after(0.05):
                    got = await feed.receive()
                    raise AssertionError(f"a feed saw an uncommitted row: {got!r}")
            live = await receive(feed, 2)
        assert [(r.id, r.index) for r in live] == [(e.id, e.index) for e in result.events]
        assert await store.read(sid) == result.events
        assert await _ids(store, table) == ["a"]
        # Claimable once committed, as any appended event.
        assert indexes_of(claimed_events(await claim(store, sid))) == [1, 2]


async def check_transaction_rolls_back_with_the_apps_rows(open_store: StoreFactory) -> None:
    """An exception in the block rolls back the app's row and the events,
    and frees the indexes they took; a cancelled block too."""
    async with open_store(ManualClock()) as store:
        table = await _table(store)
        sid = new_sid("tx-rollback")
        try:
            async with _transactions(store).begin() as tx:
                await tx.execute(f"insert into {table} values ('a')")
                await tx.append(sid, [ev(id=new_uid("gone"))])
                raise LookupError("the app changed its mind")
        except LookupError:
            pass
        else:
            raise AssertionError("the block's exception was swallowed")
        with trio.CancelScope() as scope:
            async with _transactions(store).begin() as tx:
                await tx.append(sid, [ev()])
                scope.cancel()
                await tx.execute(f"insert into {table} values ('b')")
        assert scope.cancelled_caught
        assert await store.read(sid) == []
        assert await _ids(store, table) == []
        assert indexes_of((await append_n(store, sid, 1)).events) == [1]


async def check_transaction_appends_keep_the_verdicts(open_store: StoreFactory) -> None:
    """Replays, partial duplicates, the expected index and the cause fence
    hold inside a transaction; a verdict writes nothing and leaves it usable."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("tx-verdicts")
        stored = (await store.append(sid, [ev(id=new_uid("p"))])).events
        [parent] = claimed_events(await claim(store, sid))
        async with _transactions(store).begin() as tx:
            replay = await tx.append(sid, [ev(id=stored[0].id)])
            assert [(e.id, e.index) for e in replay.events] == [(stored[0].id, 1)]
            with raises(ErrorCode.PARTIAL_DUPLICATE_BATCH):
                await tx.append(sid, [ev(id=stored[0].id), ev(id=new_uid("fresh"))])
            with raises(ErrorCode.INDEX_CONFLICT):
                await tx.append(sid, [ev()], expected_index=0)
            with raises(ErrorCode.SUPERSEDED_ATTEMPT):
                await tx.append(sid, [ev(cause=EventCause(parent.index, 2))])
            child = await tx.append(sid, [ev(cause=EventCause(parent.index, 1))], expected_index=1)
            assert indexes_of(child.events) == [2]
        assert indexes_of(await store.read(sid)) == [1, 2]


async def check_transaction_holds_its_sessions(open_store: StoreFactory) -> None:
    """Another append to a session the transaction appended to waits for it
    and indexes after it; after a rollback it takes the freed indexes."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("tx-held")
        done: list[int] = []

        async def outside() -> None:
            done.extend(indexes_of((await append_n(store, sid, 1)).events))

        for round_, commit in enumerate((True, False)):
            async with trio.open_nursery() as nursery:
                try:
                    async with _transactions(store).begin() as tx:
                        await tx.append(sid, [ev()])
                        nursery.start_soon(outside)
                        await trio.sleep(0.05)
                        assert len(done) == round_, "an append went past an open transaction"
                        if not commit:
                            raise LookupError("rolled back")
                except LookupError:
                    pass
        # Committed: 1 (the transaction's), 2; rolled back: 3 (its 3 freed).
        assert done == [2, 3]
        assert indexes_of(await store.read(sid)) == [1, 2, 3]
