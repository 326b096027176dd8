"""``python -m a2trio.inspect``: an operator's view of an app's sessions.

    python -m a2trio.inspect --app module:server [--store URL] [--json] sessions [--limit N]
    python -m a2trio.inspect --app module:server events SESSION [--after N] [--limit N]

``--app`` names the server as ``serve`` does (``module:attribute``, the
attribute defaulting to ``server``; with a list of servers, ``--contract``
picks one). ``--store`` sets ``A2_STORE`` before the module is imported, as in
``serve``. Tables for people, ``--json`` for scripts (one JSON document).
Exit status 0, 1 with one line on stderr when the store or the input refuses,
2 for bad arguments. The operator's actions (redrive, skip) are not here yet
(issue 18): they need store operations of their own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from .errors import A2Error
from .inspection import InspectionUnsupportedError, SessionEventsPage, SessionsPage
from .server import Server

__all__ = ["main"]


def load_server(target: str, contract: str | None) -> Server:
    """The server ``module:attribute`` names (a list picked by ``contract``).

    Raises:
      ValueError: no such attribute, not a server, or an ambiguous list.
    """
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attribute or "server", None)
    servers = (
        list(value)
        if isinstance(value, list | tuple)
        else [value]
        if isinstance(value, Server)
        else []
    )
    if not servers or not all(isinstance(s, Server) for s in servers):
        raise ValueError(f"{target} is not an a2trio.Server or a list of them")
    if contract is not None:
        servers = [s for s in servers if s.contract.name == contract]
    if len(servers) != 1:
        names = ", ".join(s.contract.name for s in servers) or "none"
        raise ValueError(f"{target} holds servers for {names}: pick one with --contract")
    return servers[0]


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
    rows = [("index", "type", "state", "attempts", "failures", "id")]
    rows += [
        (
            str(e.event.index),
            e.event.type,
            e.status.state,
            str(e.status.attempts),
            str(e.status.failures),
            e.event.id,
        )
        for e in page.events
    ]
    lines = _columns(rows)
    if page.next_index is not None:
        lines.append(f"(more: --after {page.next_index}; through index {page.through_index})")
    return lines


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


async def _run(server: Server, args: argparse.Namespace) -> str:
    async with server:
        if args.command == "sessions":
            sessions = await server.inspect.list_sessions(limit=args.limit, cursor=args.cursor)
            if args.json:
                return msgspec.json.encode(sessions).decode()
            return "\n".join(_sessions_table(sessions))
        events = await server.inspect.read_session_page(
            args.session, after_index=args.after, limit=args.limit
        )
        if args.json:
            return msgspec.json.encode(msgspec.to_builtins(events)).decode()
        return "\n".join(_events_table(events))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m a2trio.inspect", description="Inspect an a2trio app's sessions."
    )
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
    args = parser.parse_args(argv)
    if args.store:
        os.environ["A2_STORE"] = args.store
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        server = load_server(args.app, args.contract)
        output: Any = trio.run(_run, server, args)
    except (A2Error, InspectionUnsupportedError, TypeError, ValueError, ImportError) as exc:
        print(f"a2trio.inspect: {exc}", file=sys.stderr)
        return 1
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
