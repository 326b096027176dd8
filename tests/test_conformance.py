"""Every store backend against ``a2trio.stores.conformance``.

Backends live in ``tests/backends/<name>.py`` and expose ``open_store(clock,
ids=None)`` (``ids`` gives them the conformance ``ids`` capability).
A backend whose module is not written yet is skipped with that reason; a
module that exists but fails to import is an error, not a skip.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

from a2trio.stores.conformance import (
    CHECKS,
    REQUIRES,
    UNREACHABLE_CHECKS,
    StoreFactory,
    capabilities,
)

_TESTS = Path(__file__).resolve().parent

BACKENDS = ["memory", "sqlite", "postgres", "redis"]

#: (backend, check name) pairs that fail because the backend is wrong against
#: the seed, each with the bug's location. Strict: a fix turns them into errors.
KNOWN_BUGS: dict[tuple[str, str], str] = {}

Check = Callable[[StoreFactory], Awaitable[None]]


def _cases() -> list[object]:
    return list(_iter_cases())


def _iter_cases() -> Iterator[object]:
    for backend in BACKENDS:
        written = (_TESTS / "backends" / f"{backend}.py").exists()
        for check in CHECKS:
            name = check.__name__.removeprefix("check_")
            marks: list[pytest.MarkDecorator] = []
            if not written:
                marks.append(
                    pytest.mark.skip(
                        reason=f"backend module tests/backends/{backend}.py not written yet"
                    )
                )
            bug = KNOWN_BUGS.get((backend, name))
            if bug is not None:
                marks.append(pytest.mark.xfail(reason=bug, strict=True))
            yield pytest.param(backend, check, marks=marks, id=f"{backend}-{name}")


_capabilities: dict[str, frozenset[str]] = {}


@pytest.fixture
def open_store(backend: str, check: Check) -> StoreFactory:
    """The backend's factory, or a skip naming the capability it lacks.

    Skips here, in a sync fixture, because pytest-trio 0.8 drops the reason of
    a ``pytest.skip`` raised inside an async test.
    """
    factory: StoreFactory = importlib.import_module(f"tests.backends.{backend}").open_store
    if backend not in _capabilities:
        _capabilities[backend] = trio.run(capabilities, factory)
    missing = REQUIRES.get(check.__name__, frozenset()) - _capabilities[backend]
    if missing:
        pytest.skip(f"the {backend} store has no {' / '.join(sorted(missing))} capability")
    return factory


@pytest.mark.parametrize(("backend", "check"), _cases())
async def test_conformance(backend: str, check: Check, open_store: StoreFactory) -> None:
    await check(open_store)


@pytest.fixture
def open_unreachable_store(backend: str) -> StoreFactory:
    """The backend's factory of stores it cannot reach, or a skip (in a sync
    fixture, for the reason, as ``open_store``): the memory store has no
    backend to lose."""
    module = importlib.import_module(f"tests.backends.{backend}")
    factory: StoreFactory | None = getattr(module, "open_unreachable_store", None)
    if factory is None:
        pytest.skip(f"the {backend} store has no backend to be unreachable")
    return factory


@pytest.mark.parametrize(
    "check", UNREACHABLE_CHECKS, ids=lambda c: c.__name__.removeprefix("check_")
)
# The memory store has no backend to lose: not a skip, not a case.
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "memory"])
async def test_unreachable(
    backend: str, check: Check, open_unreachable_store: StoreFactory
) -> None:
    await check(open_unreachable_store)


def test_every_check_is_listed() -> None:
    """A check defined in one of the suite's modules but left out of CHECKS
    would never run; each is importable from the package."""
    from a2trio.stores import conformance

    defined = {
        name
        for module in pkgutil.iter_modules(conformance.__path__)
        for name in vars(importlib.import_module(f"{conformance.__name__}.{module.name}"))
        if name.startswith("check_")
    }
    listed = [*CHECKS, *UNREACHABLE_CHECKS]
    assert defined == {check.__name__ for check in listed}
    assert len(listed) == len(defined)
    assert set(REQUIRES) <= defined
    assert defined <= set(conformance.__all__)
