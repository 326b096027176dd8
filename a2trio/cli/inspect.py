"""``python -m a2trio.inspect``: an operator's view of an app's sessions, and
the actions that repair them.

    python -m a2trio.inspect --app module:server [--store URL] [--json] sessions [--limit N]
    python -m a2trio.inspect --app module:server events SESSION [--after N] [--limit N]
    python -m a2trio.inspect --app module:server event SESSION INDEX
    python -m a2trio.inspect --app module:server dead-letters [--limit N] [--cursor C]
    python -m a2trio.inspect --app module:server crons
    python -m a2trio.inspect --app module:server redrive SESSION INDEX [--reason TEXT]
    python -m a2trio.inspect --app module:server skip SESSION INDEX --reason TEXT
    python -m a2trio.inspect --app module:server retry-now SESSION [--reason TEXT]
    python -m a2trio.inspect --app module:server wake SESSION INDEX [--reason TEXT]
    python -m a2trio.inspect --app module:server cancel SESSION INDEX --reason TEXT
    python -m a2trio.inspect --app module:server bulk {redrive,skip} [--type T]... [--error TEXT]
        [--prefix P] [--from TIME] [--until TIME] [--dry-run] [--all] [--limit N] [--reason TEXT]
    python -m a2trio.inspect --app module:server export SESSION
    python -m a2trio.inspect --app module:server archive SESSION --to FILE --reason TEXT
    python -m a2trio.inspect --app module:server erase SESSION --reason TEXT
    python -m a2trio.inspect --app module:server trim SESSION --reducer NAME --reason TEXT

``--app`` names the server as ``serve`` does (``module:attribute``, the
attribute defaulting to ``server``; with a list of servers, ``--contract``
picks one). ``--store`` sets ``A2_STORE`` before the module is imported, as in
``serve``. Tables for people, ``--json`` for scripts (one JSON document, in
the wire's camelCase as ``/_a2/inspect`` answers: :mod:`a2trio.transport.wire`).
``events`` and ``dead-letters`` list each failed attempt under the table
(its attempt, when, the holder, how long it ran, the error's last line);
``event`` shows one event whole: its payload, status, every failed attempt
with its full error, and the operator's actions. Exit status 0, 1 with one
line on stderr when the store or the input refuses (an action on the wrong
target names why: ``OperatorActionError``), 2 for bad arguments. Actions are
recorded with ``--by`` (default: the login name).

``bulk`` redrives or skips every dead letter its filter matches (each field
given must match): ``--type`` (repeatable), ``--error`` (text in the last
error), ``--prefix`` (of the session id), ``--from`` / ``--until`` (when it was
dead-lettered: ISO 8601 with an offset, or epoch milliseconds; from inclusive,
until exclusive). ``--dry-run`` lists the matches and touches nothing; acting
with no filter needs ``--all``; ``--limit`` bounds one run (1,000 by
default). A refused event is listed as refused; the others go on.

``wake`` and ``cancel`` act on an event whose handler is suspended in a
durable sleep or ``wait_for`` (state ``waiting`` with no claim): ``wake``
makes it claimable now (its rerun answers from the journal), ``cancel``
settles it as ``skip`` does. Any other event is refused ``not_waiting``.

``export`` prints a session as JSON lines (its events with their
bookkeeping, snapshots and operator actions; see ``ServerRetention.lines``)
and removes nothing. ``archive`` writes that to a new file (``--to``), then
erases the session; ``erase`` removes the session and everything derived
from it. Both need ``--reason``, are refused while a claim on the session is
live (``RetentionError``, exit 1), and are logged on ``a2trio.retention``.
``trim`` removes the session's processed events at or below the snapshot of
the reducer ``--reducer`` names (reads below it then answer ``TRIMMED``).

Only the store is opened, never the server: this process runs no handler and
no sweep. The serving processes take an action up by themselves: at once on
Postgres and Redis (the store wakes their drains), at their next sweep on
SQLite (a redriven or skipped event; a retried one once its backoff ends).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio

from ..engine.crons import CronInfo
from ..engine.inspection import DEFAULT_BULK_LIMIT, BulkFilterError, InspectionUnsupportedError
from ..engine.inspection_records import (
    BulkResult,
    DeadLetterFilter,
    DeadLettersPage,
    InspectedEvent,
    SessionEventsPage,
    SessionsPage,
)
from ..errors import A2Error
from ..server import Server
from ..stores.base import Erased, FailedAttempt, OperatorAction
from ..transport import App, wire
from .serve import TargetError, load_target

__all__ = ["main"]


def load_server(target: str, contract: str | None) -> Server:
    """The server ``module:attribute`` names, read as ``serve`` reads it: a
    server, a list of them, or the app :func:`a2trio.transport.asgi` built
    over them (``--contract`` picks one of several).

    Raises:
      TargetError: nothing to inspect there (see :func:`a2trio.serve.load_target`),
        an ASGI app a2trio did not build, or several servers and no ``contract``.
    """
    app = load_target(target)
    if not isinstance(app, App):
        raise TargetError(
            f"{target} is an ASGI app that a2trio.transport.asgi did not build: "
            "name the Server (or the list of them) it serves"
        )
    servers = list(app.servers.values())
    if contract is not None:
        servers = [s for s in servers if s.contract.name == contract]
    if len(servers) != 1:
        names = ", ".join(s.contract.name for s in app.servers.values())
        raise TargetError(f"{target} holds servers for {names}: pick one with --contract")
    return servers[0]


class _NoSession(Exception):
    """``events`` on a session that has none, ``event`` on an index it lacks."""


def _sessions_table(page: SessionsPage) -> list[str]:
    rows = [("session", "events", "pending", "dead", "attempts", "failures")]
    rows += [
        (
            s.session_id,
            str(s.event_count),
            str(s.pending_count),
            str(s.failed_count),
            str(s.attempt_count),
            str(s.failure_count),
        )
        for s in page.sessions
    ]
    lines = _columns(rows)
    if page.cursor is not None:
        lines.append(f"(more: --cursor {page.cursor})")
    return lines


def _events_table(page: SessionEventsPage) -> list[str]:
    rows = [("index", "type", "state", "attempts", "failures", "id", "trace")]
    rows += [
        (
            str(e.event.index),
            e.event.type,
            e.status.state,
            str(e.status.attempts),
            str(e.status.failures),
            e.event.id,
            e.trace_id or "-",
        )
        for e in page.events
    ]
    lines = _columns(rows)
    if page.next_index is not None:
        lines.append(f"(more: --after {page.next_index}; through index {page.through_index})")
    return lines + _failures_lines(page.events, with_session=False)


def _failures_lines(events: Sequence[InspectedEvent], *, with_session: bool) -> list[str]:
    """Each failed attempt of the events that failed, one line each, under a
    table (``event`` shows the whole errors)."""
    rows: list[tuple[str, ...]] = []
    for e in events:
        where = f"{e.event.session_id} #{e.event.index}" if with_session else f"#{e.event.index}"
        rows += [
            (
                where,
                f"attempt {f.attempt}",
                _when(f.failed_at_ms),
                f.holder,
                _took(f),
                _last_line(f.error),
            )
            for f in e.failed_attempts
        ]
    if not rows:
        return []
    return ["", "failed attempts:", *("  " + line for line in _columns(rows))]


def _when(ms: int | None) -> str:
    """Epoch milliseconds as UTC ISO 8601, to the millisecond."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _took(failure: FailedAttempt) -> str:
    """How long the attempt ran, from its claim to its failure."""
    if failure.claimed_at_ms is None:
        return "-"
    ms = failure.failed_at_ms - failure.claimed_at_ms
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _event_detail(e: InspectedEvent) -> list[str]:
    s = e.status
    lines = [
        f"event {e.event.session_id} #{e.event.index}: {e.event.type} ({e.event.id})",
        f"created    {e.event.created_at.isoformat(timespec='milliseconds')}",
        f"state      {s.state}, {_count(s.attempts, 'attempt')}, {_count(s.failures, 'failure')}"
        + ("" if s.lane is None else f", lane {s.lane}"),
    ]
    for name, ms in (
        ("claimed", s.first_claimed_at_ms),
        (
            "last claim",
            s.last_claimed_at_ms if s.last_claimed_at_ms != s.first_claimed_at_ms else None,
        ),
        ("processed", s.processed_at_ms),
        ("dead", s.dead_lettered_at_ms),
    ):
        if ms is not None:
            lines.append(f"{name:<10} {_when(ms)}")
    if s.waiting_for is not None:
        until = "no timeout" if s.waiting_until_ms is None else f"until {_when(s.waiting_until_ms)}"
        lines.append(f"waiting    for {s.waiting_for}, {until}")
    if s.claim_holder is not None:
        lines.append(
            f"running    attempt {s.attempts} on {s.claim_holder}, lease ends "
            f"{_when(s.claim_expires_at_ms)}"
        )
    if e.trace_id is not None:
        lines.append(f"trace      {e.trace_id}")
    lines += ["payload", *("  " + line for line in _pretty(e.event.payload))]
    for f in e.failed_attempts:
        lines += [
            f"attempt {f.attempt} failed {_when(f.failed_at_ms)} on {f.holder} after {_took(f)}:",
            *("  " + line for line in f.error.rstrip().splitlines()),
        ]
    if not e.failed_attempts and s.last_error is not None:
        lines += [
            f"attempt {s.last_failed_attempt} failed {_when(s.last_failed_at_ms)}:",
            *("  " + line for line in s.last_error.rstrip().splitlines()),
        ]
    lines += [
        f"{a.action} by {a.by} at {_when(a.at_ms)}" + (f": {a.reason}" if a.reason else "")
        for a in e.actions
    ]
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _pretty(payload: object) -> list[str]:
    return json.dumps(msgspec.to_builtins(payload), indent=2, ensure_ascii=False).splitlines()


def _dead_letters_table(page: DeadLettersPage) -> list[str]:
    rows = [("session", "index", "type", "failures", "last error")]
    rows += [
        (
            d.event.session_id,
            str(d.event.index),
            d.event.type,
            str(d.status.failures),
            _last_line(d.status.last_error),
        )
        for d in page.dead_letters
    ]
    lines = _columns(rows)
    if page.cursor is not None:
        lines.append(f"(more: --cursor {page.cursor})")
    return lines + _failures_lines(page.dead_letters, with_session=True)


def _crons_table(crons: Sequence[CronInfo]) -> list[str]:
    rows = [("cron", "spec", "timezone", "session", "catch up", "last slot", "next slot")]
    rows += [
        (
            c.name,
            c.spec,
            c.timezone,
            c.session_id,
            c.catch_up,
            "-" if c.last_slot is None else c.last_slot.isoformat(),
            c.next_slot.isoformat(),
        )
        for c in crons
    ]
    return _columns(rows)


def _last_line(error: str | None) -> str:
    """A traceback's last line (the exception), cut to fit a table."""
    lines = (error or "").strip().splitlines()
    last = lines[-1] if lines else ""
    return last if len(last) <= 80 else last[:79] + "…"


def _actions_table(actions: Sequence[OperatorAction]) -> list[str]:
    rows = [("action", "session", "index", "by", "reason")]
    rows += [(a.action, a.session_id, str(a.index), a.by, a.reason) for a in actions]
    return _columns(rows)


def _bulk_table(result: BulkResult) -> list[str]:
    rows = [("session", "index", "type", "outcome", "why")]
    rows += [(i.session_id, str(i.index), i.type, i.outcome, i.detail or "") for i in result.items]
    lines = _columns(rows)
    done = "dry run: nothing touched" if result.dry_run else f"{result.action}"
    lines.append(
        f"({done}; matched {result.matched}, acted {result.acted}, refused {result.refused})"
    )
    if result.limited:
        lines.append("(more matched past --limit: run it again for the rest)")
    return lines


def _erased_table(erased: Erased) -> list[str]:
    return [
        f"removed session {erased.session_id!r}: {erased.events} events, "
        f"{erased.snapshots} snapshots, {erased.actions} operator actions, "
        f"{erased.presence} presence rows"
    ]


def _moment(name: str, text: str | None) -> int | None:
    """``--from`` / ``--until``: epoch milliseconds, or ISO 8601 with an offset."""
    if text is None:
        return None
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise BulkFilterError(
            f"--{name} takes ISO 8601 with an offset (2026-12-01T09:00:00Z) "
            f"or epoch milliseconds, got {text[:60]!r}"
        )
    return int(moment.timestamp() * 1000)


def _filter(args: argparse.Namespace) -> DeadLetterFilter:
    return DeadLetterFilter(
        event_types=tuple(args.type),
        error_contains=args.error,
        session_prefix=args.prefix,
        dead_lettered_from_ms=_moment("from", args.since),
        dead_lettered_until_ms=_moment("until", args.until),
    )


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


async def _run(server: Server, args: argparse.Namespace) -> str:
    # The store only: an operator's process runs no handler and no sweep.
    async with server.store:
        inspect = server.inspect
        if args.command == "sessions":
            sessions = await inspect.list_sessions(limit=args.limit, cursor=args.cursor)
            return _render(
                args, wire.sessions_page_to_wire(sessions), lambda: _sessions_table(sessions)
            )
        if args.command == "events":
            events = await inspect.read_session_page(
                args.session, after_index=args.after, limit=args.limit
            )
            if not events.events and events.through_index == 0:
                raise _NoSession(
                    f"no session {args.session!r} in {server.contract.name!r} (it has no events)"
                )
            return _render(
                args, wire.session_events_page_to_wire(events), lambda: _events_table(events)
            )
        if args.command == "event":
            found = await inspect.read_session_page(
                args.session, after_index=max(args.index - 1, 0), limit=1
            )
            if not found.events or found.events[0].event.index != args.index:
                raise _NoSession(
                    f"no event {args.index} in session {args.session!r} of "
                    f"{server.contract.name!r} (it has {found.through_index})"
                )
            [one] = found.events
            return _render(
                args, wire.session_events_page_to_wire(found).events[0], lambda: _event_detail(one)
            )
        if args.command == "dead-letters":
            dead = await inspect.list_dead_letters(limit=args.limit, cursor=args.cursor)
            return _render(
                args, wire.dead_letters_page_to_wire(dead), lambda: _dead_letters_table(dead)
            )
        if args.command == "crons":
            crons = await inspect.crons()
            return _render(args, wire.crons_to_wire(crons), lambda: _crons_table(crons))
        if args.command == "bulk":
            result = await inspect.bulk(
                args.action,
                _filter(args),
                by=args.by,
                reason=args.reason,
                dry_run=args.dry_run,
                all=args.all,
                limit=args.limit,
            )
            return _render(args, wire.bulk_result_to_wire(result), lambda: _bulk_table(result))
        if args.command == "export":
            archive = await server.retention.export(args.session)
            return server.retention.lines(archive).decode().rstrip("\n")
        if args.command in ("erase", "archive"):
            if args.command == "erase":
                erased = await server.retention.erase(args.session, by=args.by, reason=args.reason)
            else:
                erased = await server.retention.archive(
                    args.session, args.to, by=args.by, reason=args.reason
                )
            return _render(args, wire.erased_to_wire(erased), lambda: _erased_table(erased))
        if args.command == "trim":
            trimmed = await server.retention.trim(
                args.session, args.reducer, by=args.by, reason=args.reason
            )
            line = (
                f"trimmed session {trimmed.session_id!r} through index {trimmed.through_index}: "
                f"{trimmed.events} events removed"
            )
            return _render(args, wire.trimmed_to_wire(trimmed), lambda: [line])
        if args.command == "retry-now":
            actions = await inspect.retry_now(args.session, by=args.by, reason=args.reason)
        elif args.command == "redrive":
            actions = [
                await inspect.redrive(args.session, args.index, by=args.by, reason=args.reason)
            ]
        elif args.command == "wake":
            actions = [await inspect.wake(args.session, args.index, by=args.by, reason=args.reason)]
        elif args.command == "cancel":
            actions = [
                await inspect.cancel(args.session, args.index, by=args.by, reason=args.reason)
            ]
        else:
            actions = [await inspect.skip(args.session, args.index, by=args.by, reason=args.reason)]
        return _render(args, wire.actions_to_wire(actions), lambda: _actions_table(actions))


def _render(args: argparse.Namespace, value: object, table: Callable[[], list[str]]) -> str:
    # ``value``: the wire's record, camelCase as ``/_a2/inspect`` answers.
    if args.json:
        return wire.encode(value).decode()
    return "\n".join(table())


def _login() -> str:
    """Who runs the command, for the action's record."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or passwd
        return "unknown"


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m a2trio.inspect") -> int:
    """The command line; returns the exit status (``prog`` names it in usage
    lines: ``a2trio inspect`` runs this too)."""
    parser = argparse.ArgumentParser(prog=prog, description="Inspect an a2trio app's sessions.")
    parser.add_argument("--app", required=True, help="module:attribute naming the server")
    parser.add_argument("--contract", help="which server, when the attribute is a list")
    parser.add_argument("--store", help="store URL (sets A2_STORE before the import)")
    parser.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    commands = parser.add_subparsers(dest="command", required=True)
    sessions = commands.add_parser("sessions", help="the contract's sessions")
    sessions.add_argument("--limit", type=int, default=100)
    sessions.add_argument("--cursor")
    events = commands.add_parser("events", help="a session's events with their status")
    events.add_argument("session")
    events.add_argument("--after", type=int, default=0, help="the index to start after")
    events.add_argument("--limit", type=int, default=100)
    event = commands.add_parser("event", help="one event whole: payload, status, each failure")
    event.add_argument("session")
    event.add_argument("index", type=int)
    dead = commands.add_parser("dead-letters", help="the contract's dead letters")
    dead.add_argument("--limit", type=int, default=100)
    dead.add_argument("--cursor", help="from the previous page: INDEX:SESSION")
    commands.add_parser("crons", help="the server's crons with their last and next slot")
    for name, text in (
        ("redrive", "put a dead letter back in line"),
        ("skip", "mark an event processed without running it"),
        ("retry-now", "wake a stalled session's drain now"),
        ("wake", "wake a handler suspended in a durable sleep or wait now"),
        ("cancel", "settle an event whose handler is suspended, without running the rest"),
    ):
        action = commands.add_parser(name, help=text)
        action.add_argument("session")
        if name != "retry-now":
            action.add_argument("index", type=int)
        required = name in ("skip", "cancel")
        action.add_argument("--reason", required=required, default="", help="why")
        action.add_argument("--by", default=_login(), help="who acts (default: login name)")
    bulk = commands.add_parser("bulk", help="redrive or skip every dead letter a filter matches")
    bulk.add_argument("action", choices=("redrive", "skip"))
    bulk.add_argument("--type", action="append", default=[], help="an event type (repeatable)")
    bulk.add_argument("--error", help="text the last error holds (case-sensitive)")
    bulk.add_argument("--prefix", default="", help="the session ids' prefix")
    bulk.add_argument("--from", dest="since", help="dead-lettered at or after (ISO 8601 or ms)")
    bulk.add_argument("--until", help="dead-lettered before (ISO 8601 or ms)")
    bulk.add_argument("--dry-run", action="store_true", help="list the matches, touch nothing")
    bulk.add_argument("--all", action="store_true", help="act with no filter: every dead letter")
    bulk.add_argument("--limit", type=int, default=DEFAULT_BULK_LIMIT, help="the most to touch")
    bulk.add_argument("--reason", default="", help="why (required to skip)")
    bulk.add_argument("--by", default=_login(), help="who acts (default: login name)")
    export = commands.add_parser("export", help="print a session as JSON lines")
    export.add_argument("session")
    archive = commands.add_parser("archive", help="export a session to a new file, then erase it")
    archive.add_argument("session")
    archive.add_argument("--to", required=True, help="the new file (refused if it exists)")
    erase = commands.add_parser("erase", help="remove a session and everything derived from it")
    erase.add_argument("session")
    trim = commands.add_parser("trim", help="remove a session's events below a snapshot")
    trim.add_argument("session")
    trim.add_argument("--reducer", required=True, help="the reducer whose snapshot is the point")
    for removal in (archive, erase, trim):
        removal.add_argument("--reason", required=True, help="why (logged)")
        removal.add_argument("--by", default=_login(), help="who acts (default: login name)")
    args = parser.parse_args(argv)
    if args.store:
        os.environ["A2_STORE"] = args.store
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        server = load_server(args.app, args.contract)
        output: Any = trio.run(_run, server, args)
    except (A2Error, InspectionUnsupportedError, _NoSession, TypeError, ValueError, OSError) as exc:
        # ValueError: TargetError, StoreURLError, a refused action
        # (OperatorActionError, RetentionError), a bad filter
        # (BulkFilterError), a bad argument value. OSError: an archive's
        # file exists or cannot be written. An unreachable store
        # says why (the driver's error is the A2Error's cause).
        cause = ""
        if isinstance(exc, A2Error) and exc.__cause__ is not None:
            cause = " (" + " ".join(str(exc.__cause__).split()) + ")"
        print(f"a2trio.inspect: {exc}{cause}", file=sys.stderr)
        return 1
    print(output)
    return 0
