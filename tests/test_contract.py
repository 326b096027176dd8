"""Declarations and small value types: contracts, reducers, timings, clocks,
errors and store URLs. Bad input is refused at construction, naming the value."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.stores import PostgresStore, SqliteStore, from_url
from a2trio.stores.memory import MemoryStore


class Item(msgspec.Struct, frozen=True):
    name: str
    qty: int = 1


class Tally(msgspec.Struct):
    seen: list[str] = []


items = a2trio.contract("items", events={"item": Item, "note": str})


# -- contracts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("", {"item": Item}), TypeError, "contract name must be a non-empty string, got ''"),
        ((3, {"item": Item}), TypeError, "contract name must be a non-empty string, got 3"),
        (("a/b", {"item": Item}), ValueError, "contract name 'a/b' must not contain '/'"),
        (("a\x1fb", {"item": Item}), ValueError, "must not contain '/' or U\\+001F"),
        (("c", {}), TypeError, "contract 'c' needs at least one event type"),
        (("c", []), TypeError, "contract 'c' needs at least one event type"),
        (
            ("c", [("item", Item)]),
            TypeError,
            r"contract 'c': events= takes a mapping of event type -> payload type or a list "
            r"of a2trio.event_type\(...\) handles, got \('item', .*\) in a list",
        ),
        (("c", {"": Item}), TypeError, "contract 'c': event type '' must be a non-empty string"),
        (
            ("c", {"item": Item}, {7: int}),
            TypeError,
            "contract 'c': presence field 7 must be a non-empty string",
        ),
        (
            ("c", {"item": object()}),
            TypeError,
            "contract 'c': event type 'item' has type <object object at .*>, "
            "which msgspec cannot validate",
        ),
    ],
)
def test_contract_declarations_are_validated(
    args: tuple[Any, ...], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        a2trio.contract(*args)


def test_contract_repr_and_presence_flag() -> None:
    assert repr(items) == "Contract('items', events=['item', 'note'])"
    assert not items.declares_presence
    assert a2trio.contract("p", events={"note": str}, presence={"typing": bool}).declares_presence


def test_payload_errors_carry_msgspecs_message_and_path() -> None:
    with pytest.raises(a2trio.A2Error) as nested:
        items.event("item", {"name": "book", "qty": "two"})
    assert nested.value.code is a2trio.ErrorCode.INVALID_PAYLOAD
    assert nested.value.details == {"message": "Expected `int`, got `str`", "path": "$.qty"}
    with pytest.raises(a2trio.A2Error) as top:
        items.event("item", "book")
    assert top.value.details == {"message": "Expected `object`, got `str`", "path": "$"}
    # A value msgspec cannot even turn into JSON builtins.
    with pytest.raises(a2trio.A2Error) as opaque:
        items.event("note", object())
    assert opaque.value.code is a2trio.ErrorCode.INVALID_PAYLOAD
    assert opaque.value.details["path"] == "$"
    assert "invalid payload for event 'note' on contract 'items'" in opaque.value.message
    with pytest.raises(a2trio.A2Error) as unknown:
        items.validate(3, {})  # type: ignore[arg-type]
    assert unknown.value.code is a2trio.ErrorCode.UNKNOWN_EVENT_TYPE


def test_decode_trusts_stored_rows_and_passes_undeclared_types_through() -> None:
    assert items.decode("item", {"name": "pen"}) == Item("pen")
    # A row of a type this contract no longer declares (an older version's).
    assert items.decode("retired", {"any": [1]}) == {"any": [1]}
    assert items.decode_presence("undeclared", 5) == 5


# -- reducers --------------------------------------------------------------------------


def test_reducer_arguments_are_validated() -> None:
    with pytest.raises(TypeError, match=r"^reducer name must be a non-empty string, got ''$"):
        a2trio.Reducer("", 0, lambda s, e: s)
    with pytest.raises(TypeError, match=r"^reducer fold must be callable, got 'fold'$"):
        a2trio.Reducer("r", 0, "fold")  # type: ignore[arg-type]
    assert repr(a2trio.Reducer("count", 0, lambda s, e: s)) == "Reducer('count')"


def test_reducer_fresh_copies_never_share_the_initial_state() -> None:
    struct = a2trio.Reducer("tally", Tally(), lambda s, e: s)
    assert struct.state_type is Tally
    copy = struct.fresh()
    copy.seen.append("x")
    assert struct.initial == Tally()
    assert copy is not struct.initial
    as_dict = a2trio.Reducer("d", {"n": [1]}, lambda s, e: s)
    fresh = as_dict.fresh()
    fresh["n"].append(2)
    assert as_dict.initial == {"n": [1]}
    assert a2trio.Reducer("n", 7, lambda s, e: s).fresh() == 7


def test_reducer_fresh_falls_back_to_the_initial_when_it_cannot_convert() -> None:
    initial = {"n": 1}
    odd = a2trio.Reducer("odd", initial, lambda s, e: s, state_type=int)
    assert odd.fresh() is initial


# -- timings, clocks, errors, store URLs ------------------------------------------------


def test_timings_must_be_positive_and_beat_inside_the_ttl() -> None:
    with pytest.raises(ValueError, match=r"^Timings.claim_ttl_s must be positive, got 0$"):
        a2trio.Timings(claim_ttl_s=0)
    with pytest.raises(ValueError, match=r"^Timings.max_failures must be positive, got -1$"):
        a2trio.Timings(max_failures=-1)
    with pytest.raises(ValueError, match=r"heartbeat_s \(30.0\) must be shorter than claim_ttl_s"):
        a2trio.Timings(heartbeat_s=30.0)


async def test_trio_clock_reads_from_a_worker_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = a2trio.TrioClock(epoch_ms=1_000)
    await trio.sleep(2.5)
    assert clock.now_ms() == 3_500
    assert await trio.to_thread.run_sync(clock.now_ms) == 3_500
    assert repr(clock) == "TrioClock(epoch_ms=1000)"
    assert repr(a2trio.clock.SYSTEM_CLOCK) == "SystemClock()"


def test_a2error_repr_and_codes() -> None:
    error = a2trio.A2Error("FORBIDDEN", "no")
    assert error.code is a2trio.ErrorCode.FORBIDDEN
    assert repr(error) == "A2Error('FORBIDDEN', 'no')"
    assert str(error).endswith(": no")
    with pytest.raises(ValueError, match="'NOPE' is not a valid ErrorCode"):
        a2trio.A2Error("NOPE", "?")


def test_store_urls() -> None:
    assert isinstance(from_url("memory:"), MemoryStore)
    assert isinstance(from_url("sqlite:///:memory:"), SqliteStore)
    for url in ("postgres://u@h/db", "postgresql://u@h/db"):
        assert isinstance(from_url(url), PostgresStore)  # no I/O until opened
    with pytest.raises(ValueError, match=r"^unknown store URL 'mysql://h': use 'memory:'"):
        from_url("mysql://h")
