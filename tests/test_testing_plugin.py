"""The plugin's guard: a trio test cancelled from outside its body fails.

pytest-trio 0.8 reports such a test passed (its own nursery absorbs the
``Cancelled``); ``a2trio.testing`` turns it into a failure naming the
cancellation. Each case runs a small test file in an inner pytest session
(pytester), with the plugin loaded from its entry point as in a user's project.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_INI = """
[pytest]
trio_mode = true
addopts = -p no:cacheprovider -p no:randomly
"""

#: A context manager that enters a nursery in ``__aenter__`` and cancels it
#: early (the shape of the Redis store's bug): the block is cancelled by a
#: scope its body does not own, and the ``Cancelled`` escapes the block.
_LEAKY = """
import trio

reached = []


class Leaky:
    async def __aenter__(self):
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        return self

    def close_early(self):
        self._nursery.cancel_scope.cancel(reason="closed early")

    async def __aexit__(self, *exc_info):
        self._nursery.cancel_scope.cancel()
        await self._cm.__aexit__(None, None, None)
"""


def _run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makeini(_INI)
    pytester.makepyfile(test_case=_LEAKY + body)
    return pytester.runpytest_subprocess(*args)


def test_a_body_cancelled_from_outside_fails_naming_the_cancellation(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
async def test_cut_short():
    async with Leaky() as leaky:
        leaky.close_early()
        await trio.sleep(0)
        reached.append("after")
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CancelledFromOutside: the test's body was cancelled from outside its own "
            "cancel scopes, cancelled due to explicit with reason 'closed early'*",
        ]
    )


def test_a_group_of_cancellations_from_outside_fails(pytester: pytest.Pytester) -> None:
    # The body's own nursery turns the stray cancellation into a group.
    result = _run(
        pytester,
        """
async def test_cut_short():
    async with Leaky() as leaky:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            leaky.close_early()
            await trio.sleep_forever()
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CancelledFromOutside*'closed early'*"])


def test_a_hypothesis_body_cancelled_from_outside_fails(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
from hypothesis import given, settings, strategies


@settings(max_examples=2, deadline=None, database=None)
@given(strategies.integers())
async def test_cut_short(n):
    async with Leaky() as leaky:
        leaky.close_early()
        await trio.sleep(0)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CancelledFromOutside*'closed early'*"])


def test_the_tests_own_cancel_scopes_and_failures_are_untouched(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
import pytest


async def test_own_scope():
    with trio.move_on_after(0):
        await trio.sleep_forever()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        nursery.cancel_scope.cancel()


async def test_closed_properly():
    async with Leaky() as leaky:
        await trio.sleep(0)


async def test_fails():
    assert 1 == 2


async def test_skips():
    pytest.skip("not here")


@pytest.mark.xfail(strict=True)
async def test_xfails():
    raise RuntimeError("known")
""",
    )
    result.assert_outcomes(passed=2, failed=1, skipped=1, xfailed=1)
    result.stdout.no_fnmatch_line("*CancelledFromOutside*")


def test_a_crashing_fixture_is_reported_as_itself(pytester: pytest.Pytester) -> None:
    # pytest-trio cancels the body itself when a fixture's task crashes: that
    # cancellation is its own, and the fixture's error is the failure.
    result = _run(
        pytester,
        """
import pytest


async def crash():
    await trio.sleep(0)
    raise RuntimeError("the fixture's task crashed")


@pytest.fixture
async def crashing():
    async with trio.open_nursery() as nursery:
        nursery.start_soon(crash)
        yield


async def test_waits(crashing):
    await trio.sleep_forever()
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: the fixture's task crashed*"])
    result.stdout.no_fnmatch_line("*CancelledFromOutside*")


def test_the_ini_option_turns_the_guard_off(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
async def test_cut_short():
    async with Leaky() as leaky:
        leaky.close_early()
        await trio.sleep(0)
""",
        "-o",
        "a2trio_fail_cancelled_tests=false",
    )
    # pytest-trio's own verdict, which the option restores.
    result.assert_outcomes(passed=1)
