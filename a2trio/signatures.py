"""What a function's annotations say, read when it is registered.

A handler annotated ``HandlerContext[OrderPlaced]`` registered for an event
carrying ``OrderShipped``, or a call function taking ``AddItem`` for a call
declared with ``Checkout``, would fail only when it runs (an
``AttributeError`` that dead-letters the event). ``engine/handlers.py`` and
``actor.py`` read the annotation here and refuse the mismatch at
construction instead.

This is a guard for the plain mistake, not a second type checker: it reads
annotations as ``typing.get_type_hints`` does (string annotations under
``from __future__ import annotations`` are resolved in the function's module)
and treats whatever it cannot read as ``Any``, which accepts everything: a
missing annotation, one that does not resolve (a name imported only under
``TYPE_CHECKING``, a class local to a function), a type variable, a
parameterised generic it cannot compare.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Union

__all__ = ["accepts", "parameter_annotation", "return_annotation", "type_name"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

#: The numeric promotions type checkers allow (PEP 484): an ``int`` is
#: accepted where a ``float`` is annotated, and both where a ``complex`` is.
_PROMOTIONS: dict[type, tuple[type, ...]] = {float: (int,), complex: (int, float)}


def parameter_annotation(fn: Callable[..., Any], position: int) -> Any:
    """The resolved annotation of ``fn``'s positional parameter at ``position``
    (0-based, ``self`` of a bound method not counted), or ``Any`` when there is
    none or it cannot be resolved."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return Any
    if position >= len(parameters) or any(
        p.kind not in _POSITIONAL for p in parameters[: position + 1]
    ):
        return Any
    annotation = parameters[position].annotation
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        return _resolve(fn, annotation)
    return annotation


def return_annotation(fn: Callable[..., Any]) -> Any:
    """The resolved return annotation of ``fn`` (for an ``async def``, the
    awaited value's), or ``Any`` when there is none or it cannot be resolved."""
    try:
        annotation = inspect.signature(fn).return_annotation
    except (TypeError, ValueError):
        return Any
    if annotation is inspect.Signature.empty:
        return Any
    if isinstance(annotation, str):
        return _resolve(fn, annotation)
    return annotation


def _resolve(fn: Callable[..., Any], annotation: str) -> Any:
    """Evaluate a string annotation in the module that defined ``fn``, as
    ``typing.get_type_hints`` does, for this one annotation only (another
    parameter's unresolvable annotation must not hide this one)."""
    target: Any = inspect.unwrap(fn)
    target = getattr(target, "__func__", target)
    namespace = getattr(target, "__globals__", None)
    if not isinstance(namespace, dict):
        return Any

    def probe() -> None: ...

    probe.__annotations__ = {"value": annotation}
    try:
        return typing.get_type_hints(probe, globalns=namespace, include_extras=True)["value"]
    except Exception:  # any failure to evaluate user code means "cannot tell"
        return Any


def accepts(annotation: Any, declared: Any) -> bool:
    """Whether a value of type ``declared`` may be passed where ``annotation``
    is expected. False only when both are classes (or unions of them, or
    ``None``) and some member of ``declared`` is a subclass of no member of
    ``annotation``; True whenever it cannot tell."""
    annotation, declared = _bare(annotation), _bare(declared)
    try:
        if annotation is Any or annotation is object or annotation == declared:
            return True
    except Exception:  # an annotation object whose __eq__ raises: cannot tell
        return True
    taken, offered = _classes(annotation), _classes(declared)
    if taken is None or offered is None or object in taken:
        return True
    try:
        return all(
            any(issubclass(d, t) or d in _PROMOTIONS.get(t, ()) for t in taken) for d in offered
        )
    except TypeError:  # a non-runtime Protocol refuses issubclass: cannot tell
        return True


def _bare(value: Any) -> Any:
    """``value`` without ``Annotated[...]`` metadata, ``None`` as its class."""
    while typing.get_origin(value) is Annotated:
        value = value.__origin__
    return type(None) if value is None else value


def _classes(value: Any) -> list[type] | None:
    """The classes a type is made of (a union's members; a generic alias's
    origin class), or None if any part is not a class (``Any``, a type
    variable, a ``Literal``)."""
    members = (
        typing.get_args(value) if typing.get_origin(value) in (Union, types.UnionType) else (value,)
    )
    classes: list[type] = []
    for member in members:
        member = _bare(member)
        origin = typing.get_origin(member)
        if isinstance(origin, type):
            member = origin
        if not isinstance(member, type):
            return None
        classes.append(member)
    return classes


def type_name(value: Any) -> str:
    """A type as a message names it: ``OrderPlaced``, ``int | None``, ``list[int]``."""
    if isinstance(value, type):
        return value.__qualname__
    return repr(value).replace("typing.", "")
