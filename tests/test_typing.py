"""The typed forms: what a type checker verifies (mypy over ``tests/typing/``)
and what construction checks at run time (issue 36, item 3).

``tests/typing/mistakes.py`` marks each line that must be a mypy error with
``# E: <code>``; mypy must report exactly those, and nothing in
``tests/typing/shop.py`` (the correct forms, with ``assert_type``). The main
``mypy a2trio tests examples`` run excludes the folder (``pyproject.toml``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import msgspec
import pytest
import trio

import a2trio
from a2trio.signatures import accepts, parameter_annotation
from a2trio.stores import memory
from a2trio.testing import AppFactory
from tests.typing import shop
from tests.typing.shop import AddItem, Cart, Checkout, ItemAdded, OrderPlaced, OrderShipped

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"
_MARK = re.compile(r"#\s*E:\s*([a-z-]+)\s*$")
_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def test_mypy_reports_each_mistake_and_nothing_else() -> None:
    expected = {
        ("mistakes.py", number, match.group(1))
        for number, line in enumerate((TYPING / "mistakes.py").read_text().splitlines(), 1)
        if (match := _MARK.search(line))
    }
    assert len(expected) >= 10
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "tests/typing/shop.py", "tests/typing/mistakes.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    reported = {
        (Path(m["path"]).name, int(m["line"]), m["code"])
        for m in map(_ERROR.match, run.stdout.splitlines())
        if m
    }
    assert run.returncode == 1, run.stdout + run.stderr
    assert sorted(reported) == sorted(expected), run.stdout


# -- event types ---------------------------------------------------------------


def test_an_event_type_builds_validated_append_inputs() -> None:
    placed = shop.placed
    assert placed(OrderPlaced("o-1"), id="c-1") == a2trio.AppendInput(
        "placed", OrderPlaced("o-1"), "c-1"
    )
    # At run time a dict converts, as for contract.event().
    assert placed({"order_id": "o-1"}).payload == OrderPlaced("o-1")  # type: ignore[arg-type]
    with pytest.raises(a2trio.A2Error) as info:
        placed({"order_id": 1})  # type: ignore[arg-type]
    assert info.value.code == "INVALID_PAYLOAD"
    assert info.value.message == (
        "invalid payload for event 'placed': Expected `str`, got `int` - at `$.order_id`"
    )
    assert info.value.details == {"message": "Expected `str`, got `int`", "path": "$.order_id"}
    with pytest.raises(ValueError, match="control character"):
        placed(OrderPlaced("o-1"), id="a\x00b")
    assert repr(placed) == "EventType('placed', OrderPlaced)"
    assert repr(shop.cancelled) == "EventType('cancelled', None)"
    assert a2trio.EventType.__module__ == "a2trio"


def test_event_type_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match=r"^event type name must be a non-empty string, got ''$"):
        a2trio.event_type("", OrderPlaced)
    with pytest.raises(TypeError, match=r"event type 'x' has type .* which msgspec cannot"):
        a2trio.event_type("x", object())
    with pytest.raises(ValueError, match=r"^contract 'c' declares event type 'placed' twice$"):
        a2trio.contract("c", events=[shop.placed, a2trio.event_type("placed", OrderShipped)])


def test_a_contract_of_handles_is_the_contract_of_its_mapping() -> None:
    assert shop.orders.events == {"placed": OrderPlaced, "shipped": OrderShipped, "cancelled": None}
    # Handles work with a contract declared by a mapping of the same types.
    mapped = a2trio.contract("mapped", events={"placed": OrderPlaced})
    a2trio.Server(mapped, store=memory(), handlers=[a2trio.on(shop.placed, shop.ship)])


async def test_typed_forms_run_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    handlers = [a2trio.on(shop.placed, shop.ship, abort_on=[shop.cancelled])]
    store = memory(clock=a2trio.TrioClock())
    async with a2trio.Server(shop.orders, store=store, handlers=handlers) as server:
        session = server.session("o-1")
        await session.append(shop.placed(OrderPlaced("o-1")))
        await server.settle()
        history = await session.history()
        assert [(e.type, e.payload) for e in history] == [
            ("placed", OrderPlaced("o-1")),
            ("shipped", OrderShipped("o-1", "post")),
        ]
    async with a2trio.Server(shop.cart, store=memory(clock=a2trio.TrioClock())) as server:
        answer = await server.actor("c").call("add", {"item": "book"})
        assert answer == a2trio.ActorState(Cart(("book",)), 1)


async def test_the_harness_takes_typed_registrations_across_restarts(
    autojump_clock: trio.abc.Clock, a2_app: AppFactory
) -> None:
    app = await a2_app(shop.orders, handlers=[a2trio.on(shop.placed, shop.ship)])
    await app.restart()
    await app.session("o-2").append(shop.placed(OrderPlaced("o-2")))
    await app.settle()
    await app.assert_log("o-2", ["placed", "shipped"])


# -- registration checked at construction ----------------------------------------


async def _for_placed(ctx: a2trio.HandlerContext[OrderPlaced]) -> None:
    return None


async def _for_either(ctx: a2trio.HandlerContext[OrderPlaced | OrderShipped]) -> None:
    return None


async def _for_anything(ctx: a2trio.HandlerContext[Any]) -> None:
    return None


async def _bare(ctx: a2trio.HandlerContext) -> None:  # type: ignore[type-arg]
    return None


async def _unresolvable(
    ctx: a2trio.HandlerContext[Missing],  # type: ignore[name-defined]  # noqa: F821
) -> None:
    return None


def test_a_handler_annotated_for_another_event_is_refused() -> None:
    orders = shop.orders
    with pytest.raises(TypeError) as info:
        a2trio.Server(orders, store=memory(), handlers={"shipped": _for_placed})
    assert str(info.value) == (
        "handler _for_placed is annotated HandlerContext[OrderPlaced], but event type "
        "'shipped' of contract 'orders' carries OrderShipped"
    )
    with pytest.raises(TypeError, match=r"annotated HandlerContext\[OrderPlaced\], but event type"):
        a2trio.Server(orders, store=memory(), handlers={"shipped": a2trio.handler(_for_placed)})
    # on() checks the annotation against the handle at once.
    with pytest.raises(TypeError) as info:
        a2trio.on(shop.shipped, _for_placed)  # type: ignore[arg-type]
    assert str(info.value) == (
        "handler _for_placed is annotated HandlerContext[OrderPlaced], but event type "
        "'shipped' carries OrderShipped"
    )


def test_what_the_registration_check_lets_through() -> None:
    handlers: dict[str, Callable[..., Awaitable[Any]]] = {
        "placed": _for_either,
        "shipped": _for_anything,
        "cancelled": _bare,
    }
    a2trio.Server(shop.orders, store=memory(), handlers=handlers)
    # A name that does not resolve is skipped, not an error.
    a2trio.Server(shop.orders, store=memory(), handlers={"shipped": _unresolvable})

    class Local(msgspec.Struct):
        x: int

    async def local(ctx: a2trio.HandlerContext[Local]) -> None:
        return None

    # Under `from __future__ import annotations` a local class cannot be resolved.
    a2trio.Server(shop.orders, store=memory(), handlers={"shipped": local})


def test_annotations_that_are_objects_are_read_too() -> None:
    async def handler(ctx: Any) -> None:
        return None

    handler.__annotations__ = {"ctx": a2trio.HandlerContext[OrderPlaced]}
    with pytest.raises(
        TypeError, match=r"annotated HandlerContext\[OrderPlaced\].* carries OrderShipped"
    ):
        a2trio.Server(shop.orders, store=memory(), handlers={"shipped": handler})


def test_on_registrations_are_checked_against_the_contract() -> None:
    other = a2trio.event_type("placed", OrderShipped)
    with pytest.raises(TypeError) as info:
        a2trio.Server(shop.orders, store=memory(), handlers=[a2trio.on(other, _for_anything)])
    assert str(info.value) == (
        "handler _for_anything is registered with a2trio.on for EventType('placed', "
        "OrderShipped), but contract 'orders' declares 'placed' with OrderPlaced"
    )
    unknown = a2trio.event_type("refunded", OrderPlaced)
    with pytest.raises(TypeError, match="has no event type 'refunded'"):
        a2trio.Server(shop.orders, store=memory(), handlers=[a2trio.on(unknown, _for_placed)])
    with pytest.raises(ValueError, match=r"^two handlers for event type 'placed': "):
        a2trio.Server(
            shop.orders,
            store=memory(),
            handlers=[a2trio.on(shop.placed, _for_placed), a2trio.on(shop.placed, _for_either)],
        )
    with pytest.raises(TypeError, match=r"^a list of handlers holds a2trio.on\(event_type, fn\)"):
        a2trio.Server(shop.orders, store=memory(), handlers=[a2trio.handler(_for_placed)])
    with pytest.raises(
        TypeError, match=r"registered with a2trio\.on for 'placed' but keyed 'shipped'"
    ):
        a2trio.Server(
            shop.orders, store=memory(), handlers={"shipped": a2trio.on(shop.placed, _for_placed)}
        )
    with pytest.raises(TypeError, match=r"^on\(\) takes an a2trio.event_type"):
        a2trio.on("placed", _for_placed)  # type: ignore[arg-type]


def test_abort_on_and_emits_take_handles() -> None:
    spec = a2trio.on(shop.placed, _for_placed, abort_on={shop.cancelled: True, "shipped": False})
    assert spec.abort_on == {"cancelled": True}
    assert a2trio.handler(_for_placed, abort_on=[shop.cancelled]).abort_on == {"cancelled": True}
    assert shop.cart.calls["add"].emits == frozenset({"added"})


# -- calls -------------------------------------------------------------------------


def _fold(state: Cart, event: a2trio.Event[ItemAdded]) -> Cart:
    return state


async def _add(state: Cart, input: AddItem) -> None:
    return None


async def _peek(state: int, input: Checkout) -> None:
    return None


def _cart(**calls: a2trio.ActorCall) -> a2trio.Actor[Cart]:
    return a2trio.actor(
        "cart",
        events=[shop.added],
        state=a2trio.Reducer("cart-v1", Cart(), _fold),
        calls=calls,
    )


def test_a_call_function_taking_another_input_is_refused() -> None:
    with pytest.raises(TypeError) as info:
        _cart(checkout=a2trio.call(Checkout, _add))  # type: ignore[arg-type]
    assert str(info.value) == (
        "actor 'cart': call 'checkout' is declared with input Checkout, "
        "but its function _add takes AddItem"
    )
    with pytest.raises(TypeError, match=r"declared with input .*Checkout \| None, but its"):
        _cart(checkout=a2trio.call(Checkout | None, _add))  # type: ignore[arg-type]
    with pytest.raises(TypeError) as info:
        _cart(peek=a2trio.call(Checkout, _peek))
    assert str(info.value) == (
        "actor 'cart': its state is Cart, but the function _peek of call 'peek' "
        "takes a state of int"
    )


def test_what_the_call_check_lets_through() -> None:
    def anything(state: Any, input: Any) -> None:
        return None

    def untyped(state, input):  # type: ignore[no-untyped-def]
        return None

    amount = msgspec.Meta(gt=0)
    _cart(
        add=a2trio.call(AddItem, _add),
        any=a2trio.call(Checkout, anything),
        untyped=a2trio.call(Checkout, untyped),
        annotated=a2trio.call(Annotated[int, amount], anything),
    )


# -- the reading itself -------------------------------------------------------------


class _Base(msgspec.Struct):
    pass


class _Derived(_Base):
    pass


@pytest.mark.parametrize(
    ("annotation", "declared", "expected"),
    [
        (_Base, _Derived, True),
        (_Derived, _Base, False),
        (int, bool, True),
        (float, int, True),
        (complex, float, True),
        (int, float, False),
        (int | None, None, True),
        (int, None, False),
        (int | str, int | str | None, False),
        (object, OrderPlaced, True),
        (list[int], list[str], True),
        (list[int], dict[str, int], False),
        (Annotated[int, "meta"], int, True),
        (int, "not a type", True),
    ],
)
def test_accepts(annotation: Any, declared: Any, expected: bool) -> None:
    assert accepts(annotation, declared) is expected


def test_parameter_annotation_counts_positional_parameters_only() -> None:
    def star(*args: int) -> None:
        return None

    def keyword(*, ctx: int) -> None:
        return None

    class Bound:
        def method(self, ctx: int) -> None:
            return None

    assert parameter_annotation(star, 0) is Any
    assert parameter_annotation(keyword, 0) is Any
    assert parameter_annotation(len, 3) is Any
    assert parameter_annotation(Bound().method, 0) is int
    assert parameter_annotation(iter, 0) is Any  # a builtin without a signature


def test_what_the_reading_cannot_tell_it_accepts() -> None:
    class Callable_:
        def __call__(self, ctx: a2trio.HandlerContext[OrderPlaced]) -> None:
            return None

    # A string annotation on an object's __call__ has no module to resolve in.
    assert parameter_annotation(Callable_(), 0) is Any

    class Strange:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing")

        __hash__ = object.__hash__

    assert accepts(Strange(), int) is True

    class Shaped(Protocol):
        def shape(self) -> str: ...

    # A Protocol that is not runtime-checkable refuses issubclass.
    assert accepts(Shaped, OrderPlaced) is True
