"""Actors in process: definition checks, calls, refusals, conflicts, messageId
answers, live states. The HTTP lanes are tests/test_actor_routes.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine.actor_calls import MAX_CALL_ATTEMPTS
from a2trio.stores import memory
from a2trio.stores.base import AppendEvent
from examples.vault import (
    LARGE_DEPOSIT,
    Deposit,
    Deposited,
    Vault,
    Withdraw,
    review,
    vault,
)


def _server(store: Any = None, **options: Any) -> a2trio.Server:
    return a2trio.Server(
        vault,
        store=store if store is not None else memory(clock=a2trio.TrioClock()),
        **options,
    )


# -- definition --------------------------------------------------------------


def _fold(state: int, event: a2trio.Event[Any]) -> int:
    return state + 1


async def _noop(state: int, input: int) -> None:
    return None


_COUNT = a2trio.Reducer("count", 0, _fold)


def test_an_actor_is_a_contract_with_state_and_calls() -> None:
    assert isinstance(vault, a2trio.Contract)
    assert sorted(vault.calls) == ["deposit", "withdraw"]
    assert vault.reducer.name == "vault-v1"
    assert repr(vault) == "Actor('vault', calls=['deposit', 'withdraw'])"
    assert repr(vault.calls["deposit"]).startswith("ActorCall(")
    assert a2trio.Actor.__module__ == "a2trio"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"state": "count"},
            TypeError,
            r"^actor 'a': state= takes an a2trio.Reducer, got 'count'$",
        ),
        ({"calls": {}}, TypeError, r"^actor 'a' needs at least one call$"),
        ({"calls": {"": a2trio.call(int, _noop)}}, TypeError, r"call name '' must be"),
        ({"calls": {"go": _noop}}, TypeError, r"call 'go' must be built with a2trio.call\(\)"),
        (
            {"calls": {"go": a2trio.call(int, _noop, emits=["nope"])}},
            ValueError,
            r"^actor 'a': call 'go' emits 'nope', which is not one of its event types \['e'\]$",
        ),
    ],
)
def test_construction_names_the_culprit(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {
        "events": {"e": int},
        "state": _COUNT,
        "calls": {"go": a2trio.call(int, _noop)},
    }
    options.update(kwargs)
    with pytest.raises(error, match=message):
        a2trio.actor("a", **options)


def test_call_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match="is not one msgspec can validate"):
        a2trio.call(object(), _noop)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="must be callable"):
        a2trio.call(int, "fn")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="takes a list of event types"):
        a2trio.call(int, _noop, emits="e")
    with pytest.raises(TypeError, match="fold must be callable"):
        a2trio.Reducer("r", 0, "fold")  # type: ignore[arg-type]


def test_a_plain_contract_has_no_actors() -> None:
    server = a2trio.Server(a2trio.contract("c", events={"e": int}), store=memory())
    with pytest.raises(TypeError, match="implements a contract, not an actor"):
        server.actor("x")


# -- calls -------------------------------------------------------------------


async def test_calls_commit_and_answer_the_state_after_their_own_commit(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        assert repr(alice) == "ActorHandle('vault', 'alice')"
        assert await alice.state() == a2trio.ActorState(Vault(), 0)
        answer = await alice.call("deposit", {"amount": 50})
        assert answer == a2trio.ActorState(Vault(50, ("+50",)), 1)
        answer = await alice.call("withdraw", Withdraw(20))
        assert answer == a2trio.ActorState(Vault(30, ("+50", "-20")), 2)
        assert await alice.state() == answer
        [first, second] = await server.session("alice").history()
        assert (first.type, first.payload, second.type) == ("deposited", Deposited(50), "withdrawn")


async def test_a_refusal_commits_nothing(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        await alice.call("deposit", {"amount": 5})
        with pytest.raises(a2trio.Refused, match="insufficient funds: the balance is 5") as caught:
            await alice.call("withdraw", {"amount": 6}, message_id="w1")
        assert caught.value.code is a2trio.ErrorCode.CALL_REFUSED
        assert repr(caught.value) == "Refused('insufficient funds: the balance is 5')"
        assert len(await server.session("alice").history()) == 1
        # Not remembered: the same messageId runs again on the new state.
        await alice.call("deposit", {"amount": 5})
        answer = await alice.call("withdraw", {"amount": 6}, message_id="w1")
        assert (answer.state.balance, answer.index) == (4, 3)


async def test_bad_calls_are_refused_before_anything_runs(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        with pytest.raises(a2trio.A2Error, match="has no call 'steal'") as unknown:
            await alice.call("steal", {})
        assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_EVENT_TYPE
        with pytest.raises(a2trio.A2Error, match=r"at `\$.amount`") as bad:
            await alice.call("deposit", {"amount": -1})
        assert bad.value.code is a2trio.ErrorCode.INVALID_PAYLOAD
        with pytest.raises(ValueError, match="message id"):
            await alice.call("deposit", {"amount": 1}, message_id="a\x00b")
        assert await server.session("alice").history() == []
    with pytest.raises(RuntimeError, match="is not open"):
        await server.actor("alice").call("deposit", {"amount": 1})


async def test_message_id_answers_the_original_without_running_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    runs: list[int] = []

    async def deposit(state: Vault, input: Deposit) -> list[a2trio.AppendInput]:
        runs.append(input.amount)
        return [vault.event("deposited", Deposited(input.amount))] * 2

    twice = a2trio.actor(
        "vault",
        events=vault.events,
        state=vault.reducer,
        calls={"deposit": a2trio.call(Deposit, deposit)},
    )
    store = memory(clock=a2trio.TrioClock())
    async with a2trio.Server(twice, store=store) as server:
        alice = server.actor("alice")
        first = await alice.call("deposit", {"amount": 7}, message_id="m1")
        assert (first.state.balance, first.index) == (14, 2)
        await alice.call("deposit", {"amount": 1})
        assert await alice.call("deposit", {"amount": 7}, message_id="m1") == first
        # A messageId names one call: another input still gets its answer.
        assert await alice.call("deposit", {"amount": 99}, message_id="m1") == first
        assert runs == [7, 1]
    # A new server on the same store (a restart): still the original answer.
    async with a2trio.Server(twice, store=store) as server:
        assert await server.actor("alice").call("deposit", {"amount": 7}, message_id="m1") == first
        assert runs == [7, 1]


async def test_zero_events_answer_the_current_state(autojump_clock: trio.abc.Clock) -> None:
    async def peek(state: int, input: None) -> None:
        return None

    async def bump(state: int, input: None) -> a2trio.AppendInput:
        return counter.event("bumped", 1)

    counter = a2trio.actor(
        "counter",
        events={"bumped": int},
        state=_COUNT,
        calls={"peek": a2trio.call(None, peek), "bump": a2trio.call(None, bump)},
    )
    async with a2trio.Server(counter, store=memory(clock=a2trio.TrioClock())) as server:
        c = server.actor("c")
        await c.call("bump", None)
        assert await c.call("peek", None, message_id="p") == a2trio.ActorState(1, 1)
        await c.call("bump", None)
        assert await c.call("peek", None, message_id="p") == a2trio.ActorState(2, 2)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("nope", r"must return None, an event built with bad.event\(\.\.\.\) or a list of them"),
        ([1], r"must return None"),
        ("other", r"returned a 'other' event but emits only \['e'\]"),
        ("with-id", r"returned an event with id 'x': a call's event ids come from the call"),
        ("many", r"returned 1001 events; a call commits at most 1000"),
    ],
)
async def test_what_a_call_returns_is_checked(
    autojump_clock: trio.abc.Clock, result: Any, message: str
) -> None:
    async def go(state: int, input: None) -> Any:
        match result:
            case "other":
                return bad.event("other", 0)
            case "with-id":
                return bad.event("e", 0, id="x")
            case "many":
                return [bad.event("e", 0)] * 1001
        return result

    bad = a2trio.actor(
        "bad",
        events={"e": int, "other": int},
        state=_COUNT,
        calls={"go": a2trio.call(None, go, emits=["e"])},
    )
    async with a2trio.Server(bad, store=memory(clock=a2trio.TrioClock())) as server:
        with pytest.raises((TypeError, ValueError), match=message):
            await server.actor("b").call("go", None)
        assert await server.session("b").history() == []


async def test_sync_call_functions_work_too(autojump_clock: trio.abc.Clock) -> None:
    def bump(state: int, input: int) -> list[a2trio.AppendInput]:
        return [counter.event("bumped", input)] * input

    counter = a2trio.actor(
        "counter", events={"bumped": int}, state=_COUNT, calls={"bump": a2trio.call(int, bump)}
    )
    async with a2trio.Server(counter, store=memory(clock=a2trio.TrioClock())) as server:
        assert await server.actor("c").call("bump", 3) == a2trio.ActorState(3, 3)


async def test_calls_on_one_actor_take_turns(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        answers: list[int] = []

        async def deposit(n: int) -> None:
            answers.append((await alice.call("deposit", {"amount": n})).index)

        async with trio.open_nursery() as nursery:
            for n in range(1, 11):
                nursery.start_soon(deposit, n)
            await trio.testing.wait_all_tasks_blocked()
        assert sorted(answers) == list(range(1, 11))
        assert (await alice.state()).state.balance == 55
        assert server._calls is not None
        assert server._calls.waiting == 0


async def test_a_conflicting_writer_makes_the_call_run_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    runs: list[int] = []
    store = memory(clock=a2trio.TrioClock())

    async def deposit(state: Vault, input: Deposit) -> a2trio.AppendInput:
        runs.append(state.balance)
        if len(runs) < 3:
            # Another process's write lands between this read and the commit.
            await store.append(
                "vault\x1falice", [AppendEvent("deposited", {"amount": 100}, settled=True)]
            )
        return vault.event("deposited", Deposited(input.amount))

    racy = a2trio.actor(
        "vault",
        events=vault.events,
        state=vault.reducer,
        calls={"deposit": a2trio.call(Deposit, deposit)},
    )
    async with a2trio.Server(racy, store=store) as server:
        answer = await server.actor("alice").call("deposit", {"amount": 1})
        assert runs == [0, 100, 200]
        assert (answer.state.balance, answer.index) == (201, 3)


async def test_a_call_that_keeps_losing_gives_up_with_index_conflict(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    runs: list[int] = []

    async def deposit(state: Vault, input: Deposit) -> a2trio.AppendInput:
        runs.append(1)
        await store.append(
            "vault\x1falice", [AppendEvent("deposited", {"amount": 1}, settled=True)]
        )
        return vault.event("deposited", Deposited(input.amount))

    racy = a2trio.actor(
        "vault",
        events=vault.events,
        state=vault.reducer,
        calls={"deposit": a2trio.call(Deposit, deposit)},
    )
    async with a2trio.Server(racy, store=store) as server:
        with pytest.raises(a2trio.A2Error, match="lost its commit to other writers 5 times") as err:
            await server.actor("alice").call("deposit", {"amount": 1000}, message_id="m")
        assert err.value.code is a2trio.ErrorCode.INDEX_CONFLICT
        assert len(runs) == MAX_CALL_ATTEMPTS
        history = await server.session("alice").history()
        assert [e.payload.amount for e in history] == [1] * MAX_CALL_ATTEMPTS


@pytest.mark.parametrize("amount", [1, 2])
async def test_a_twin_elsewhere_committing_the_same_message_id_wins(
    autojump_clock: trio.abc.Clock, amount: int
) -> None:
    """Two processes, one messageId: the loser's batch of the same size
    replays the winner's rows, one of another size is refused as a mix; either
    way the loser answers the winner's answer."""
    store = memory(clock=a2trio.TrioClock())
    gate, started = trio.Event(), trio.Event()

    async def slow_deposit(state: Vault, input: Deposit) -> list[a2trio.AppendInput]:
        started.set()
        await gate.wait()
        return [vault.event("deposited", Deposited(1))] * input.amount

    slow = a2trio.actor(
        "vault",
        events=vault.events,
        state=vault.reducer,
        calls={"deposit": a2trio.call(Deposit, slow_deposit)},
    )
    answers: list[a2trio.ActorState[Any]] = []
    async with a2trio.Server(slow, store=store) as loser, _server(store) as winner:

        async def lose() -> None:
            call = loser.actor("t").call("deposit", {"amount": amount}, message_id="m")
            answers.append(await call)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lose)
            await started.wait()
            won = await winner.actor("t").call("deposit", {"amount": 1}, message_id="m")
            gate.set()
    assert won == a2trio.ActorState(Vault(1, ("+1",)), 1)
    assert answers == [won]
    assert len(await loser.session("t").history()) == 1


async def test_handlers_run_on_actor_events(autojump_clock: trio.abc.Clock) -> None:
    async with _server(handlers={"deposited": review}) as server:
        alice = server.actor("alice")
        await alice.call("deposit", {"amount": LARGE_DEPOSIT})
        await server.settle()
        state = await alice.state()
        assert state.state.audit == (f"+{LARGE_DEPOSIT}", "flagged: large deposit at #1")
        assert state.index == 2


# -- live states -------------------------------------------------------------


async def test_states_follow_every_commit_and_resume_from_an_index(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        await alice.call("deposit", {"amount": 1})
        async with alice.states() as feed:
            assert await feed.receive() == a2trio.ActorState(Vault(1, ("+1",)), 1)
            await alice.call("deposit", {"amount": 2})
            frame = await feed.receive()
            assert (frame.state.balance, frame.index) == (3, 2)
            async with alice.states(start_after=2) as resumed:
                await alice.call("withdraw", {"amount": 3})
                for live in (feed, resumed):
                    frame = await live.receive()
                    assert (frame.state.balance, frame.index) == (0, 3)
        async with alice.states(start_after=1) as behind:
            assert (await behind.receive()).index == 3


async def test_a_burst_of_events_is_one_frame(autojump_clock: trio.abc.Clock) -> None:
    async with _server() as server:
        session = server.session("alice")
        async with server.actor("alice").states(start_after=0) as feed:
            await session.append(*[vault.event("deposited", Deposited(1)) for _ in range(3)])
            frame = await feed.receive()
            assert (frame.state.balance, frame.index) == (3, 3)
            assert isinstance(frame.state, Vault)


def test_state_records_encode_as_the_wire_shape() -> None:
    assert msgspec.json.encode(a2trio.ActorState(Vault(2), 4)) == (
        b'{"state":{"balance":2,"audit":[]},"index":4}'
    )


async def test_a_frame_is_a_copy_a_mutating_fold_leaves_alone(
    autojump_clock: trio.abc.Clock,
) -> None:
    def append(state: list[int], event: a2trio.Event[int]) -> list[int]:
        state.append(event.payload)
        return state

    async def add(state: list[int], input: int) -> a2trio.AppendInput:
        return log.event("added", input)

    empty: list[int] = []
    log: a2trio.Actor[list[int]] = a2trio.actor(
        "log",
        events={"added": int},
        state=a2trio.Reducer("log", empty, append, list[int]),
        calls={"add": a2trio.call(int, add)},
    )
    async with a2trio.Server(log, store=memory(clock=a2trio.TrioClock())) as server:
        handle = server.actor("l")
        async with handle.states() as feed:
            first = await feed.receive()
            await handle.call("add", 1)
            second = await feed.receive()
        assert (first.state, second.state) == ([], [1])


async def test_a_reader_ahead_of_the_log_waits_for_newer_frames(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with _server() as server:
        alice = server.actor("alice")
        async with alice.states(start_after=3) as feed:
            for _ in range(4):
                await alice.call("deposit", {"amount": 1})
                await trio.testing.wait_all_tasks_blocked()
            frame = await feed.receive()
        assert (frame.state.balance, frame.index) == (4, 4)


async def test_a_retried_answer_folds_from_a_fitting_snapshot_or_the_log(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = memory(clock=a2trio.TrioClock())
    async with _server(store) as server:
        alice = server.actor("alice")
        await alice.call("deposit", {"amount": 1})
        first = await alice.call("deposit", {"amount": 2}, message_id="m")
        await server.settle()
        [snapshot] = await store.inspect.list_snapshots(server.key("alice"))
        assert snapshot.index == 1, "the second call's read wrote it back"
        assert await alice.call("deposit", {"amount": 2}, message_id="m") == first
        await alice.call("deposit", {"amount": 4})
        await alice.state()
        await server.settle()
        [snapshot] = await store.inspect.list_snapshots(server.key("alice"))
        assert snapshot.index == 3, "past the call: its answer folds the log"
        assert await alice.call("deposit", {"amount": 2}, message_id="m") == first

        bob = server.actor("bob")
        original = await bob.call("deposit", {"amount": 5}, message_id="b")
        # A snapshot that no longer fits the state type: the log is folded.
        await store.put_snapshot(server.key("bob"), "vault-v1", 1, {"balance": "lots"})
        assert await bob.call("deposit", {"amount": 5}, message_id="b") == original


async def test_a_twin_committing_between_the_lookup_and_the_read_wins(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Another process commits the same messageId after this call looked it
    up but before it read the state: the call's append replays those rows at
    an older index, and the call answers the twin's original answer."""
    from a2trio.ids import call_event_id
    from a2trio.stores.memory import MemoryStore

    class TwinFirst(MemoryStore):
        twin = True

        async def read_states(self, session_ids: Any, reducer: str) -> Any:
            if self.twin:
                self.twin = False
                event_id = call_event_id("vault", "alice", "m", 0, 1)
                twin = AppendEvent("deposited", {"amount": 3}, event_id)
                await self.append(session_ids[0], [twin])
            return await super().read_states(session_ids, reducer)

    store = TwinFirst(clock=a2trio.TrioClock())
    async with _server(store) as server:
        answer = await server.actor("alice").call("deposit", {"amount": 7}, message_id="m")
        assert not store.twin, "the twin committed first"
        assert answer == a2trio.ActorState(Vault(3, ("+3",)), 1)
        assert len(await server.session("alice").history()) == 1


@pytest.mark.parametrize("committed", [False, True])
async def test_a_store_failure_reaches_the_caller_and_a_retry_is_exactly_once(
    autojump_clock: trio.abc.Clock, committed: bool
) -> None:
    """The append fails before committing, or commits and loses its answer:
    either way the caller sees STORE_UNAVAILABLE, and a retry with the same
    messageId commits once."""
    from a2trio.testing import FaultyStore

    store = FaultyStore(memory(clock=a2trio.TrioClock()))
    async with _server(store) as server:
        alice = server.actor("alice")
        with store.fail("append", times=1, after=committed):
            with pytest.raises(a2trio.A2Error) as failed:
                await alice.call("deposit", {"amount": 1}, message_id="m")
        assert failed.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
        answer = await alice.call("deposit", {"amount": 1}, message_id="m")
        assert answer == a2trio.ActorState(Vault(1, ("+1",)), 1)
        assert len(await server.session("alice").history()) == 1


async def test_a_cancelled_receive_loses_no_folded_event(autojump_clock: trio.abc.Clock) -> None:
    """An SSE heartbeat cancels ``receive`` on every idle interval, also while
    it waits for the rest of a burst: what it folded is framed next time."""
    from a2trio.engine.actor_calls import _StateFeed
    from a2trio.stores.feed import Feed

    scope = trio.CancelScope()

    class OneEvent(Feed[a2trio.Event[Any]]):
        sent = False

        async def receive(self) -> a2trio.Event[Any]:
            if not self.sent:
                self.sent = True
                return a2trio.Event("e", "deposited", Deposited(1), 1, "a", datetime.now(UTC))
            scope.cancel()  # the heartbeat fires while the burst settles
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    feed = _StateFeed(vault, a2trio.ActorState(Vault(), 0), OneEvent(), 0)
    with scope:
        await feed.receive()
    assert scope.cancelled_caught
    with trio.fail_after(5):
        frame = await feed.receive()
    assert frame == a2trio.ActorState(Vault(1, ("+1",)), 1)
