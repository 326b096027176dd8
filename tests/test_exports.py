"""The public API is what a2trio/__init__.py re-exports, sorted and documented."""

from __future__ import annotations

import subprocess
import sys

import pytest

import a2trio
import a2trio.transport


def test_all_is_sorted_and_complete() -> None:
    # isort-style, as ruff keeps it: CONSTANTS, then Classes, then functions.
    def style(name: str) -> tuple[bool, bool, str]:
        return (not name.isupper(), not name[0].isupper(), name)

    assert a2trio.__all__ == sorted(a2trio.__all__, key=style)
    for name in a2trio.__all__:
        assert hasattr(a2trio, name), name


def test_public_classes_say_a2trio_in_tracebacks() -> None:
    for name in ("A2Error", "Server", "Contract", "Event", "Reducer", "Timings"):
        assert getattr(a2trio, name).__module__ == "a2trio", name


def test_public_callables_have_docstrings() -> None:
    for name in a2trio.__all__:
        value = getattr(a2trio, name)
        if callable(value) and not isinstance(value, type(a2trio)):
            assert (value.__doc__ or "").strip(), f"a2trio.{name} has no docstring"


def test_import_a2trio_does_not_import_pytest_or_the_testing_kit() -> None:
    code = "import sys, a2trio; print('pytest' in sys.modules, 'a2trio.testing' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_serving_does_not_import_httpx() -> None:
    # The HTTP clients load on first use (the core install has no httpx).
    code = (
        "import sys, a2trio.serve, a2trio.transport as t; print('httpx' in sys.modules); "
        "t.open_actor_client; print('httpx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(a2trio.transport, "nope")  # noqa: B009


def test_the_frames_a_lane_yields_import_from_the_transport() -> None:
    # docs/client.md and docs/transport.md name them as a2trio.transport's.
    from a2trio.transport import EventFrame, LaneFrame, PresenceFrame, PresenceSnapshotFrame

    assert LaneFrame == EventFrame | PresenceFrame | PresenceSnapshotFrame
    assert set(a2trio.transport.__all__) >= {"EventFrame", "PresenceFrame", "PresenceSnapshotFrame"}


def test_the_engine_s_old_paths_re_export_what_the_docs_name() -> None:
    # docs/concepts.md, operations.md, transport.md and actors.md name these
    # by the paths they had before the engine became a package (issue 32).
    from a2trio import actor_calls, drain, fanout, inspection, session
    from a2trio.engine import actor_calls as engine_actor_calls
    from a2trio.engine import attempt, inspection_records
    from a2trio.engine import fanout as engine_fanout
    from a2trio.engine import session as engine_session

    assert drain.MAX_ERROR_CHARS == attempt.MAX_ERROR_CHARS
    assert drain.stored_error is attempt.stored_error
    assert drain.DrainResult is a2trio.DrainResult
    assert session.MAX_HISTORY_EVENTS == engine_session.MAX_HISTORY_EVENTS
    assert fanout.RING == engine_fanout.RING
    assert actor_calls.MAX_CALL_ATTEMPTS == engine_actor_calls.MAX_CALL_ATTEMPTS
    assert inspection.event_status is inspection_records.event_status
    for old in (drain, session, fanout, actor_calls, inspection):
        assert all(hasattr(old, name) for name in old.__all__), old.__name__


def test_import_a2trio_does_not_import_croniter() -> None:
    # a2trio.cron loads it on first use (the core install has no croniter).
    code = "import sys, a2trio; print('croniter' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
