"""``python -m a2trio.serve module:server``: serve servers with hypercorn's trio worker.

::

    python -m a2trio.serve examples.board:server [--store URL] [--host H] [--port P] [--reload]

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

The process belongs to the command, so it also tunes Python's garbage
collector for it (:func:`a2trio.tune_gc`; ``--gc-threshold 0`` leaves it alone).
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import hypercorn.config
import hypercorn.events
import hypercorn.run
import hypercorn.trio
import hypercorn.trio.tcp_server
import hypercorn.typing
import msgspec
import trio

from ..actor import Actor
from ..errors import A2Error
from ..server import Server
from ..stores import StoreURLError
from ..transport import DEFAULT_LIMITS, App, Limits, asgi
from ..tuning import GC_THRESHOLD, tune_gc

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

#: How long open requests (streams, sockets) get to finish on shutdown before
#: they are cancelled; streams never finish on their own, so keep it short.
SHUTDOWN_GRACE_S: Final = 2.0
#: How long the start-up check waits for each store.
PREFLIGHT_TIMEOUT_S: Final = 10.0
#: Seconds an idle keep-alive connection stays open between requests
#: (hypercorn's own default).
KEEP_ALIVE_S: Final = 5.0
_TARGET_ENV: Final = "A2_SERVE_TARGET"
_GC_ENV: Final = "A2_SERVE_GC_THRESHOLD"
_BODY_TIMEOUT_ENV: Final = "A2_SERVE_BODY_TIMEOUT"
_ACCESS_LOG_ENV: Final = "A2_SERVE_ACCESS_LOG"


class TargetError(ValueError):
    """``module:attribute`` names nothing to serve: a missing module or
    attribute, or a value that is no server, list of servers or ASGI app."""


def load_target(target: str, *, limits: Limits = DEFAULT_LIMITS) -> App | Any:
    """Import ``module:attribute`` and make it an ASGI app.

    Args:
      target: ``module:attribute``; the attribute defaults to ``server``.
      limits: the network limits of the app built over a server (an app the
        module built itself keeps its own).

    Returns:
      :func:`a2trio.transport.asgi` over a server or a list of servers (with
      the module's ``static`` pages, if it has them), or the attribute itself
      when it is already an ASGI app (any other callable).

    Raises:
      TargetError: the module cannot be found, has no such attribute, or it is
        neither a server, a list of servers nor callable; a ``static`` that is
        not a mapping.
    """
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the target itself missing is a usage error: an import failing
        # inside the app's own code keeps its traceback.
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise
        raise TargetError(f"cannot import {module_name!r}: {exc}") from exc
    attribute = attribute or "server"
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    servers: list[Server] = []
    if isinstance(value, Server):
        servers = [value]
    elif isinstance(value, list | tuple) and value and all(isinstance(s, Server) for s in value):
        servers = list(value)
    if servers:
        # An app the module built itself keeps its own options; servers get
        # the module's pages.
        static = getattr(module, "static", None)
        if static is not None and not isinstance(static, Mapping):
            raise TargetError(f"{module_name}.static is {static!r}: expected {{prefix: directory}}")
        return asgi(*servers, limits=limits, static=static)
    if callable(value):
        return value
    raise TargetError(
        f"{target} is {value!r}: expected an a2trio.Server, a list of them, or an ASGI app"
    )


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


def stores(app: App | Any) -> str:
    """The stores the mounted servers really use, for the banner (an app's
    own servers may have been built with stores of their own)."""
    if not isinstance(app, App):
        return f"store: {os.environ.get('A2_STORE', 'by A2_ENV')}"
    return ", ".join(f"{name}: {server.store!r}" for name, server in app.servers.items())


#: One INFO record per request: method, path (never the query string, which
#: may carry a token), status and duration; never headers or bodies.
access_logger = logging.getLogger("a2trio.access")
#: The banner's details that are not for every start (DEBUG), and reloads.
logger = logging.getLogger("a2trio.serve")


class AccessLog:
    """An ASGI wrapper that logs each HTTP request and socket on
    ``a2trio.access`` at INFO: ``POST /board/team-1 200 1.2 ms`` (an SSE
    stream or a socket when it ends: ``GET /board/team-1 200 (stream) 12.3 s``,
    ``WS /board/team-1/ws 101 4.5 s``). The query string is left out, since a
    signed token may ride in it; nothing else of the request is read.

    hypercorn's own access log builds a dict of every header and environment
    variable per request (50-140 µs here, a fifth of a push); this costs a
    clock read and a record, and nothing when the logger is disabled.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or not access_logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = trio.current_time()
        status: int | str = "-"
        streaming = False

        async def recording_send(message: Any) -> None:
            nonlocal status, streaming
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "http.response.body" and message.get("more_body"):
                streaming = True
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and status == "-":
                status = 403  # refused before the handshake (hypercorn answers 403)
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            seconds = trio.current_time() - started
            method = scope.get("method", "GET") if kind == "http" else "WS"
            took = f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"
            access_logger.info(
                "%s %s %s%s %s",
                method,
                scope.get("path", ""),
                status,
                " (stream)" if streaming else "",
                took,
                extra={"a2_method": method, "a2_path": scope.get("path"), "a2_status": status},
            )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the
    record's ``a2_*`` fields, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in record.__dict__.items() if k.startswith("a2_"))
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return msgspec.json.encode(entry).decode()


def configure_logging(level: str, fmt: str) -> None:
    """What ``serve`` sets up (a library configures no handlers): one stderr
    handler on the root logger, readable text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # hypercorn logs through a handler of its own: not twice.
    logging.getLogger("hypercorn").propagate = False


def lanes(app: App | Any, url: str) -> list[str]:
    """The banner's lines: one per lane of each mounted contract."""
    if not isinstance(app, App):
        return [f"  ASGI app {app!r} at {url}"]
    ws = "ws" + url.removeprefix("http")
    lines = []
    for name, server in app.servers.items():
        if isinstance(server.contract, Actor):
            lines += [
                f"  POST {url}/{name}/{{id}}           call "
                '{"event", "input", "messageId"?} (actor)',
                f"  GET  {url}/{name}/{{id}}           ?snapshot=1, or SSE state frames with "
                "Accept: text/event-stream (?startAfter=)",
                f"  GET  {ws}/{name}/{{id}}/ws        state frames",
            ]
            continue
        lines += [
            f"  POST {url}/{name}/{{session}}      push events and presence",
            f"  GET  {url}/{name}/{{session}}      history (?gte=&lte=), or SSE with "
            "Accept: text/event-stream (?startAfter=&presence=1)",
            f"  GET  {ws}/{name}/{{session}}/ws   socket",
            f"  GET  {ws}/{name}/ws             multiplexed socket",
        ]
    lines.append(f"  GET  {url}/_a2/health           the stores' health (200 or 503)")
    if app.inspect:
        lines.append(f"  GET  {url}/_a2/inspect          the inspector page (and its JSON)")
    if app.metrics:
        lines.append(f"  GET  {url}/_a2/metrics          Prometheus metrics (operators only)")
    if app.scheduler_secret is not None:
        lines.append(f"  POST {url}/_a2/scheduler        signed scheduler deliveries")
    for prefix, static in app.static.mounts:
        path = "/".join(prefix)
        page = f"{url}/{path}{'/' if path else ''}"
        lines.append(f"  GET  {page}  pages from {static.root} (open it in a browser)")
    return lines


def _development_store() -> str | None:
    """The development default (``Server``'s own for ``A2_ENV`` unset or
    ``development``) spelled as a URL, so the banner can name it. ``test`` and
    ``production`` keep their own rules."""
    if os.environ.get("A2_ENV", "development") in ("test", "production"):
        return None
    return "sqlite:///.a2/dev.db"


def _config(host: str, port: int, keep_alive_s: float) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    config.bind = [f"{host}:{port}"]
    config.graceful_timeout = SHUTDOWN_GRACE_S
    config.keep_alive_timeout = keep_alive_s
    # hypercorn buffers a whole message before the app sees it: bound it by ours.
    config.websocket_max_message_size = DEFAULT_LIMITS.max_frame_bytes
    config.worker_class = "trio"
    return config


class StartupError(Exception):
    """Why ``serve`` could not start, as one line for the operator."""


async def _preflight(app: App | Any) -> None:
    """One round trip to each mounted server's store before listening, so a
    missing database or a wrong URL ends the command with one clear line
    instead of a server that answers 503."""
    if not isinstance(app, App):
        return
    for name, server in app.servers.items():
        try:
            with trio.fail_after(PREFLIGHT_TIMEOUT_S):
                await server.ping()
        except (Exception, trio.TooSlowError) as exc:
            cause = exc.__cause__ or exc
            message = f"the store for '{name}' ({server.store!r}) is unavailable: {cause}"
            raise StartupError(message) from exc


def guard_hypercorn() -> None:
    """Make hypercorn's trio worker treat a send that races its own close of
    the connection as a closed connection. Idempotent; ``serve`` calls it.

    hypercorn 0.18 closes a connection (``send_eof``) outside the lock that
    orders its sends, and its ``protocol_send`` lets the ``BusyResourceError``
    of a send caught in that window escape. A client that leaves just as its
    body times out (issue 29) hits it: from the app's 408 it was logged as
    "Error in ASGI Framework" with a traceback; from hypercorn's own 400 for
    the truncated body it ended the listener's nursery, and with it the whole
    server. The send's bytes are lost either way (the connection is closing),
    so the guard does what hypercorn does for a closed stream. Call it before
    serving an app with hypercorn's trio worker yourself.
    """
    server = hypercorn.trio.tcp_server.TCPServer
    if getattr(server.protocol_send, "a2trio_guarded", False):
        return
    unguarded = server.protocol_send

    async def protocol_send(
        self: hypercorn.trio.tcp_server.TCPServer, event: hypercorn.events.Event
    ) -> None:
        try:
            await unguarded(self, event)
        except trio.BusyResourceError:
            await self.protocol.handle(hypercorn.events.Closed())

    protocol_send.a2trio_guarded = True  # type: ignore[attr-defined]
    server.protocol_send = protocol_send  # type: ignore[method-assign]


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def _serve(app: App | Any, config: hypercorn.config.Config, access_log: bool) -> None:
    guard_hypercorn()
    await _preflight(app)
    served = AccessLog(app) if access_log else app
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def shutdown() -> None:
            async for _ in signals:
                print("shutting down", flush=True)
                return

        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(
                    hypercorn.trio.serve,
                    cast("hypercorn.typing.ASGIFramework", served),
                    config,
                    shutdown_trigger=shutdown,
                )
            )
            for url in binds:
                print(f"a2trio serving on {url} ({stores(app)})", flush=True)
                for line in lanes(app, url):
                    print(line, flush=True)
            logger.debug(
                "gc thresholds %s, %s startup objects frozen",
                gc.get_threshold(),
                f"{gc.get_freeze_count():,}",
            )
            print("Ctrl-C to stop", flush=True)
    print("stopped", flush=True)


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
    parser.add_argument("--reload", action="store_true", help="restart when sources change")
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
    store = args.store or os.environ.get("A2_STORE") or _development_store()
    if store:
        os.environ["A2_STORE"] = store
    # `python -m` puts the working directory on the path; a console script does not.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    config = _config(args.host, args.port, args.keep_alive_timeout)
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
    if args.gc_threshold:
        tune_gc(args.gc_threshold)
    try:
        trio.run(_serve, app, config, args.access_log)
    except StartupError as exc:
        print(f"a2trio: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        leaf = _leaf(group)
        if not isinstance(leaf, OSError):
            raise
        print(f"a2trio: cannot listen on {args.host}:{args.port}: {leaf.strerror}", file=sys.stderr)
        return 1
    return 0
