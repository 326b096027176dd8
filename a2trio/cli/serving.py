"""The serve command's parts: loading the target, the log, the banner, and
serving one process with hypercorn's trio worker (:func:`serve_process`).

:mod:`.serve` is the command line over them and re-exports the public names;
:mod:`.workers` runs :func:`serve_process` in each process of ``--workers N``.
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, cast

import h11
import hypercorn.config
import hypercorn.events
import hypercorn.trio
import hypercorn.trio.tcp_server
import hypercorn.typing
import msgspec
import trio

from ..actor import Actor
from ..server import Server
from ..transport import DEFAULT_LIMITS, App, Limits, asgi

__all__ = [
    "KEEP_ALIVE_S",
    "PREFLIGHT_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "AccessLog",
    "JsonFormatter",
    "StartupError",
    "TargetError",
    "banner_printer",
    "configure_logging",
    "guard_hypercorn",
    "hypercorn_config",
    "innermost",
    "lanes",
    "load_target",
    "print_line",
    "serve_process",
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


def stores(app: App | Any) -> str:
    """The stores the mounted servers really use, for the banner (an app's
    own servers may have been built with stores of their own)."""
    if not isinstance(app, App):
        return f"store: {os.environ.get('A2_STORE', 'by A2_ENV')}"
    return ", ".join(f"{name}: {server.store!r}" for name, server in app.servers.items())


#: One INFO record per request: method, path (never the query string, which
#: may carry a token), status and duration; never headers or bodies.
_ACCESS_LOGGER: Final = "a2trio.access"
access_logger = logging.getLogger(_ACCESS_LOGGER)
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
        # The wall clock's duration (perf_counter: a third of trio's clock read).
        started = time.perf_counter()
        status: int | str = "-"
        streaming = False

        # A plain function handing back the server's own awaitable: every
        # send (and every wake-up within it) skips a coroutine frame.
        def recording_send(message: Any) -> Awaitable[None]:
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
            return cast("Awaitable[None]", send(message))

        try:
            await self.app(scope, receive, recording_send)
        finally:
            seconds = time.perf_counter() - started
            method = scope.get("method", "GET") if kind == "http" else "WS"
            took = f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"
            path = scope.get("path", "")
            # The record made and handled directly: ``Logger.info`` would
            # also walk the stack for the caller's file and line, which say
            # nothing here (a fifth of the line's cost).
            access_logger.handle(
                access_logger.makeRecord(
                    _ACCESS_LOGGER,
                    logging.INFO,
                    __file__,
                    0,
                    "%s %s %s%s %s",
                    (method, path, status, " (stream)" if streaming else "", took),
                    None,
                    extra={"a2_method": method, "a2_path": path, "a2_status": status},
                )
            )


class _SecondsFormatter(logging.Formatter):
    """A formatter whose default ``asctime`` (``2026-12-02 18:31:39,123``)
    formats the date and time once a second, not once a record: ``serve``
    writes a line per request."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached, stamp = self._second
        if cached != second:
            stamp = time.strftime(self.default_time_format, self.converter(record.created))
            # One tuple, so a record logged from a thread sees a matching pair.
            self._second = (second, stamp)
        msecs = self.default_msec_format
        return stamp if msecs is None else msecs % (stamp, record.msecs)


class JsonFormatter(_SecondsFormatter):
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


def configure_logging(level: str, fmt: str, *, worker: int | None = None) -> None:
    """What ``serve`` sets up (a library configures no handlers): one stderr
    handler on the root logger, readable text or JSON lines. In a worker of
    ``--workers N`` every record says which (``[worker 2]``, ``a2_worker``)."""
    handler = logging.StreamHandler(sys.stderr)
    tag = ""
    if worker is not None:
        tag = "[worker %(a2_worker)s] "

        def tagged(record: logging.LogRecord) -> bool:
            record.a2_worker = worker
            return True

        handler.addFilter(tagged)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            _SecondsFormatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
        )
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


def hypercorn_config(host: str, port: int, keep_alive_s: float) -> hypercorn.config.Config:
    """hypercorn's configuration as ``serve`` sets it: the bind, the graceful
    timeout, keep-alive, the socket message bound, the trio worker."""
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

    Only a send of bytes meets the race, so only that branch is replaced (as
    hypercorn 0.18 writes it, ``BusyResourceError`` added); every other event
    goes to hypercorn's own method. No coroutine wraps hypercorn's: every
    send of every response (and every wake-up within it) would pay its frame.

    The replacement also skips two trips through Trio's scheduler per send,
    most of a fan-out's cost (issue 30: one SSE frame to 1,000 followers, 72
    against 38 µs of server CPU per delivery). On a plain socket the bytes go
    out by one non-blocking ``os.write`` rather than ``send_all``'s yield
    after a send that succeeded; only a partial write (the socket's buffer is
    full) or TLS goes on to the shielded ``send_all``. A free send lock is
    taken at once (``acquire_nowait``) rather than by ``acquire``'s yield once
    hypercorn has read the whole request: before that, a response sent
    without a single yield can end before hypercorn's reader takes the
    request's end from its buffer, and hypercorn then closes the connection
    instead of keeping it alive (a push answered from a body read to its
    declared length, ``read_body``). A cancelled caller still gets
    ``Cancelled`` before anything is written, as ``acquire`` gave it.
    """
    server = hypercorn.trio.tcp_server.TCPServer
    if getattr(server.protocol_send, "a2trio_guarded", False):
        return
    unguarded = server.protocol_send
    raw_data = hypercorn.events.RawData

    async def send_bytes(
        self: hypercorn.trio.tcp_server.TCPServer, event: hypercorn.events.RawData
    ) -> None:
        lock = self.send_lock
        if lock.locked() or not _request_read(self):
            await lock.acquire()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            lock.acquire_nowait()
        try:
            data = event.data
            sent = _write_now(self.stream, data)
            if sent < len(data):
                with trio.CancelScope(shield=True):
                    await self.stream.send_all(memoryview(data)[sent:])
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            await self.protocol.handle(hypercorn.events.Closed())
        finally:
            lock.release()

    def protocol_send(
        self: hypercorn.trio.tcp_server.TCPServer, event: hypercorn.events.Event
    ) -> Coroutine[Any, Any, None]:
        if isinstance(event, raw_data):
            return send_bytes(self, event)
        return unguarded(self, event)

    protocol_send.a2trio_guarded = True  # type: ignore[attr-defined]
    server.protocol_send = protocol_send  # type: ignore[method-assign]


def _request_read(server: hypercorn.trio.tcp_server.TCPServer) -> bool:
    """Whether hypercorn has read the whole of the HTTP/1.1 request being
    answered (h11's ``their_state``; HTTP/2 and WebSocket connections have
    none, so they keep the lock's yield)."""
    connection = getattr(server.protocol.protocol, "connection", None)
    return getattr(connection, "their_state", None) is h11.DONE


def _write_now(stream: object, data: bytes) -> int:
    """Write what a plain socket takes of ``data`` now, without blocking: the
    count written (0 for TLS, whose stream encrypts first, a full buffer, or
    a platform whose sockets are not file descriptors).

    Raises:
      trio.ClosedResourceError: the socket is closed or shut for writing.
      trio.BrokenResourceError: the peer is gone.
    """
    # Elsewhere than POSIX a socket is no file descriptor ``os.write`` takes.
    if os.name != "posix" or not isinstance(stream, trio.SocketStream):
        return 0
    sock = stream.socket
    fd = sock.fileno()
    if fd == -1 or sock.did_shutdown_SHUT_WR:
        raise trio.ClosedResourceError("the connection is closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"the peer is gone: {exc}") from exc


def innermost(error: BaseException) -> BaseException:
    """The one error inside nested groups of one (a failed bind, say)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def print_line(line: str) -> None:
    """One line on stdout, at once (the banner is read through pipes)."""
    print(line, flush=True)


def banner_printer(app: App | Any, workers: int = 1) -> Callable[[list[str]], None]:
    """What is printed once the port listens: the URL, the stores, the lanes."""

    def banner(binds: list[str]) -> None:
        count = f"{workers} workers; " if workers > 1 else ""
        for url in binds:
            print_line(f"a2trio serving on {url} ({count}{stores(app)})")
            for line in lanes(app, url):
                print_line(line)
        print_line("Ctrl-C to stop")

    return banner


async def serve_process(
    app: App | Any,
    config: hypercorn.config.Config,
    access_log: bool,
    *,
    started: Callable[[list[str]], None] | None = None,
    say: Callable[[str], None] = print_line,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
    until: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until one of ``signals`` arrives (or ``until`` returns):
    ``started`` gets the binds once the port listens (the banner by default),
    ``say`` the lifecycle lines."""
    guard_hypercorn()
    await _preflight(app)
    served = AccessLog(app) if access_log else app
    with trio.open_signal_receiver(*signals) as received:

        async def shutdown() -> None:
            async with trio.open_nursery() as nursery:

                async def signalled() -> None:
                    async for _ in received:
                        break
                    nursery.cancel_scope.cancel()

                async def returned(until: Callable[[], Awaitable[None]]) -> None:
                    await until()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(signalled)
                if until is not None:
                    nursery.start_soon(returned, until)
            say("shutting down")

        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(
                    hypercorn.trio.serve,
                    cast("hypercorn.typing.ASGIFramework", served),
                    config,
                    shutdown_trigger=shutdown,
                )
            )
            (started or banner_printer(app))(binds)
            logger.debug(
                "gc thresholds %s, %s startup objects frozen",
                gc.get_threshold(),
                f"{gc.get_freeze_count():,}",
            )
    say("stopped")
