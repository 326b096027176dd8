"""``python -m a2trio.serve module:server``: serve servers with hypercorn's trio worker.

::

    python -m a2trio.serve examples.board:server [--store URL] [--host H] [--port P]
                           [--workers N] [--reload]

The target is a module attribute holding an :class:`a2trio.Server`, a list of
them, or an ASGI app (such as :func:`a2trio.transport.asgi`'s). For a server or
a list, a module attribute ``static`` (``asgi``'s ``static=``: URL prefix to
directory, as the example board's page) is served too. ``--store`` sets
``A2_STORE`` *before* the module is imported, so servers built without an
explicit store pick it up; without it they default by ``A2_ENV`` (the embedded
sqlite store at ``.a2/dev.db`` in development).

Ctrl-C (or SIGTERM) shuts down gracefully: hypercorn stops accepting, open
requests get ``SHUTDOWN_GRACE_S`` to finish, then the app's lifespan closes the
servers, which cancels their drains (claims are left to lapse, and the next
process retries them). ``--reload`` runs hypercorn's reloader, which restarts
the worker when a source file changes.

``--workers N`` runs N such processes on one port, each binding the app to
the same store, under a supervisor (:mod:`.workers`): the store carries what
one worker appends to another's followers, so it must be one they share (a
memory store is refused).

The process belongs to the command, so it also tunes Python's garbage
collector for it (:func:`a2trio.tune_gc`; ``--gc-threshold 0`` leaves it alone).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

import hypercorn.run
import trio

from ..errors import A2Error
from ..stores import StoreURLError
from ..transport import DEFAULT_LIMITS, App, Limits
from ..tuning import GC_THRESHOLD, tune_gc
from .serving import (
    KEEP_ALIVE_S,
    PREFLIGHT_TIMEOUT_S,
    SHUTDOWN_GRACE_S,
    AccessLog,
    JsonFormatter,
    StartupError,
    TargetError,
    configure_logging,
    guard_hypercorn,
    hypercorn_config,
    innermost,
    lanes,
    load_target,
    logger,
    serve_process,
    stores,
)
from .workers import serve_workers

__all__ = [
    "KEEP_ALIVE_S",
    "PREFLIGHT_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "AccessLog",
    "JsonFormatter",
    "StartupError",
    "TargetError",
    "configure_logging",
    "guard_hypercorn",
    "lanes",
    "load_target",
    "main",
    "stores",
]


_TARGET_ENV: Final = "A2_SERVE_TARGET"
_GC_ENV: Final = "A2_SERVE_GC_THRESHOLD"
_BODY_TIMEOUT_ENV: Final = "A2_SERVE_BODY_TIMEOUT"
_ACCESS_LOG_ENV: Final = "A2_SERVE_ACCESS_LOG"


def _from_environ() -> App | Any:
    """The reloader's entry point: each fresh worker loads the target again."""
    guard_hypercorn()
    body_timeout_s = float(os.environ.get(_BODY_TIMEOUT_ENV, DEFAULT_LIMITS.body_timeout_s))
    target = os.environ[_TARGET_ENV]
    app = load_target(target, limits=Limits(body_timeout_s=body_timeout_s))
    threshold = int(os.environ.get(_GC_ENV, "0"))
    if threshold:
        tune_gc(threshold)
    logger.info("loaded %s (%s)", target, stores(app))
    return AccessLog(app) if os.environ.get(_ACCESS_LOG_ENV) == "1" else app


def _development_store() -> str | None:
    """The development default (``Server``'s own for ``A2_ENV`` unset or
    ``development``) spelled as a URL, so the banner can name it. ``test`` and
    ``production`` keep their own rules."""
    if os.environ.get("A2_ENV", "development") in ("test", "production"):
        return None
    return "sqlite:///.a2/dev.db"


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {count}")
    return count


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m a2trio.serve") -> int:
    """The command line; returns the exit status (``prog`` names it in usage
    lines: ``a2trio serve`` runs this too)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve a2trio servers over HTTP and sockets."
    )
    parser.add_argument("target", help="module:attribute (a Server, a list of them, or an app)")
    parser.add_argument(
        "--store", help="store URL: memory:, sqlite:///path, postgresql://..., redis://..."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers",
        type=_count,
        default=1,
        metavar="N",
        help="server processes on the one port (SO_REUSEPORT), each on the same store, "
        "which must be one they share: sqlite file, postgresql:// or redis:// (default 1)",
    )
    parser.add_argument(
        "--reload", action="store_true", help="restart when sources change (one worker)"
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=GC_THRESHOLD,
        metavar="N",
        help=f"young-generation GC threshold (default {GC_THRESHOLD}; 0: Python's own settings)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_LIMITS.body_timeout_s,
        metavar="S",
        help="seconds a request body may take to arrive before a 408 "
        f"(default {DEFAULT_LIMITS.body_timeout_s:g})",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=KEEP_ALIVE_S,
        metavar="S",
        help=f"seconds an idle keep-alive connection stays open (default {KEEP_ALIVE_S:g})",
    )
    parser.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no line per request on a2trio.access (method, path, status, duration)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe record logged (default info)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text for people, json for machines: one object per line (default text)",
    )
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if args.gc_threshold < 0:
        parser.error(f"--gc-threshold must be 0 or more, got {args.gc_threshold}")
    for flag, value in (
        ("--body-timeout", args.body_timeout),
        ("--keep-alive-timeout", args.keep_alive_timeout),
    ):
        if not value > 0:
            parser.error(f"{flag} must be positive seconds, got {value}")
    if args.reload and args.workers > 1:
        parser.error("--reload runs one worker: drop --workers")
    store = args.store or os.environ.get("A2_STORE") or _development_store()
    if store:
        os.environ["A2_STORE"] = store
    # `python -m` puts the working directory on the path; a console script does not.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    config = hypercorn_config(args.host, args.port, args.keep_alive_timeout)
    if args.reload:
        os.environ[_TARGET_ENV] = args.target
        os.environ[_GC_ENV] = str(args.gc_threshold)
        os.environ[_BODY_TIMEOUT_ENV] = str(args.body_timeout)
        os.environ[_ACCESS_LOG_ENV] = "1" if args.access_log else "0"
        config.application_path = "a2trio.cli.serve:_from_environ()"
        config.use_reloader = True
        print(f"a2trio serving {args.target} on http://{args.host}:{args.port} (reloading)")
        return hypercorn.run.run(config)
    try:
        app = load_target(args.target, limits=Limits(body_timeout_s=args.body_timeout))
    except (TargetError, StoreURLError, A2Error) as exc:
        # Usage errors, said in one line (an unknown store URL and
        # STORE_NOT_CONFIGURED surface while the module builds its servers).
        print(f"a2trio: {exc}", file=sys.stderr)
        return 1
    if args.workers > 1:
        return serve_workers(app, args)
    if args.gc_threshold:
        tune_gc(args.gc_threshold)
    try:
        trio.run(serve_process, app, config, args.access_log)
    except StartupError as exc:
        print(f"a2trio: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        leaf = innermost(group)
        if not isinstance(leaf, OSError):
            raise
        print(f"a2trio: cannot listen on {args.host}:{args.port}: {leaf.strerror}", file=sys.stderr)
        return 1
    return 0
