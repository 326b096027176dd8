"""The group commit (``a2trio/stores/group.py``) on a scripted backend.

``GroupCommit`` takes its transaction runner as an argument, so its grouping,
leader hand-off, replay and cancellation rules are checked here without a
database, on the autojump clock: the runner records each group it is given
and answers, fails or blocks as each test scripts it. The last tests run it
as the Postgres store configures it (its requests in lock order, ``PgError``
replayed, ``PgConnectionError`` for a lost group, three groups in flight).
tests/test_group_commit.py covers the store's statements on a real server;
the durable queues' tests (tests/test_scheduler_queues.py,
tests/test_scheduler_durable.py) run theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from a2trio.stores.group import GroupCommit, GroupLost, GroupStatistics
from a2trio.stores.postgres.conn import PgConnectionError, PgError, Row
from a2trio.stores.postgres.database import Kind, Request, lock_order


class Rejected(Exception):
    """The scripted backend refused the transaction (it rolled back)."""


class Backend:
    """A scripted ``run_group`` over string works; ``committed`` is what landed."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.committed: list[str] = []
        #: Groups wait here while it is unset (to hold one in flight).
        self.gate: trio.Event | None = None
        #: A work whose presence makes the backend reject its transaction.
        self.rejects: str | None = None
        #: Raised for every group (a lost connection).
        self.lost: Exception | None = None
        #: A work run alone waits on its event here.
        self.holds: dict[str, trio.Event] = {}
        #: The task each group ran in.
        self.tasks: list[trio.lowlevel.Task] = []

    async def run(self, works: Sequence[str]) -> list[str]:
        self.groups.append(list(works))
        self.tasks.append(trio.lowlevel.current_task())
        if self.gate is not None:
            await self.gate.wait()
        if len(works) == 1 and works[0] in self.holds:
            await self.holds[works[0]].wait()
        await trio.lowlevel.checkpoint()
        if self.lost is not None:
            raise self.lost
        if self.rejects is not None and self.rejects in works:
            raise Rejected(self.rejects)
        self.committed += works
        return [f"ok:{work}" for work in works]


def release(backend: Backend) -> None:
    """Let the group in flight finish; the next one waits on a fresh gate."""
    assert backend.gate is not None
    gate, backend.gate = backend.gate, trio.Event()
    gate.set()


def group_commit(
    backend: Backend, *, leaders: int = 1, max_group: int = 256
) -> GroupCommit[str, str, str]:
    return GroupCommit(backend.run, rejected=(Rejected,), leaders=leaders, max_group=max_group)


async def submit(
    commit: GroupCommit[str, str, str], results: dict[str, str | BaseException], work: str
) -> None:
    try:
        results[work] = await commit.submit(work, work)
    except Exception as exc:
        results[work] = exc


async def test_a_lone_write_commits_in_its_callers_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    commit = group_commit(backend, leaders=3)
    assert await commit.submit("a", "a") == "ok:a"
    assert backend.groups == [["a"]]
    assert backend.tasks == [trio.lowlevel.current_task()]
    assert commit.statistics() == GroupStatistics(groups=1, members=1, largest=1)


async def test_writes_queued_behind_one_in_flight_share_the_next_group_in_key_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend, leaders=1)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        for work in ("c", "a", "b"):
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        # One group in flight (leaders=1): the others wait for it.
        assert backend.groups == [["first"]]
        backend.gate.set()
    # The first leader finished and promoted the oldest waiter, which led the rest.
    assert backend.groups == [["first"], ["a", "b", "c"]]
    assert results == {w: f"ok:{w}" for w in ("first", "a", "b", "c")}
    assert commit.statistics() == GroupStatistics(groups=2, members=4, largest=3)


async def test_a_leader_serves_only_the_groups_ahead_of_its_own_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend, leaders=1, max_group=2)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "a0")
        await trio.testing.wait_all_tasks_blocked()
        for work in ("b1", "b2", "c1", "c2", "d1"):
            nursery.start_soon(submit, commit, results, work)
            await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    assert backend.groups == [["a0"], ["b1", "b2"], ["c1", "c2"], ["d1"]]
    assert sorted(backend.committed) == sorted(results)


async def test_several_leaders_commit_in_parallel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend, leaders=2)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        for work in ("a", "b", "c", "d"):
            nursery.start_soon(submit, commit, results, work)
            await trio.testing.wait_all_tasks_blocked()
        # Two groups in flight at once; the later two wait for a free leader.
        assert backend.groups == [["a"], ["b"]]
        backend.gate.set()
    assert backend.groups == [["a"], ["b"], ["c", "d"]]
    assert len(results) == 4


async def test_a_burst_behind_a_group_in_flight_shares_one_group_while_leaders_are_free(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend, leaders=3)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        # Started together: the first two take the free slots, and each lets
        # the others queue before it takes the queue.
        for work in ("c", "a", "d", "b"):
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        assert backend.groups == [["first"], ["a", "b", "c", "d"]]
        backend.gate.set()
    assert results == {w: f"ok:{w}" for w in ("first", "a", "b", "c", "d")}
    assert commit.statistics() == GroupStatistics(groups=2, members=5, largest=4)


async def test_a_burst_is_cut_into_groups_of_max_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend, leaders=1, max_group=2)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "0")
        await trio.testing.wait_all_tasks_blocked()
        for work in "12345":
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    assert [len(group) for group in backend.groups] == [1, 2, 2, 1]
    assert sorted(results) == list("012345")


async def test_a_promotion_passes_over_a_caller_that_already_leads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.holds = {"a": trio.Event(), "b": trio.Event()}
    commit = group_commit(backend, leaders=2, max_group=3)
    results: dict[str, str | BaseException] = {}

    async def a_then_g() -> None:
        await submit(commit, results, "a")
        # With no checkpoint between: "a"'s leader has just promoted "x",
        # which has not run yet, so "g" takes the free slot.
        await submit(commit, results, "g")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(a_then_g)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, commit, results, "b")
        await trio.testing.wait_all_tasks_blocked()
        backend.gate = trio.Event()
        for work in ("x", "y", "z"):
            nursery.start_soon(submit, commit, results, work)
            await trio.testing.wait_all_tasks_blocked()
        backend.holds["a"].set()
        await trio.testing.wait_all_tasks_blocked()
        # "g" leads the full group ahead of its own write and stays queued.
        assert backend.groups == [["a"], ["b"], ["x", "y", "z"]]
        nursery.start_soon(submit, commit, results, "h")
        await trio.testing.wait_all_tasks_blocked()
        backend.holds["b"].set()
        await trio.testing.wait_all_tasks_blocked()
        # "b"'s slot goes to "h", not to "g", which holds one already.
        assert backend.groups[-1] == ["g", "h"]
        backend.gate.set()
    assert results == {w: f"ok:{w}" for w in "abxyzgh"}


async def test_a_rejected_group_is_replayed_member_by_member(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    backend.rejects = "bad"
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        for work in ("bad", "good", "fine"):
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    assert backend.groups == [["first"], ["bad", "fine", "good"], ["bad"], ["fine"], ["good"]]
    assert isinstance(results.pop("bad"), Rejected)
    assert results == {"first": "ok:first", "fine": "ok:fine", "good": "ok:good"}
    assert sorted(backend.committed) == ["fine", "first", "good"]


async def test_a_lost_group_fails_every_member_with_its_own_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.lost = OSError("connection reset")
    commit = group_commit(backend)
    with pytest.raises(OSError, match="connection reset"):
        # Alone, the backend's own error.
        await commit.submit("alone", "alone")
    backend.lost = None
    backend.gate = trio.Event()
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        backend.lost = OSError("connection reset")
        for work in ("x", "y"):
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    x, y = results["x"], results["y"]
    assert isinstance(x, GroupLost)
    assert isinstance(y, GroupLost)
    assert x is not y
    assert str(x) == "group of 2 lost: connection reset"
    assert isinstance(x.__cause__, OSError)


async def test_a_caller_cancelled_while_queued_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(1) as scope:
            await commit.submit("gone", "gone")
        assert scope.cancelled_caught
        assert trio.current_time() == 1
        nursery.start_soon(submit, commit, results, "later")
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
    assert backend.groups == [["first"], ["later"]]
    assert "gone" not in backend.committed
    with trio.CancelScope() as early:
        early.cancel()
        await commit.submit("never", "never")
    assert early.cancelled_caught
    assert "never" not in backend.committed


async def test_a_member_cancelled_in_flight_cancels_its_group_and_the_others_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        for work in ("a", "c"):
            nursery.start_soon(submit, commit, results, work)
        cancelled_at: list[float] = []

        async def impatient() -> None:
            with trio.move_on_after(5):
                await commit.submit("b", "b")
            cancelled_at.append(trio.current_time())

        nursery.start_soon(impatient)
        await trio.testing.wait_all_tasks_blocked()
        # "first" is in flight; a, b, c wait as one group behind it.
        await trio.sleep(1)
        release(backend)
        await trio.testing.wait_all_tasks_blocked()
        assert backend.groups[-1] == ["a", "b", "c"]
        # b's caller gives up at t=5 while its group is in flight: the group is
        # cancelled and a and c go again in a group of their own.
        await trio.sleep(5)
        backend.gate.set()
    assert cancelled_at == [5.0]
    assert backend.groups == [["first"], ["a", "b", "c"], ["a", "c"]]
    assert sorted(backend.committed) == ["a", "c", "first"]
    assert results == {"first": "ok:first", "a": "ok:a", "c": "ok:c"}


async def test_a_promoted_caller_cancelled_before_it_leads_passes_the_promotion_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    waiter = trio.CancelScope()

    async def wait_to_lead() -> None:
        with waiter:
            await commit.submit("b", "b")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait_to_lead)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, commit, results, "c")
        await trio.testing.wait_all_tasks_blocked()
        # "a" finishes and promotes "b", whose caller gives up in the same
        # instant: "c" must still be led.
        waiter.cancel()
        backend.gate.set()
    assert waiter.cancelled_caught
    assert backend.groups == [["a"], ["c"]]
    assert results == {"a": "ok:a", "c": "ok:c"}


async def test_a_leader_cancelled_mid_group_requeues_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    leader = trio.CancelScope()

    async def lead() -> None:
        with leader:
            await commit.submit("lead", "lead")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(lead)
        await trio.testing.wait_all_tasks_blocked()
        for work in ("x", "y"):
            nursery.start_soon(submit, commit, results, work)
        await trio.testing.wait_all_tasks_blocked()
        release(backend)
        await trio.testing.wait_all_tasks_blocked()
        # "lead" was promoted and leads [lead, x, y], which waits on the gate.
        assert backend.groups[-1] == ["lead", "x", "y"]
        leader.cancel()
        await trio.testing.wait_all_tasks_blocked()
        # x and y went back to the queue; x was promoted and leads them.
        assert backend.groups[-1] == ["x", "y"]
        backend.gate.set()
    assert leader.cancelled_caught
    assert sorted(backend.committed) == ["first", "x", "y"]
    assert results == {"first": "ok:first", "x": "ok:x", "y": "ok:y"}


async def test_a_leader_cancelled_during_replays_keeps_what_committed_and_requeues_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = Backend()
    backend.gate = trio.Event()
    backend.rejects = "x"
    backend.holds["b"] = trio.Event()
    commit = group_commit(backend)
    results: dict[str, str | BaseException] = {}
    leader = trio.CancelScope()
    quitter = trio.CancelScope()

    async def lead() -> None:
        with leader:
            await commit.submit("a", "a")

    async def quit_early() -> None:
        with quitter:
            await commit.submit("c", "c")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, commit, results, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(lead)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, commit, results, "b")
        nursery.start_soon(quit_early)
        nursery.start_soon(submit, commit, results, "x")
        await trio.testing.wait_all_tasks_blocked()
        backend.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        # [a, b, c, x] was rejected; "a" replayed and committed, "b" is held.
        assert backend.groups[-3:] == [["a", "b", "c", "x"], ["a"], ["b"]]
        # "c" gives up before its replay and "a"'s caller is cancelled during
        # b's: "a" committed all the same; b and x go again under a new leader.
        quitter.cancel()
        await trio.testing.wait_all_tasks_blocked()
        leader.cancel()
        await trio.testing.wait_all_tasks_blocked()
        backend.holds.pop("b").set()
    assert leader.cancelled_caught
    assert quitter.cancelled_caught
    assert sorted(backend.committed) == ["a", "b", "first"]
    assert backend.groups[-3:] == [["b", "x"], ["b"], ["x"]]
    assert isinstance(results.pop("x"), Rejected)
    assert results == {"first": "ok:first", "b": "ok:b"}


# -- as the Postgres store configures it ---------------------------------------

Member = tuple[Kind, str, str]


class Pipeline:
    """A scripted ``Database.run_group``: records each group as (kind, session, tag)."""

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


StoreGroups = GroupCommit[tuple[str, int], Request, list[Row]]


def store_group_commit(pipeline: Pipeline) -> StoreGroups:
    """What ``PostgresStore`` builds on its ``Database.run_group``."""
    return GroupCommit(pipeline.run, rejected=(PgError,), lost=PgConnectionError, leaders=3)


async def store_submit(
    groups: StoreGroups,
    results: dict[str, list[Row] | Exception],
    kind: Kind,
    session_id: str,
    tag: str,
) -> None:
    request = Request(kind, session_id, [tag])
    try:
        results[tag] = await groups.submit(lock_order(request), request)
    except Exception as exc:
        results[tag] = exc


async def test_statements_queued_behind_one_in_flight_share_a_group_in_lock_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    groups = store_group_commit(pipeline)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store_submit, groups, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        queued: list[Member] = [
            ("claim", "s2", "c2"),
            ("claim", "s1", "c1"),
            ("append", "s1", "a1"),
            ("complete", "s1", "k1"),
            ("finish", "s2", "f2"),
        ]
        for kind, session_id, tag in queued:
            nursery.start_soon(store_submit, groups, results, kind, session_id, tag)
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
    assert groups.statistics() == GroupStatistics(groups=2, members=6, largest=5)


async def test_a_group_the_server_rejected_is_replayed_member_by_member(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    groups = store_group_commit(pipeline)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store_submit, groups, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        pipeline.rejects = "bad"
        for session_id, tag in [("s1", "ok1"), ("s2", "bad"), ("s3", "ok3")]:
            nursery.start_soon(store_submit, groups, results, "append", session_id, tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    # The group, then each member alone, in the group's order.
    assert pipeline.groups[1:] == [
        [("append", "s1", "ok1"), ("append", "s2", "bad"), ("append", "s3", "ok3")],
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
    groups = store_group_commit(pipeline)
    request = Request("append", "s1", ["bad"])
    with pytest.raises(PgError, match=r"^duplicate key \(bad\) \(SQLSTATE 23505\)$"):
        await groups.submit(lock_order(request), request)
    assert pipeline.groups == [[("append", "s1", "bad")]]
    assert groups.statistics() == GroupStatistics(groups=0, members=0, largest=0)


async def test_a_group_lost_with_its_connection_fails_every_member_on_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pipeline = Pipeline()
    groups = store_group_commit(pipeline)
    results: dict[str, list[Row] | Exception] = {}
    pipeline.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store_submit, groups, results, "append", "s0", "first")
        await trio.testing.wait_all_tasks_blocked()
        lost = pipeline.lost = OSError("connection reset")
        for tag in ("x", "y"):
            nursery.start_soon(store_submit, groups, results, "claim", tag, tag)
        await trio.testing.wait_all_tasks_blocked()
        pipeline.gate.set()
    # Alone, the driver's own error (the store's driver raises PgConnectionError).
    assert results["first"] is lost
    x, y = results["x"], results["y"]
    assert isinstance(x, PgConnectionError)
    assert isinstance(y, PgConnectionError)
    assert str(x) == "group of 2 lost: connection reset"
    assert x is not y
    assert x.__cause__ is lost
    # Nothing is replayed after a loss: it may have committed.
    assert len(pipeline.groups) == 2
