"""The pytest plugin: fixtures for testing an a2trio app.

Registered through the ``pytest11`` entry point (``pip install a2trio[testing]``),
so the fixtures are available in every test session without a conftest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from ..clock import TrioClock
from ..contract import Contract
from ..handlers import Handlers
from ..push import ValidatePush
from ..stores.base import Store
from ..timings import DEFAULT_TIMINGS, Timings
from ._harness import Harness, SchedulerFactory, local_scheduler, open_harness
from ._telemetry import RecordingTelemetry

__all__ = ["AppFactory", "a2_app", "a2_clock", "a2_telemetry"]


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
