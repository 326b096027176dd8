"""Testing a2trio apps: a harness on Trio's mock clock, fault injection, spans.

Imported explicitly (``import a2trio.testing``), never by ``import a2trio``,
because it imports pytest: this module is also the pytest plugin registered
through the ``pytest11`` entry point, which provides the fixtures
``a2_app``, ``a2_telemetry`` and ``a2_clock``, and fails a trio test whose
body was cancelled from outside (:class:`CancelledFromOutside`; pytest-trio
would report it passed). See ``docs/testing.md``.

* :func:`open_harness` / the ``a2_app`` fixture: your contract and handlers on
  a memory store, a local scheduler and a :class:`TrioClock`, with
  ``settle()``, ``advance(seconds)``, ``advance_to(datetime)``, ``restart()``,
  ``outcome()``, ``assert_log()`` and ``assert_outcome()``.
* :class:`FaultyStore`: any store, with chosen operations failing
  (``STORE_UNAVAILABLE``) or slowed, a number of times or between instants.
* :class:`RecordingTelemetry`: spans and attributes to assert on.
"""

from __future__ import annotations

from ..clock import TrioClock
from ._faults import Fault, FaultyStore, FaultyStoreStatistics, InjectedFault, Operation
from ._harness import (
    Harness,
    Outcome,
    OutcomeStatus,
    SchedulerFactory,
    local_scheduler,
    open_harness,
)
from ._plugin import AppFactory, CancelledFromOutside, a2_app, a2_clock, a2_telemetry
from ._plugin import pytest_addoption as pytest_addoption
from ._plugin import pytest_runtest_call as pytest_runtest_call
from ._telemetry import RecordedSpan, RecordingTelemetry

__all__ = [
    "AppFactory",
    "CancelledFromOutside",
    "Fault",
    "FaultyStore",
    "FaultyStoreStatistics",
    "Harness",
    "InjectedFault",
    "Operation",
    "Outcome",
    "OutcomeStatus",
    "RecordedSpan",
    "RecordingTelemetry",
    "SchedulerFactory",
    "TrioClock",
    "a2_app",
    "a2_clock",
    "a2_telemetry",
    "local_scheduler",
    "open_harness",
]
