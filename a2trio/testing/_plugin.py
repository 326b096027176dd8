"""The pytest plugin: fixtures for testing an a2trio app, and a guard on trio tests.

Registered through the ``pytest11`` entry point (``pip install a2trio[testing]``),
so the fixtures are available in every test session without a conftest.

The guard: pytest-trio (0.8) runs a test's body in a nursery it cancels as the
body ends, and that cancellation absorbs a ``trio.Cancelled`` the body let out.
So a body cancelled by a scope that no longer encloses it (a store's or a
fixture's nursery entered in ``__aenter__`` and cancelled early) ends mid-way
and is reported *passed*. Each trio test's body is wrapped: a ``Cancelled``
(or a group of nothing else) escaping it, while pytest-trio itself is not
cancelling the test, fails the test with :class:`CancelledFromOutside`, which
names the cancellation's source, reason and task; a body that never returned
fails too. The ini option ``a2trio_fail_cancelled_tests = false`` turns it off.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from typing import Any

import pytest
import trio

from ..clock import TrioClock
from ..contract import Contract
from ..engine.handlers import Handlers
from ..push import ValidatePush
from ..stores.base import Store
from ..timings import DEFAULT_TIMINGS, Timings
from ._harness import Harness, SchedulerFactory, local_scheduler, open_harness
from ._telemetry import RecordingTelemetry

__all__ = [
    "AppFactory",
    "CancelledFromOutside",
    "a2_app",
    "a2_clock",
    "a2_telemetry",
    "pytest_addoption",
    "pytest_runtest_call",
]

_INI = "a2trio_fail_cancelled_tests"
#: Set on a test's item by the guard when the body returned (or raised).
_ENDED = pytest.StashKey[bool]()
#: The attribute that marks a body already wrapped (a Hypothesis test with
#: ``parametrize`` reuses one inner test).
_GUARDED = "_a2trio_guarded"


class CancelledFromOutside(Exception):
    """A trio test's body was cancelled by a cancel scope that no longer
    enclosed it, so it ended without finishing (pytest-trio would report it
    passed). The message names who cancelled it; ``__cause__`` is the
    ``Cancelled``, with the traceback of where the body was."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        _INI,
        "fail a trio test whose body was cancelled from outside its own cancel "
        "scopes, or never returned (pytest-trio reports it passed)",
        type="bool",
        default=True,
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Wrap a trio test's body before pytest-trio wraps it in its runner
    (``tryfirst``: this wrapper's first half runs before pytest-trio's), and
    fail a test whose wrapped body never ended."""
    guarded = _guard(item)
    result = yield
    if guarded and not item.stash.get(_ENDED, False):
        raise CancelledFromOutside(
            "the test's body never returned, and nothing reported why "
            "(its cancellation was absorbed before it reached the test)"
        )
    return result


def _guard(item: pytest.Item) -> bool:
    """Wrap the body of a trio test ``item``; whether it is wrapped."""
    if not isinstance(item, pytest.Function) or item.get_closest_marker("trio") is None:
        return False
    if not item.config.getini(_INI):
        return False
    hypothesis = getattr(item.obj, "hypothesis", None)
    body = item.obj if hypothesis is None else hypothesis.inner_test
    if getattr(body, _GUARDED, False):
        return False
    if not inspect.iscoroutinefunction(body):
        return False  # pytest-trio fails it: "marked trio but is not async"
    guarded = _guarded(item, body)
    if hypothesis is None:
        item.obj = guarded
    else:
        hypothesis.inner_test = guarded
    item.stash[_ENDED] = False
    return True


def _guarded(
    item: pytest.Item, body: Callable[..., Coroutine[Any, Any, object]]
) -> Callable[..., Coroutine[Any, Any, object]]:
    @functools.wraps(body)
    async def guarded(*args: Any, **kwargs: Any) -> object:
        __tracebackhide__ = True
        try:
            result = await body(*args, **kwargs)
        except BaseException as exc:
            item.stash[_ENDED] = True
            cancelled = _only_cancelled(exc)
            # Cancelled by pytest-trio itself (a fixture crashed): it reports why.
            if cancelled is None or trio.current_effective_deadline() == -math.inf:
                raise
            raise CancelledFromOutside(
                f"the test's body was cancelled from outside its own cancel scopes, "
                f"{cancelled} (a cancel scope that no longer encloses the body: "
                f"a nursery entered by a context manager or a fixture, cancelled "
                f"while the body ran); the traceback below shows where it was"
            ) from exc
        item.stash[_ENDED] = True
        return result

    setattr(guarded, _GUARDED, True)
    return guarded


def _only_cancelled(exc: BaseException) -> trio.Cancelled | None:
    """``exc`` if it is a ``Cancelled``, the first one if it is a group of
    nothing but ``Cancelled``; otherwise ``None``."""
    if isinstance(exc, trio.Cancelled):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        cancelled, rest = exc.split(trio.Cancelled)
        if cancelled is not None and rest is None:
            leaf: BaseException = cancelled
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            assert isinstance(leaf, trio.Cancelled)
            return leaf
    return None


class AppFactory:
    """What the ``a2_app`` fixture gives a test: ``await a2_app(contract, ...)``
    opens a :class:`Harness`, closed when the test ends.

    Each harness lives in the fixture's nursery (pytest-trio runs fixtures in
    their own tasks), so several may be open in one test.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def __call__(
        self,
        contract: Contract,
        *,
        handlers: Handlers | None = None,
        store: Store | None = None,
        scheduler: SchedulerFactory | None = local_scheduler,
        telemetry: RecordingTelemetry | None = None,
        timings: Timings = DEFAULT_TIMINGS,
        validate_push: ValidatePush | None = None,
        presence_ttl_ms: int | None = None,
    ) -> Harness:
        """Open a harness; the arguments are :func:`open_harness`'s.

        Cancellation: a checkpoint; if cancelled, no harness was opened.
        """

        async def host(*, task_status: trio.TaskStatus[Harness] = trio.TASK_STATUS_IGNORED) -> None:
            async with open_harness(
                contract,
                handlers=handlers,
                store=store,
                scheduler=scheduler,
                telemetry=telemetry,
                timings=timings,
                validate_push=validate_push,
                presence_ttl_ms=presence_ttl_ms,
            ) as harness:
                task_status.started(harness)
                await trio.sleep_forever()

        harness: Harness = await self._nursery.start(host)
        return harness


@pytest.fixture
async def a2_app() -> AsyncIterator[AppFactory]:
    """A factory: ``app = await a2_app(contract, handlers={...})`` runs your contract
    and handlers on a memory store, a local scheduler and a ``TrioClock``, and
    closes them when the test ends. Take ``autojump_clock`` in the test too."""
    async with trio.open_nursery() as nursery:
        yield AppFactory(nursery)
        nursery.cancel_scope.cancel(reason="test finished")


@pytest.fixture
def a2_telemetry() -> RecordingTelemetry:
    """A fresh :class:`RecordingTelemetry` for a server you build yourself."""
    return RecordingTelemetry()


@pytest.fixture
def a2_clock() -> TrioClock:
    """A :class:`TrioClock` for stores you build yourself (``memory(clock=a2_clock)``)."""
    return TrioClock()
