"""Contracts: the vocabulary of a session type.

A contract names its event types, each with a msgspec type for the payload,
and optionally presence fields, each with a msgspec type for the value.
Validation is msgspec's: a payload (a dict, or an instance of the declared
type) is encoded to JSON builtins and converted back to the declared type, so
both shapes pass through one path and what is stored is exactly what would be
read back.

An event type may be declared as an :class:`EventType` handle
(:func:`event_type`), typed by its payload: ``placed(OrderPlaced(...))``
builds an append input a type checker verifies, and ``a2trio.on(placed, fn)``
registers a handler whose context it types. A string-keyed mapping of payload
types cannot be typed per key, so the string forms (``orders.event("placed",
...)``) stay unchecked by a type checker; they are checked when they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar, overload

import msgspec

from .errors import A2Error, ErrorCode
from .identifiers import check_event_id
from .signatures import type_name
from .upcasting import Upcaster, Versions

__all__ = [
    "MAX_DEPTH",
    "AppendInput",
    "Contract",
    "Event",
    "EventType",
    "Reducer",
    "contract",
    "event_type",
]

P = TypeVar("P")
S = TypeVar("S")

_NS = "\x1f"

#: The deepest nesting of arrays and objects in a payload or presence value
#: (serde_json's default; Python's own recursion limit would otherwise decide,
#: at a depth that varies with the call stack).
MAX_DEPTH = 128


class AppendInput(msgspec.Struct, frozen=True):
    """One event to append: its type, payload and optional client id.

    Build it with an :class:`EventType` (``placed(OrderPlaced(...))``) or
    :meth:`Contract.event`; either validates the payload at once.
    A client id makes the append idempotent: appending the same ids again
    returns the stored events instead of writing new ones.
    """

    type: str
    payload: Any
    id: str | None = None


class Event(msgspec.Struct, Generic[P], frozen=True):
    """An event read back from a session's log, its payload typed by the contract.

    Attributes:
      id: unique across the store.
      type: the event type.
      payload: decoded to the contract's msgspec type for ``type``: its
        current version, upcast from the one it was stored at (``versions=``).
      index: the 1-based position in the session's log, contiguous.
      session_id: the session (without the contract namespace).
      created_at: when the store wrote it (UTC, from the store's clock).
    """

    id: str
    type: str
    payload: P
    index: int
    session_id: str
    created_at: datetime


class EventType(Generic[P]):
    """One event type, typed by its payload: a handle a type checker follows.

    Build it with :func:`event_type` and declare a contract with it
    (``contract("orders", events=[placed, shipped])``; a contract declared with
    a mapping accepts it too, when it declares the same name and type).
    Calling it builds a validated append input, ``placed(OrderPlaced(...),
    id="c-1")``, and ``a2trio.on(placed, fn)`` registers a handler whose
    ``HandlerContext`` carries the same payload type, so a wrong payload or a
    handler for another event is a type error.

    Attributes:
      name: the event type's name, as stored and as on the wire.
      payload_type: the msgspec type of its payload.
    """

    __slots__ = ("name", "payload_type")

    def __init__(self, name: str, payload_type: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"event type name must be a non-empty string, got {name!r}")
        _check_schema(payload_type, f"event type {name!r}")
        self.name = name
        self.payload_type = payload_type

    def __call__(self, payload: P, *, id: str | None = None) -> AppendInput:
        """Build a validated append input of this type.

        Args:
          payload: an instance of the payload type (a type checker holds you
            to it; at run time anything msgspec converts to it passes).
          id: an optional client id; makes appending it idempotent.

        Raises:
          A2Error: ``INVALID_PAYLOAD`` (``details`` carries msgspec's message
            and the JSON path to the bad field).
          TypeError / ValueError: a bad ``id`` (:mod:`a2trio.identifiers`).
        """
        if id is not None:
            check_event_id(id)
        typed, _ = _convert(self.payload_type, payload, f"event '{self.name}'")
        return AppendInput(self.name, typed, id)

    def __repr__(self) -> str:
        return f"EventType({self.name!r}, {type_name(self.payload_type)})"


class Reducer(Generic[S]):
    """A named fold over a session's events, cached as snapshots.

    Args:
      name: the snapshot key; change it when ``fold`` changes meaning.
      initial: the state before any event. Never mutated: each fold starts
        from a fresh copy.
      fold: ``fold(state, event) -> state``. It may mutate ``state`` in place:
        every ``state()`` call folds a state of its own.
      state_type: the msgspec type the state encodes to and decodes from.
        A cached snapshot that fails to convert to it is rejected and the state
        is refolded from the log. Defaults to ``type(initial)`` when ``initial``
        is a msgspec Struct; otherwise snapshots are trusted as JSON values.
    """

    def __init__(
        self,
        name: str,
        initial: S,
        fold: Callable[[S, Event[Any]], S],
        state_type: type[S] | Any | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"reducer name must be a non-empty string, got {name!r}")
        if not callable(fold):
            raise TypeError(f"reducer fold must be callable, got {fold!r}")
        self.name = name
        self.initial = initial
        self.fold = fold
        if state_type is None and isinstance(initial, msgspec.Struct):
            state_type = type(initial)
        self.state_type = state_type

    def fresh(self) -> S:
        """A copy of ``initial`` that a fold may mutate safely."""
        initial = self.initial
        if isinstance(initial, int | float | str | bool | type(None)):
            return initial
        builtins = msgspec.to_builtins(initial)
        target = self.state_type if self.state_type is not None else type(initial)
        try:
            return msgspec.convert(builtins, target)
        except (msgspec.ValidationError, TypeError):
            return initial

    def __repr__(self) -> str:
        return f"Reducer({self.name!r})"


def _check_schema(schema: Any, what: str) -> None:
    try:
        msgspec.inspect.type_info(schema)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} has type {schema!r}, which msgspec cannot validate: {exc}"
        ) from None


def _declared_events(
    name: str, events: Mapping[str, Any] | Iterable[EventType[Any]]
) -> dict[str, Any]:
    """A contract's ``events=``, a mapping or a list of handles, as name -> type."""
    if isinstance(events, Mapping):
        declared = dict(events)
    else:
        declared = {}
        for handle in events:
            if not isinstance(handle, EventType):
                raise TypeError(
                    f"contract {name!r}: events= takes a mapping of event type -> payload "
                    f"type or a list of a2trio.event_type(...) handles, got {handle!r} in a list"
                )
            if handle.name in declared:
                raise ValueError(f"contract {name!r} declares event type {handle.name!r} twice")
            declared[handle.name] = handle.payload_type
    if not declared:
        raise TypeError(f"contract {name!r} needs at least one event type")
    return declared


def _path_details(exc: msgspec.ValidationError) -> dict[str, str]:
    message = str(exc)
    path = "$"
    marker = " - at `"
    if marker in message:
        message, _, rest = message.partition(marker)
        path = rest.rstrip("`")
    return {"message": message, "path": path}


class Contract:
    """A named set of event types (and presence fields) with msgspec schemas.

    Create one with :func:`contract`. Construction validates the declaration
    and does no I/O.

    Attributes:
      name: the contract's name.
      events: event type -> the msgspec type of its payload (its current version).
      presence: presence field -> the msgspec type of its value.
      versions: the declared payload versions and their upcasters
        (:mod:`a2trio.upcasting`).
    """

    def __init__(
        self,
        name: str,
        events: Mapping[str, Any] | Iterable[EventType[Any]],
        presence: Mapping[str, Any] | None = None,
        *,
        versions: Mapping[Any, Sequence[Any]] | None = None,
        upcasters: Mapping[Any, Sequence[Upcaster]] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"contract name must be a non-empty string, got {name!r}")
        if _NS in name or "/" in name:
            raise ValueError(f"contract name {name!r} must not contain '/' or U+001F")
        declared = _declared_events(name, events)
        for kind, label in ((declared, "event type"), (presence or {}, "presence field")):
            for key, schema in kind.items():
                if not isinstance(key, str) or not key:
                    raise TypeError(
                        f"contract {name!r}: {label} {key!r} must be a non-empty string"
                    )
                _check_schema(schema, f"contract {name!r}: {label} {key!r}")
        self.name = name
        self.events: dict[str, Any] = declared
        self.presence: dict[str, Any] = dict(presence or {})
        self.versions = Versions(name, declared, versions, upcasters)

    @property
    def declares_presence(self) -> bool:
        """Whether the contract declares any presence field."""
        return bool(self.presence)

    def event(self, type: str, payload: Any, id: str | None = None) -> AppendInput:
        """Build a validated append input.

        Args:
          type: a declared event type.
          payload: a dict (or any value) msgspec converts to the declared type,
            or an instance of it.
          id: an optional client id; makes appending it idempotent.

        Raises:
          A2Error: ``UNKNOWN_EVENT_TYPE`` or ``INVALID_PAYLOAD`` (``details``
            carries msgspec's message and the JSON path to the bad field).
          TypeError: ``id`` is given but is not a non-empty string.
          ValueError: ``id`` is too long or holds a control character
            (:mod:`a2trio.identifiers`).
        """
        if id is not None:
            check_event_id(id)
        typed, _ = self.validate(type, payload)
        return AppendInput(type, typed, id)

    def validate(self, type: str, payload: Any) -> tuple[Any, Any]:
        """Validate ``payload`` for ``type``: return (typed value, JSON builtins)."""
        schema = self.events.get(type) if isinstance(type, str) else None
        if schema is None:
            raise A2Error(
                ErrorCode.UNKNOWN_EVENT_TYPE,
                f"contract '{self.name}' has no event type {type!r}",
            )
        return self.convert(schema, payload, f"event '{type}'")

    def validate_presence(self, field: str, value: Any) -> Any:
        """Validate a presence value; return its JSON builtins."""
        schema = self.presence.get(field)
        if schema is None:
            raise A2Error(
                ErrorCode.UNKNOWN_PRESENCE_FIELD,
                f"contract '{self.name}' has no presence field {field!r}",
            )
        return self.convert(schema, value, f"presence field '{field}'")[1]

    def decode(self, type: str, payload: Any) -> Any:
        """Convert JSON builtins of the current version (a wire event's
        payload: the server upcast it) back to the declared type (trusted data)."""
        schema = self.events.get(type)
        if schema is None:
            return payload
        return msgspec.convert(payload, schema)

    def upcast(
        self,
        type: str,
        payload: Any,
        version: int | None,
        *,
        session_id: str,
        index: int | None,
        event_id: str,
    ) -> Any:
        """A stored event's payload (JSON builtins, stored at ``version``; None
        is version 1) as the current version of its type: decoded as the type
        of its version, then upcast step by step. A type the contract no longer
        declares passes as the builtins. The location names the event in the
        error (``index`` None: a scheduled event, not yet appended).

        Raises:
          UpcastError: the payload cannot be read as the current version.
        """
        schema = self.events.get(type)
        if schema is None:
            return payload
        if version is None and type not in self.versions.versioned:
            # The common case, inline (it runs once per event read).
            try:
                return msgspec.convert(payload, schema)
            except msgspec.ValidationError:
                pass  # the full path names the event in its error
        return self.versions.upcast(
            schema,
            type,
            payload,
            version,
            contract=self.name,
            session_id=session_id,
            index=index,
            event_id=event_id,
        )

    def decode_presence(self, field: str, value: Any) -> Any:
        """Convert a stored presence value back to the declared type."""
        schema = self.presence.get(field)
        if schema is None or value is None:
            return value
        return msgspec.convert(value, schema)

    def convert(self, schema: Any, payload: Any, what: str) -> tuple[Any, Any]:
        """Validate ``payload`` against any msgspec type ``schema`` by the
        payload rules (no U+0000, at most :data:`MAX_DEPTH` deep): return
        (typed value, JSON builtins). ``what`` names it in the message.

        Raises:
          A2Error: ``INVALID_PAYLOAD``, ``details`` with msgspec's message and path.
        """
        return _convert(schema, payload, f"{what} on contract '{self.name}'")

    def __repr__(self) -> str:
        return f"Contract({self.name!r}, events={sorted(self.events)})"


def _convert(schema: Any, payload: Any, what: str) -> tuple[Any, Any]:
    """Validate ``payload`` against the msgspec type ``schema`` by the payload
    rules (no U+0000, at most :data:`MAX_DEPTH` deep): return (typed value,
    JSON builtins). ``what`` names it in the message ("event 'placed' on
    contract 'orders'").

    Raises:
      A2Error: ``INVALID_PAYLOAD``, ``details`` with msgspec's message and path.
    """
    try:
        builtins = msgspec.to_builtins(payload)
        _check_storable(builtins)
        typed = msgspec.convert(builtins, schema)
    except _Unstorable as exc:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"invalid payload for {what}: {exc}",
            {"message": str(exc), "path": exc.path},
        ) from None
    except RecursionError:
        message = f"nested deeper than {MAX_DEPTH} levels"
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"invalid payload for {what}: {message}",
            {"message": message, "path": "$"},
        ) from None
    except msgspec.ValidationError as exc:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"invalid payload for {what}: {exc}",
            _path_details(exc),
        ) from None
    except TypeError as exc:
        raise A2Error(
            ErrorCode.INVALID_PAYLOAD,
            f"invalid payload for {what}: {exc}",
            {"message": str(exc), "path": "$"},
        ) from None
    return typed, builtins


class _Unstorable(ValueError):
    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def _check_storable(value: Any) -> None:
    """Refuse what not every store keeps faithfully: a NUL in a string or a key
    (PostgreSQL's jsonb cannot hold U+0000), and nesting deeper than
    :data:`MAX_DEPTH`. Iterative, so depth costs no Python stack; the path is
    built only for the error."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if type(item) is str:
            if "\x00" in item:
                raise _Unstorable("strings may not contain U+0000", _path(path))
        elif type(item) is dict:
            if depth >= MAX_DEPTH:
                raise _Unstorable(f"nested deeper than {MAX_DEPTH} levels", _path(path))
            for key, child in item.items():
                if "\x00" in key:
                    raise _Unstorable("keys may not contain U+0000", _path(path))
                if type(child) in (str, dict, list):
                    stack.append((child, depth + 1, (*path, key)))
        elif type(item) is list:
            if depth >= MAX_DEPTH:
                raise _Unstorable(f"nested deeper than {MAX_DEPTH} levels", _path(path))
            stack.extend(
                (child, depth + 1, (*path, n))
                for n, child in enumerate(item)
                if type(child) in (str, dict, list)
            )


def _path(parts: tuple[str | int, ...]) -> str:
    """msgspec's spelling of a location: ``$.groups[1]``."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def contract(
    name: str,
    events: Mapping[str, Any] | Iterable[EventType[Any]],
    presence: Mapping[str, Any] | None = None,
    *,
    versions: Mapping[Any, Sequence[Any]] | None = None,
    upcasters: Mapping[Any, Sequence[Upcaster]] | None = None,
) -> Contract:
    """Declare a contract.

    Args:
      name: the contract's name; namespaces its sessions in a shared store and
        names its HTTP mount.
      events: the :func:`event_type` handles of its event types (the typed
        form), or a mapping event type -> msgspec type of its payload.
      presence: presence field -> msgspec type of its value (optional).
      versions: event type (name or handle) -> its payload types, oldest
        first; the last is its payload type in ``events`` (optional; see
        :mod:`a2trio.upcasting`). Stored events are read as the current one.
      upcasters: event type -> one function per version step, each taking a
        value of version ``n`` and returning version ``n + 1``.

    Raises:
      TypeError: an empty name, no events, a type msgspec cannot validate,
        an upcaster that is not callable.
      ValueError: a list of handles that names one event type twice; versions
        of an undeclared type or whose last type is not its payload type; a
        missing or extra upcaster.
    """
    return Contract(name, events, presence, versions=versions, upcasters=upcasters)


@overload
def event_type(name: str, payload_type: type[P]) -> EventType[P]: ...
@overload
def event_type(name: str, payload_type: None) -> EventType[None]: ...
@overload
def event_type(name: str, payload_type: object) -> EventType[Any]: ...
def event_type(name: str, payload_type: Any) -> EventType[Any]:
    """Declare an event type: its name and the msgspec type of its payload.

    ``placed = a2trio.event_type("placed", OrderPlaced)`` is an
    ``EventType[OrderPlaced]``. A payload type that is not a class (a union,
    an inline ``Annotated``) gives an ``EventType[Any]``; annotate the
    variable to keep it typed: ``moved: EventType[A | B] = event_type("moved", A | B)``.

    Raises:
      TypeError: an empty name or a type msgspec cannot validate.
    """
    return EventType(name, payload_type)


for _cls in (AppendInput, Contract, Event, EventType, Reducer):
    _cls.__module__ = "a2trio"
