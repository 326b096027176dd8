"""A 3-day schedule, tested in milliseconds.

When a trial starts, the handler schedules a reminder three days later. The
autojump clock skips the idle days: the test checks the instant before and
the instant of delivery.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory

pytestmark = pytest.mark.trio


class TrialStarted(msgspec.Struct, frozen=True):
    email: str


class Reminder(msgspec.Struct, frozen=True):
    email: str


trials = a2trio.contract("trials", events={"started": TrialStarted, "reminder": Reminder})


async def plan_reminder(ctx: a2trio.HandlerContext[TrialStarted]) -> a2trio.Returned:
    # The delay counts from the trigger's created_at, so a retry schedules once.
    reminder = trials.event("reminder", Reminder(ctx.event.payload.email))
    await ctx.session.schedule("reminder", "3d", reminder)
    return None


async def test_reminder_arrives_three_days_later(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    app = await a2_app(trials, handlers={"started": plan_reminder})
    s = app.session("trial-ada")
    [started] = await s.append(trials.event("started", TrialStarted("ada@example.com")))
    due = started.created_at + timedelta(days=3)

    await app.advance_to(due - timedelta(seconds=1))
    await app.assert_log(s, ["started"])

    await app.advance(1)
    [_, reminder] = await app.assert_log(s, ["started", "reminder"])
    assert reminder.created_at == due
    assert trio.current_time() == 3 * 24 * 3600
