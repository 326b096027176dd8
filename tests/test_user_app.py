"""A user's app, tested the way its author would: only ``a2trio`` and the public
``a2trio.testing`` kit (the ``a2_app`` fixture), never a2trio's internals.

The app is a help desk. Opening a ticket triages it (a slow call to a staffing
service) and assigns an agent; triage also schedules an SLA check four hours
later, which escalates the ticket unless it was resolved by then. Resolving a
ticket while triage is still running aborts the triage.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing

import a2trio
from a2trio.testing import AppFactory, Harness

# -- the app ------------------------------------------------------------------------


class Opened(msgspec.Struct, frozen=True):
    ticket: str
    customer: str


class Assigned(msgspec.Struct, frozen=True):
    ticket: str
    agent: str


class SlaCheck(msgspec.Struct, frozen=True):
    ticket: str


class Resolved(msgspec.Struct, frozen=True):
    ticket: str


class Escalated(msgspec.Struct, frozen=True):
    ticket: str


helpdesk = a2trio.contract(
    "helpdesk",
    events={
        "opened": Opened,
        "assigned": Assigned,
        "sla_check": SlaCheck,
        "resolved": Resolved,
        "escalated": Escalated,
    },
)

#: What the staffing service answers, and how long it takes (seconds).
STAFFING_LATENCY_S = 2.0


class Board(msgspec.Struct):
    resolved: set[str] = msgspec.field(default_factory=set)


def fold_board(board: Board, event: a2trio.Event[Any]) -> Board:
    if event.type == "resolved":
        board.resolved.add(event.payload.ticket)
    return board


board = a2trio.Reducer("board", Board(), fold_board)


async def triage(ctx: a2trio.HandlerContext[Opened]) -> a2trio.Returned:
    ticket = ctx.event.payload
    await trio.sleep(STAFFING_LATENCY_S)
    await ctx.session.schedule(
        f"sla-{ticket.ticket}", "4h", helpdesk.event("sla_check", SlaCheck(ticket.ticket))
    )
    agent = "ana" if ticket.customer.startswith("a") else "bo"
    return helpdesk.event("assigned", Assigned(ticket.ticket, agent))


async def check_sla(ctx: a2trio.HandlerContext[SlaCheck]) -> a2trio.Returned:
    state, _ = await ctx.session.state(board)
    if ctx.event.payload.ticket in state.resolved:
        return None
    return helpdesk.event("escalated", Escalated(ctx.event.payload.ticket))


def same_ticket(event: a2trio.Event[Any], trigger: a2trio.Event[Any], _: dict[str, int]) -> bool:
    return bool(event.payload.ticket == trigger.payload.ticket)


HANDLERS = {
    "opened": a2trio.handler(triage, abort_on={"resolved": same_ticket}),
    "sla_check": a2trio.handler(check_sla),
}


async def open_desk(a2_app: AppFactory) -> Harness:
    return await a2_app(helpdesk, handlers=HANDLERS)


def opened(ticket: str, customer: str = "acme") -> a2trio.AppendInput:
    return helpdesk.event("opened", Opened(ticket, customer), id=f"open-{ticket}")


# -- its tests ----------------------------------------------------------------------------


async def test_a_ticket_is_assigned_after_triage(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    await s.append(opened("T-1"))
    await desk.settle()
    assert trio.current_time() == STAFFING_LATENCY_S
    [_, assigned] = await desk.assert_log(s, ["opened", "assigned"])
    assert assigned.payload == Assigned("T-1", "ana")


async def test_an_unresolved_ticket_escalates_after_four_hours(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    [ticket] = await s.append(opened("T-1"))
    await desk.advance(4 * 3600 - 1)
    await desk.assert_log(s, ["opened", "assigned"])
    await desk.advance(1)
    await desk.assert_log(s, ["opened", "assigned", "sla_check", "escalated"])
    await desk.assert_outcome(s, ticket, "processed", attempts=1)


async def test_a_resolved_ticket_does_not_escalate(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    await s.append(opened("T-1"))
    await desk.advance(3600)
    await s.append(helpdesk.event("resolved", Resolved("T-1")))
    await desk.advance(3 * 3600)
    await desk.assert_log(s, ["opened", "assigned", "resolved", "sla_check"])
    await desk.assert_outcome(s, 4, "processed")


async def test_resolving_during_triage_aborts_it(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    await s.append(opened("T-1"), opened("T-2"))
    await desk.advance(1)
    await s.append(helpdesk.event("resolved", Resolved("T-2")))
    await desk.settle()
    await desk.assert_outcome(s, "open-T-1", "processed")
    await desk.assert_outcome(s, "open-T-2", "aborted")
    [*_, assigned] = await desk.assert_log(s, ["opened", "opened", "resolved", "assigned"])
    assert assigned.payload.ticket == "T-1"
    # An aborted triage scheduled nothing: after a day only T-1 escalates.
    await desk.advance(24 * 3600)
    events = await desk.assert_log(
        s, ["opened", "opened", "resolved", "assigned", "sla_check", "escalated"]
    )
    assert events[-1].payload == Escalated("T-1")


async def test_a_lost_completion_is_retried_without_duplicates(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    # The completion commits but its answer is lost: the drain cannot know.
    desk.store.fail("complete_attempt", times=1, after=True)
    await s.append(opened("T-1"))
    await desk.advance(4 * 3600)
    await desk.assert_log(s, ["opened", "assigned", "sla_check", "escalated"])
    await desk.assert_outcome(s, "open-T-1", "processed", attempts=1, failures=0)
    [span] = desk.telemetry.find("a2.event", {"a2.event.type": "opened"})
    assert span.attributes["a2.event.outcome"] == "surrendered"


async def test_an_outage_while_triaging_heals_after_it_ends(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    # Completions and failures both fail for a minute: attempts lapse and retry.
    desk.store.fail("complete_attempt", "fail_attempt", start=0, end=60)
    await s.append(opened("T-1"))
    await desk.advance(120)
    outcome = await desk.assert_outcome(s, "open-T-1", "processed", failures=0)
    assert outcome.attempts > 1
    await desk.assert_log(s, ["opened", "assigned"])


async def test_a_crash_during_triage_assigns_once(
    autojump_clock: trio.testing.MockClock, a2_app: AppFactory
) -> None:
    desk = await open_desk(a2_app)
    s = desk.session("acme")
    await s.append(opened("T-1"))
    await desk.advance(1)
    await desk.restart()
    await desk.advance(desk.timings.claim_ttl_s)
    await desk.drain(s)
    await desk.assert_outcome(s, "open-T-1", "processed", attempts=2)
    await desk.assert_log(s, ["opened", "assigned"])
    await desk.advance(4 * 3600)
    await desk.assert_log(s, ["opened", "assigned", "sla_check", "escalated"])
