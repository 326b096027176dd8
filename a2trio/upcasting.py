"""Schema versions of event payloads, and the upcasters between them.

Payload types change; stored events do not. A contract declares the versions
of an event type's payload, oldest first, and one upcaster per step::

    orders = a2trio.contract(
        "orders",
        events={"ordered": Ordered},
        versions={"ordered": [OrderedV1, Ordered]},
        upcasters={"ordered": [lambda old: Ordered(old.item, quantity=1)]},
    )

Version ``n`` is the ``n``-th type of the list (from 1); the last is the event
type's payload type, its current version. Every append stores the current
version with the event (a store writes None for version 1, so every event
written before versions existed reads as version 1). Every read of a stored
event (history, handlers, feeds, states and snapshots, actor calls,
inspection) decodes its payload as the type of its stored version and runs the
upcasters from there to the current version: the engine never hands out an
older struct. An upcaster takes the previous version's value (an instance of
its type) and returns the next version's (an instance, or anything msgspec
converts to it, such as a dict). It runs on every read of an old event, so it
is a pure function of its input.

This module holds the declaration (:class:`Versions`, checked once, at the
contract's construction) and the read (:meth:`Versions.upcast`); the error an
event that cannot be read raises is :class:`UpcastError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from .signatures import type_name

__all__ = ["UpcastError", "Upcaster", "Versions"]

#: One step: the value of version ``n`` to the value of version ``n + 1``.
Upcaster = Callable[[Any], Any]


class UpcastError(Exception):
    """A stored event whose payload cannot be read as its type's current version.

    Raised where the event is read: a history or state read, a feed (to its
    reader), an actor call; a handler's attempt on it fails with it, and is
    dead-lettered at once (reading it again gives the same answer), so the
    operator fixes the upcaster (or the data) and redrives it. Over HTTP it is
    an unexpected failure: logged, and answered as a retryable 503.

    Attributes:
      contract: the contract's name.
      session_id: the session (without the contract namespace).
      index: the event's index in its session; None for a scheduled event
        (a delayed append queued by an older release), read when it is delivered.
      event_id: the event's id.
      type: its event type.
      version: the version it is stored at (1 for an event stored without one).
      current: the type's current version.
      reason: what went wrong (the upcaster's exception is also ``__cause__``).
    """

    def __init__(
        self,
        *,
        contract: str,
        session_id: str,
        index: int | None,
        event_id: str,
        type: str,
        version: int,
        current: int,
        reason: str,
    ) -> None:
        self.contract = contract
        self.session_id = session_id
        self.index = index
        self.event_id = event_id
        self.type = type
        self.version = version
        self.current = current
        self.reason = reason
        where = (
            f"event {index} ({event_id!r})"
            if index is not None
            else f"scheduled event {event_id!r}"
        )
        super().__init__(
            f"{where} of session {session_id!r} on contract "
            f"{contract!r}: a {type!r} event stored at version {version} cannot be read "
            f"as version {current}: {reason}"
        )


class _Failed(Exception):
    """Why an upcast failed, before the row's location is known."""


class _Chain:
    """One event type's versions (``types[n - 1]`` is version ``n``) and its
    upcasters (``steps[n - 1]`` takes version ``n`` to ``n + 1``)."""

    __slots__ = ("steps", "types")

    def __init__(self, types: tuple[Any, ...], steps: tuple[Upcaster, ...]) -> None:
        self.types = types
        self.steps = steps

    def read(self, payload: Any, version: int) -> Any:
        """The stored ``payload`` of ``version``, upcast to the current version."""
        current = len(self.types)
        if not 1 <= version <= current:
            raise _Failed(
                f"the contract declares versions 1 to {current}"
                + (" (was it written by a newer deployment?)" if version > current else "")
            )
        schema = self.types[version - 1]
        try:
            value = msgspec.convert(payload, schema)
        except msgspec.ValidationError as exc:
            raise _Failed(
                f"its payload is not a version {version} ({type_name(schema)}): {exc}"
            ) from None
        for step in range(version, current):
            try:
                value = self.steps[step - 1](value)
            except Exception as exc:
                raise _Failed(
                    f"the upcaster from version {step} to {step + 1} raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            value = _as(value, self.types[step], step)
        return value


def _as(value: Any, schema: Any, step: int) -> Any:
    """An upcaster's result as the next version's type: an instance passes as
    it is; anything else is converted through its JSON builtins."""
    if isinstance(schema, type) and type(value) is schema:
        return value
    try:
        return msgspec.convert(msgspec.to_builtins(value), schema)
    except (msgspec.ValidationError, TypeError) as exc:
        raise _Failed(
            f"the upcaster from version {step} to {step + 1} returned {value!r:.200}, "
            f"which is not a {type_name(schema)}: {exc}"
        ) from None


def _named(key: Any, what: str, contract: str) -> str:
    # An event type's handle names its type, as in events=.
    name = getattr(key, "name", key)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"contract {contract!r}: {what} keys are event type names (or handles), got {key!r}"
        )
    return name


class Versions:
    """A contract's declared versions and upcasters, checked at construction.

    Args:
      contract: the contract's name (for messages).
      events: the contract's event types, name -> current payload type.
      versions: event type (name or handle) -> its payload types, oldest first.
      upcasters: event type -> one upcaster per step (``len(versions) - 1``).

    Raises:
      TypeError: a mapping or list of the wrong kind, a type msgspec cannot
        validate, an upcaster that is not callable.
      ValueError: an undeclared event type; a version list that is empty or
        whose last type is not the event type's payload type; upcasters for a
        type without versions; a missing or extra upcaster.
    """

    __slots__ = ("_chains", "versioned")

    def __init__(
        self,
        contract: str,
        events: Mapping[str, Any],
        versions: Mapping[Any, Sequence[Any]] | None,
        upcasters: Mapping[Any, Sequence[Upcaster]] | None,
    ) -> None:
        declared = _versions(contract, events, versions)
        steps = _upcasters(contract, declared, upcasters)
        self._chains = {
            name: _Chain(types, steps.get(name, ()))
            for name, types in declared.items()
            if len(types) > 1
        }
        #: The event types with more than one version.
        self.versioned = frozenset(self._chains)

    def current(self, type: str) -> int:
        """The current version of ``type``'s payload (1 for a type without versions)."""
        chain = self._chains.get(type)
        return 1 if chain is None else len(chain.types)

    def stored(self, type: str) -> int | None:
        """What an append stores as ``type``'s version: None for version 1."""
        chain = self._chains.get(type)
        return None if chain is None else len(chain.types)

    def upcast(
        self,
        schema: Any,
        type: str,
        payload: Any,
        version: int | None,
        *,
        contract: str,
        session_id: str,
        index: int | None,
        event_id: str,
    ) -> Any:
        """A stored payload as the current version of ``type`` (``schema``).

        Raises:
          UpcastError: the payload does not match its stored version's type, an
            upcaster raised or returned something else than the next version,
            or the version is not one the contract declares.
        """
        stored = 1 if version is None else version
        chain = self._chains.get(type)
        try:
            if chain is None:
                if stored != 1:
                    raise _Failed(f"the contract declares no versions of {type!r}")
                try:
                    return msgspec.convert(payload, schema)
                except msgspec.ValidationError as exc:
                    raise _Failed(f"its payload is not a {type_name(schema)}: {exc}") from None
            return chain.read(payload, stored)
        except _Failed as failed:
            raise UpcastError(
                contract=contract,
                session_id=session_id,
                index=index,
                event_id=event_id,
                type=type,
                version=stored,
                current=1 if chain is None else len(chain.types),
                reason=str(failed),
            ) from failed.__cause__


def _versions(
    contract: str, events: Mapping[str, Any], versions: Mapping[Any, Sequence[Any]] | None
) -> dict[str, tuple[Any, ...]]:
    if versions is None:
        return {}
    if not isinstance(versions, Mapping):
        raise TypeError(
            f"contract {contract!r}: versions= takes a mapping of event type -> its payload "
            f"types, oldest first, got {versions!r:.200}"
        )
    declared: dict[str, tuple[Any, ...]] = {}
    for key, types in versions.items():
        name = _named(key, "versions=", contract)
        if name not in events:
            raise ValueError(
                f"contract {contract!r}: versions= names {name!r}, which is not one of its "
                f"event types {sorted(events)}"
            )
        if name in declared:
            raise ValueError(f"contract {contract!r}: versions= names {name!r} twice")
        if isinstance(types, str | bytes) or not isinstance(types, Sequence):
            raise TypeError(
                f"contract {contract!r}: versions[{name!r}] must be a list of payload types, "
                f"oldest first, got {types!r:.200}"
            )
        if not types:
            raise ValueError(f"contract {contract!r}: versions[{name!r}] is empty")
        for n, schema in enumerate(types, 1):
            try:
                msgspec.inspect.type_info(schema)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"contract {contract!r}: version {n} of {name!r} has type {schema!r}, "
                    f"which msgspec cannot validate: {exc}"
                ) from None
        if types[-1] != events[name]:
            raise ValueError(
                f"contract {contract!r}: versions[{name!r}] ends with "
                f"{type_name(types[-1])}, but {name!r} has payload type "
                f"{type_name(events[name])}: the last version is the current one"
            )
        declared[name] = tuple(types)
    return declared


def _upcasters(
    contract: str,
    declared: Mapping[str, tuple[Any, ...]],
    upcasters: Mapping[Any, Sequence[Upcaster]] | None,
) -> dict[str, tuple[Upcaster, ...]]:
    given: Mapping[Any, Any] = {} if upcasters is None else upcasters
    if not isinstance(given, Mapping):
        raise TypeError(
            f"contract {contract!r}: upcasters= takes a mapping of event type -> one "
            f"upcaster per version step, got {given!r:.200}"
        )
    steps: dict[str, tuple[Upcaster, ...]] = {}
    for key, fns in given.items():
        name = _named(key, "upcasters=", contract)
        if name not in declared:
            raise ValueError(
                f"contract {contract!r}: upcasters= names {name!r}, which has no versions= "
                "(declare its payload types, oldest first)"
            )
        if name in steps:
            raise ValueError(f"contract {contract!r}: upcasters= names {name!r} twice")
        if isinstance(fns, str | bytes) or not isinstance(fns, Sequence):
            raise TypeError(
                f"contract {contract!r}: upcasters[{name!r}] must be a list of functions, "
                f"one per version step, got {fns!r:.200}"
            )
        for n, fn in enumerate(fns, 1):
            if not callable(fn):
                raise TypeError(
                    f"contract {contract!r}: the upcaster of {name!r} from version {n} to "
                    f"{n + 1} is not callable: {fn!r:.200}"
                )
        steps[name] = tuple(fns)
    for name, types in declared.items():
        have = len(steps.get(name, ()))
        if have < len(types) - 1:
            raise ValueError(
                f"contract {contract!r}: {name!r} has {len(types)} versions but no upcaster "
                f"from version {have + 1} to {have + 2} (upcasters[{name!r}] takes one "
                "function per step)"
            )
        if have > len(types) - 1:
            raise ValueError(
                f"contract {contract!r}: {name!r} has {len(types)} versions, so "
                f"{len(types) - 1} upcaster step(s), but upcasters[{name!r}] has {have}"
            )
    return steps


UpcastError.__module__ = "a2trio"
