"""Actors: sessions whose writes are calls that the actor accepts or refuses.

An actor is a contract with two more declarations:

* its **state**: a :class:`~a2trio.Reducer` (initial value and fold) over its
  events, the state every call sees and every answer carries;
* its **calls**: each a name, an input type (msgspec) and a function
  ``fn(state, input)`` that returns the events to commit (an
  :class:`~a2trio.AppendInput`, a list of them, or ``None`` for none) or
  raises :class:`Refused`.

Its events are a contract's events: ``a2trio.Server(vault, ...)`` binds it to
a store like any contract, and handlers, lanes, ``abort_on`` and schedules
work on them. Calls run through ``server.actor(id)`` (``actor_calls.py``);
the HTTP routes are ``transport/actor_routes.py``. Construction validates
everything and does no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

from .contract import AppendInput, Contract, Reducer
from .errors import A2Error, ErrorCode

__all__ = ["MAX_CALL_EVENTS", "Actor", "ActorCall", "Refused", "actor", "call"]

S = TypeVar("S")

#: The most events one call commits: a retried call is found by reading at
#: most this many rows after its first one.
MAX_CALL_EVENTS = 1_000

#: What a call function returns: one event, several, or none.
CallResult = AppendInput | list[AppendInput] | tuple[AppendInput, ...] | None
CallFn = Callable[[Any, Any], "CallResult | Awaitable[CallResult]"]


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

    def __init__(self, input_type: Any, fn: CallFn, emits: Iterable[str] | None = None) -> None:
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
        self.emits: frozenset[str] | None = None if emits is None else frozenset(emits)

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
        events: Mapping[str, Any],
        state: Reducer[S],
        calls: Mapping[str, ActorCall],
        presence: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, events, presence)
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


def call(input_type: Any, fn: CallFn, *, emits: Iterable[str] | None = None) -> ActorCall:
    """Declare a call.

    Args:
      input_type: the msgspec type of its input (a Struct, ``int``, ...).
      fn: ``fn(state, input)``, async or not: returns the events to commit
        (``actor.event(...)``, a list of them, or ``None``) or raises
        :class:`Refused`. It must not mutate ``state``, and it runs again on a
        conflict (see ``docs/actors.md``), so it should not act on the world.
      emits: the event types it may return (checked at construction against
        the actor's events, and at run time); default any.

    Raises:
      TypeError: a type msgspec cannot validate, a function that is not callable.
    """
    return ActorCall(input_type, fn, emits)


def actor(
    name: str,
    *,
    events: Mapping[str, Any],
    state: Reducer[S],
    calls: Mapping[str, ActorCall],
    presence: Mapping[str, Any] | None = None,
) -> Actor[S]:
    """Declare an actor: a contract (``events``, optional ``presence``) with a
    state fold and calls.

    Raises:
      TypeError: a bad contract, a ``state`` that is not a Reducer, no calls, a
        call not built with :func:`call`.
      ValueError: a call that emits an undeclared event type.
    """
    return Actor(name, events, state, calls, presence)


for _cls in (Actor, ActorCall, Refused):
    _cls.__module__ = "a2trio"
