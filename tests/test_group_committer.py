"""The group committer (``a2trio/stores/postgres/group.py``) on a scripted pipeline.

``GroupCommitter`` takes its transaction runner as an argument, so its
queueing, grouping, replay and cancellation rules are checked here without
Postgres: the runner records each group it is given and answers (or fails,
or blocks) as each test scripts it. tests/test_group_commit.py covers the
real statements on a real server.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from a2trio.stores.postgres.conn import PgConnectionError, PgError, Row
from a2trio.stores.postgres.group import GroupCommitter, GroupStatistics, Kind, Request

Member = tuple[Kind, str, str]


class Pipeline:
    """A scripted ``run_group``: records each group as (kind, session, tag)."""

    def __init__(self) -> None:
        self.groups: list[list[Member]] = []
        #: While set-and-cleared, groups wait here (to hold one in flight).
        self.gate: trio.Event | None = None
        #: A tag whose presence makes the server reject the whole group.
        self.rejects: str | None = None
        #: Raised for every group (a lost connection).
        self.lost: Exception | None = None

    async def run(self, group: Sequence[Request]) -> list[list[Row]]:
        members = [(r.kind, r.session_id, str(r.params[0])) for r in group]
        self.groups.append(members)
        if self.gate is not None:
            await self.gate.wait()
        await trio.lowlevel.checkpoint()
        if self.lost is not None:
            raise self.lost
        if self.rejects is not None and any(tag == self.rejects for *_, tag in members):
            raise PgError("23505", f"duplicate key ({self.rejects})")
        return [[(tag,)] for *_, tag in members]


async def submit(
    committer: GroupCommitter,
    nursery: trio.Nursery,
    results: dict[str, list[Row] | Exception],
    kind: Kind,
    session_id: str,
    tag: str,
) -> None:
    try:
        results[tag] = await committer.submit(nursery, kind, session_id, [tag])
    except Exception as exc:
        results[tag] = exc


async def test_a_lone_statement_runs_in_its_callers_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run)
    async with trio.open_nursery() as nursery:
        assert await committer.submit(nursery, "append", "s1", ["a"]) == [("a",)]
        # Nothing was started in the nursery: the caller ran it.
        assert nursery.child_tasks == frozenset()
    assert pipeline.groups == [[("append", "s1", "a")]]
    assert committer.statistics() == GroupStatistics(groups=1, members=1, largest=1)


async def test_statements_queued_behind_one_in_flight_share_a_group_in_lock_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        queued: list[Member] = [
            ("claim", "s2", "c2"),
            ("claim", "s1", "c1"),
            ("append", "s1", "a1"),
            ("complete", "s1", "k1"),
            ("finish", "s2", "f2"),
        ]
        for kind, session_id, tag in queued:
            nursery.start_soon(submit, committer, nursery, results, kind, session_id, tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    assert pipeline.groups == [
        [("append", "s0", "first")],
        # Sessions ascending; in each, completions, then appends, then claims.
        [
            ("complete", "s1", "k1"),
            ("append", "s1", "a1"),
            ("claim", "s1", "c1"),
            ("finish", "s2", "f2"),
            ("claim", "s2", "c2"),
        ],
    ]
    assert results == {tag: [(tag,)] for tag in ("first", "c2", "c1", "a1", "k1", "f2")}
    assert committer.statistics() == GroupStatistics(groups=2, members=6, largest=5)


async def test_groups_are_bounded_by_max_group(autojump_clock: trio.testing.MockClock) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1, max_group=2)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s", "0")
        await trio.testing.wait_all_tasks_blocked()
        for tag in "12345":
            nursery.start_soon(submit, committer, nursery, results, "append", f"s{tag}", tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    assert [len(group) for group in pipeline.groups] == [1, 2, 2, 1]
    assert sorted(results) == list("012345")


async def test_a_rejected_group_is_replayed_member_by_member(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        pipeline.rejects = "bad"
        for session_id, tag in [("s1", "ok1"), ("s2", "bad"), ("s3", "ok3")]:
            nursery.start_soon(submit, committer, nursery, results, "append", session_id, tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    assert pipeline.groups[1] == [
        ("append", "s1", "ok1"),
        ("append", "s2", "bad"),
        ("append", "s3", "ok3"),
    ]
    # The replays, concurrently: each alone, in any order.
    assert sorted(pipeline.groups[2:]) == [
        [("append", "s1", "ok1")],
        [("append", "s2", "bad")],
        [("append", "s3", "ok3")],
    ]
    assert results["ok1"] == [("ok1",)]
    assert results["ok3"] == [("ok3",)]
    bad = results["bad"]
    assert isinstance(bad, PgError)
    assert bad.sqlstate == "23505"


async def test_a_lone_rejected_statement_raises_the_servers_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    pipeline.rejects = "bad"
    committer = GroupCommitter(pipeline.run)
    async with trio.open_nursery() as nursery:
        with pytest.raises(PgError, match=r"duplicate key \(bad\) \(SQLSTATE 23505\)"):
            await committer.submit(nursery, "append", "s1", ["bad"])
    assert pipeline.groups == [[("append", "s1", "bad")]]
    assert committer.statistics() == GroupStatistics(groups=0, members=0, largest=0)


async def test_a_group_lost_with_its_connection_fails_every_member_on_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        pipeline.lost = OSError("connection reset")
        for tag in ("x", "y"):
            nursery.start_soon(submit, committer, nursery, results, "claim", tag, tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    errors = [results[tag] for tag in ("first", "x", "y")]
    assert all(isinstance(e, PgConnectionError) for e in errors)
    assert isinstance(errors[1], PgConnectionError)
    assert str(errors[1]) == "group of 2 lost: connection reset"
    assert errors[1] is not errors[2]
    assert isinstance(errors[1].__cause__, OSError)
    # Nothing is replayed after a loss: it may have committed.
    assert len(pipeline.groups) == 2


async def test_a_caller_cancelled_while_queued_withdraws_its_statement(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(5) as waited:
            await committer.submit(nursery, "append", "s1", ["withdrawn"])
        assert waited.cancelled_caught
        assert trio.current_time() == 5
        pipeline.gate.set()
    assert pipeline.groups == [[("append", "s0", "first")]]
    assert results == {"first": [("first",)]}


async def test_a_caller_cancelled_in_flight_cancels_the_group_and_the_others_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    committer = GroupCommitter(pipeline.run, committers=1)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    cancelled_at: list[float] = []

    async def impatient() -> None:
        with trio.move_on_after(5) as waited:
            await committer.submit(nursery, "append", "s2", ["impatient"])
        if waited.cancelled_caught:
            cancelled_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, committer, nursery, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, committer, nursery, results, "append", "s1", "patient")
        nursery.start_soon(impatient)
        await trio.testing.wait_all_tasks_blocked()
        # The first group finishes; the next one (both queued) is then in flight
        # behind a new gate when the impatient caller gives up at t=5.
        gate, pipeline.gate = pipeline.gate, trio.Event()
        gate.set()
        await trio.sleep(10)
        pipeline.gate.set()
    assert cancelled_at == [5.0]
    assert pipeline.groups == [
        [("append", "s0", "first")],
        [("append", "s1", "patient"), ("append", "s2", "impatient")],
        [("append", "s1", "patient")],
    ]
    assert results == {"first": [("first",)], "patient": [("patient",)]}
