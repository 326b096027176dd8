"""Actors: sessions whose writes are calls that the actor accepts or refuses.

An actor is a contract with two more declarations:

* its **state**: a :class:`~a2trio.Reducer` (initial value and fold) over its
  events, the state every call sees and every answer carries;
* its **calls**: each a name, an input type (msgspec) and a function
  ``fn(state, input)`` that returns the events to commit (an
  :class:`~a2trio.AppendInput`, a list of them, or ``None`` for none) or
  raises :class:`Refused`. :func:`call` is typed so that a type checker
  holds ``fn``'s input to the declared type, and construction refuses a
  function annotated for another input (or another state) type.

Its events are a contract's events: ``a2trio.Server(vault, ...)`` binds it to
a store like any contract, and handlers, lanes, ``abort_on`` and schedules
work on them. Calls run through ``server.actor(id)`` (``engine/actor_calls.py``);
the HTTP routes are ``transport/server/actors.py``. Construction validates
everything and does no I/O.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import msgspec

from .contract import AppendInput, Contract, EventType, Reducer
from .errors import A2Error, ErrorCode
from .signatures import accepts, parameter_annotation, type_name
from .upcasting import Upcaster

if TYPE_CHECKING:
    from typing import _SpecialForm

__all__ = ["MAX_CALL_EVENTS", "Actor", "ActorCall", "Refused", "actor", "call"]

S = TypeVar("S")
In = TypeVar("In")

#: The most events one call commits: a retried call is found by reading at
#: most this many rows after its first one.
MAX_CALL_EVENTS = 1_000

#: What a call function returns: one event, several, or none.
CallResult = AppendInput | list[AppendInput] | tuple[AppendInput, ...] | None
CallFn = Callable[[Any, Any], "CallResult | Awaitable[CallResult]"]
#: What ``emits=`` takes: event types, by name or handle.
Emits = Iterable[str | EventType[Any]] | None


class Refused(A2Error):
    """Raised by a call function to say no: nothing is committed.

    The caller gets it as raised (``code`` ``CALL_REFUSED``); over HTTP it is
    the error envelope with status 409 and this message.

    Args:
      message: why, for the caller ("insufficient funds").
      details: optional JSON-encodable detail for the envelope.
    """

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(ErrorCode.CALL_REFUSED, message, details)

    def __repr__(self) -> str:
        return f"Refused({self.message!r})"


class ActorCall:
    """One declared call: its input type, its function and the event types it
    may commit. Build it with :func:`call`."""

    __slots__ = ("emits", "fn", "input_type")

    def __init__(self, input_type: Any, fn: CallFn, emits: Emits = None) -> None:
        try:
            msgspec.inspect.type_info(input_type)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"call input type {input_type!r} is not one msgspec can validate: {exc}"
            ) from None
        if not callable(fn):
            raise TypeError(f"call function must be callable, got {fn!r}")
        if isinstance(emits, str):
            raise TypeError(f"call emits= takes a list of event types, got the string {emits!r}")
        self.input_type = input_type
        self.fn = fn
        self.emits: frozenset[str] | None = (
            None
            if emits is None
            else frozenset(e.name if isinstance(e, EventType) else e for e in emits)
        )

    def __repr__(self) -> str:
        return f"ActorCall({self.input_type!r}, {getattr(self.fn, '__name__', self.fn)!r})"


class Actor(Contract, Generic[S]):
    """A contract whose writes are calls (see the module docstring). Create
    one with :func:`actor`.

    Attributes:
      reducer: the state's fold.
      calls: call name -> :class:`ActorCall`.
    """

    def __init__(
        self,
        name: str,
        events: Mapping[str, Any] | Iterable[EventType[Any]],
        state: Reducer[S],
        calls: Mapping[str, ActorCall],
        presence: Mapping[str, Any] | None = None,
        *,
        versions: Mapping[Any, Sequence[Any]] | None = None,
        upcasters: Mapping[Any, Sequence[Upcaster]] | None = None,
    ) -> None:
        super().__init__(name, events, presence, versions=versions, upcasters=upcasters)
        if not isinstance(state, Reducer):
            raise TypeError(f"actor {name!r}: state= takes an a2trio.Reducer, got {state!r}")
        if not isinstance(calls, Mapping) or not calls:
            raise TypeError(f"actor {name!r} needs at least one call")
        for call_name, spec in calls.items():
            if not isinstance(call_name, str) or not call_name:
                raise TypeError(
                    f"actor {name!r}: call name {call_name!r} must be a non-empty string"
                )
            if not isinstance(spec, ActorCall):
                raise TypeError(
                    f"actor {name!r}: call {call_name!r} must be built with a2trio.call(), "
                    f"got {spec!r}"
                )
            for type_ in sorted(spec.emits or ()):
                if type_ not in self.events:
                    raise ValueError(
                        f"actor {name!r}: call {call_name!r} emits {type_!r}, "
                        f"which is not one of its event types {sorted(self.events)}"
                    )
            _check_signature(name, call_name, spec, state.state_type)
        self.reducer: Reducer[S] = state
        self.calls: dict[str, ActorCall] = dict(calls)

    def input_of(self, call_name: str, input: Any) -> tuple[ActorCall, Any]:
        """The declared call and its input converted to the call's type.

        Raises:
          A2Error: ``UNKNOWN_EVENT_TYPE`` for an undeclared call;
            ``INVALID_PAYLOAD`` for an input its type refuses.
        """
        spec = self.calls.get(call_name) if isinstance(call_name, str) else None
        if spec is None:
            raise A2Error(
                ErrorCode.UNKNOWN_EVENT_TYPE,
                f"actor '{self.name}' has no call {call_name!r:.80}: its calls are "
                f"{sorted(self.calls)}",
            )
        typed, _ = self.convert(spec.input_type, input, f"the input of call '{call_name}'")
        return spec, typed

    def commits(self, call_name: str, result: Any) -> list[AppendInput]:
        """What a call function returned, as the events to commit.

        Raises:
          TypeError: not ``None``, an append input or a list of them; an event
            type outside the call's ``emits``; an event with its own id (a
            call's ids come from the call).
          ValueError: more than :data:`MAX_CALL_EVENTS` events.
        """
        if result is None:
            return []
        items = [result] if isinstance(result, AppendInput) else result
        if not isinstance(items, list | tuple) or not all(
            isinstance(item, AppendInput) for item in items
        ):
            raise TypeError(
                f"call {call_name!r} of actor '{self.name}' must return None, an event built "
                f"with {self.name}.event(...) or a list of them, got {result!r:.200}"
            )
        spec = self.calls[call_name]
        for item in items:
            if spec.emits is not None and item.type not in spec.emits:
                raise TypeError(
                    f"call {call_name!r} of actor '{self.name}' returned a {item.type!r} event "
                    f"but emits only {sorted(spec.emits)}"
                )
            if item.id is not None:
                raise TypeError(
                    f"call {call_name!r} of actor '{self.name}' returned an event with id "
                    f"{item.id!r}: a call's event ids come from the call (its messageId)"
                )
        if len(items) > MAX_CALL_EVENTS:
            raise ValueError(
                f"call {call_name!r} of actor '{self.name}' returned {len(items)} events; "
                f"a call commits at most {MAX_CALL_EVENTS}"
            )
        return list(items)

    def __repr__(self) -> str:
        return f"Actor({self.name!r}, calls={sorted(self.calls)})"


def _check_signature(actor: str, call_name: str, spec: ActorCall, state_type: Any) -> None:
    """Refuse a call function annotated for another input (or state) type
    than the call and the actor declare (:mod:`a2trio.signatures`)."""
    fn_name = getattr(spec.fn, "__qualname__", None) or spec.fn
    taken = parameter_annotation(spec.fn, 1)
    if not accepts(taken, spec.input_type):
        raise TypeError(
            f"actor {actor!r}: call {call_name!r} is declared with input "
            f"{type_name(spec.input_type)}, but its function {fn_name} takes {type_name(taken)}"
        )
    state = parameter_annotation(spec.fn, 0)
    if state_type is not None and not accepts(state, state_type):
        raise TypeError(
            f"actor {actor!r}: its state is {type_name(state_type)}, but the function "
            f"{fn_name} of call {call_name!r} takes a state of {type_name(state)}"
        )


@overload
def call(
    input_type: type[In],
    fn: Callable[[Any, In], CallResult | Awaitable[CallResult]],
    *,
    emits: Emits = None,
) -> ActorCall: ...
@overload
def call(
    input_type: None,
    fn: Callable[[Any, None], CallResult | Awaitable[CallResult]],
    *,
    emits: Emits = None,
) -> ActorCall: ...
@overload
def call(
    input_type: types.UnionType | _SpecialForm, fn: CallFn, *, emits: Emits = None
) -> ActorCall: ...
def call(input_type: Any, fn: CallFn, *, emits: Emits = None) -> ActorCall:
    """Declare a call.

    Typed: for a class input type (a Struct, ``int``) or ``None``, a type
    checker holds ``fn``'s input parameter to it, so ``call(Checkout,
    add_item)`` with ``add_item(state, input: AddItem)`` is a type error. For a
    union or an inline ``Annotated[...]`` it cannot; the actor's construction
    still refuses a function whose annotation clearly differs.

    Args:
      input_type: the msgspec type of its input (a Struct, ``int``, ...).
      fn: ``fn(state, input)``, async or not: returns the events to commit
        (``actor.event(...)`` or an event type's handle, a list of them, or
        ``None``) or raises :class:`Refused`. It must not mutate ``state``, and
        it runs again on a conflict (see ``docs/actors.md``), so it should not
        act on the world.
      emits: the event types (names or handles) it may return (checked at
        construction against the actor's events, and at run time); default any.

    Raises:
      TypeError: a type msgspec cannot validate, a function that is not callable.
    """
    return ActorCall(input_type, fn, emits)


def actor(
    name: str,
    *,
    events: Mapping[str, Any] | Iterable[EventType[Any]],
    state: Reducer[S],
    calls: Mapping[str, ActorCall],
    presence: Mapping[str, Any] | None = None,
    versions: Mapping[Any, Sequence[Any]] | None = None,
    upcasters: Mapping[Any, Sequence[Upcaster]] | None = None,
) -> Actor[S]:
    """Declare an actor: a contract (``events``, optional ``presence``,
    ``versions`` and ``upcasters`` as in :func:`a2trio.contract`) with a state
    fold and calls: its state folds every event as its current version.

    Raises:
      TypeError: a bad contract, a ``state`` that is not a Reducer, no calls, a
        call not built with :func:`call`, a call function annotated for another
        input type than its call's, or another state type than the reducer's.
      ValueError: a call that emits an undeclared event type.
    """
    return Actor(name, events, state, calls, presence, versions=versions, upcasters=upcasters)


for _cls in (Actor, ActorCall, Refused):
    _cls.__module__ = "a2trio"
