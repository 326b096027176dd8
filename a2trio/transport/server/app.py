"""The ASGI app: every server's sessions over HTTP, SSE and WebSockets.

``asgi(*servers)`` mounts each server under its contract's name:

=========================== ================================ ===============================
lane                        request                          answer
=========================== ================================ ===============================
push                        ``POST /{contract}/{session}``   ``{"events": [wire events]}``
stream                      ``GET`` + ``Accept:              SSE ``event``, ``presence``,
                            text/event-stream``              ``presence-snapshot`` frames
history                     ``GET ?gte=&lte=``               ``{"events": [...]}``
socket                      ``GET /{contract}/{session}/ws`` socket frames (:mod:`.sockets`)
multiplexed socket          ``GET /{contract}/ws``           socket frames, tagged by session
scheduler                   ``POST /_a2/scheduler`` (signed) 204 (:mod:`.scheduler`)
health                      ``GET /_a2/health``              round trips (:mod:`.health`)
inspector                   ``/_a2/inspect[/...]``           page, JSON (:mod:`.inspector`)
metrics                     ``GET /_a2/metrics``             Prometheus text (:mod:`.metrics`)
static files (``static=``)  ``GET`` of any other path        the file (:mod:`.static`)
=========================== ================================ ===============================

The first three are a session's HTTP lanes (:mod:`.sessions`). A server of an
:func:`a2trio.actor` is mounted with the actor lanes instead (calls,
snapshots, state frames: :mod:`.actors`, ``docs/actors.md``).

For browsers: ``cors=`` answers preflights and adds CORS headers, and every
socket handshake passes the ``Origin`` check first (:mod:`.cors`).

HTTP requests and socket handshakes are routed by two tables
(:mod:`.routing`, built in ``App._route_table`` and ``App._socket_table``):
adding a route is one handler and one row. A mount's row checks the session
(or actor) id once, building the handle every lane then uses. The app is a
thin shell over :mod:`a2trio.transport.wire` and :mod:`a2trio.transport.sse`
(sans-I/O), and every SSE stream is written by :func:`.streams.write_sse`. Its
lifespan opens the servers (``async with server``) and closes them on shutdown,
which cancels their drains (claims lapse, as after a crash). Every stream is
tied to its request: a client that disconnects cancels its feed task at once,
which releases the store's listener.

Every bad input answers the error envelope with a 4xx status and writes
nothing; a store failure answers 503 ``STORE_UNAVAILABLE``; anything unexpected
is logged and answers 503 too (``asA2Error``), never 500.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Final

from ...actor import Actor
from ...errors import ErrorCode
from ...metrics import require_prometheus_client
from ...server import Server
from .access import Grants, RevokePredicate
from .actors import View, serve_actor_http, serve_actor_socket
from .auth import Authorize, Request
from .cors import (
    Cors,
    SocketOriginCheck,
    SocketOrigins,
    answer_preflight,
    is_preflight,
    with_cors_headers,
)
from .health import serve_health
from .http import (
    Disconnected,
    Receive,
    Refusal,
    Scope,
    Send,
    bad_input,
    failure,
    index_param,
    logger,
    path_segments,
    read_body,
    refuse_handshake,
    request_of,
    respond,
)
from .inspector import serve_inspector
from .limits import DEFAULT_LIMITS, Limits
from .metrics import serve_metrics
from .routing import Handler, Route, SocketHandler, SocketServe, match
from .scheduler import deliver_signed
from .sessions import presence_param, serve_session_http
from .sockets import serve_multiplexed_socket, serve_session_socket
from .static import Static, serve_static, static_mounts

__all__ = ["App", "asgi"]

_POST: Final = frozenset({"POST"})
_GET: Final = frozenset({"GET", "HEAD"})
_SCHEDULER_METHODS: Final = "the scheduler route takes POST"
_HEALTH_METHODS: Final = "the health route takes GET"


class App:
    """An ASGI 3 application serving one or more servers; build it with :func:`asgi`."""

    def __init__(
        self,
        servers: Sequence[Server],
        *,
        authorize: Authorize | None = None,
        limits: Limits = DEFAULT_LIMITS,
        scheduler_secret: str | bytes | None = None,
        inspect: bool = False,
        metrics: bool = False,
        views: Mapping[str, View] | None = None,
        static: Mapping[str, Static | str | os.PathLike[str]] | None = None,
        cors: Cors | None = None,
        socket_origins: SocketOrigins = None,
    ) -> None:
        if not servers:
            raise TypeError("asgi() needs at least one a2trio.Server")
        mounted: dict[str, Server] = {}
        for server in servers:
            if not isinstance(server, Server):
                raise TypeError(f"asgi() takes a2trio.Server objects, got {server!r}")
            name = server.contract.name
            if name in mounted:
                raise ValueError(f"two servers implement the contract {name!r}: mount one")
            if name == "_a2":
                raise ValueError("the contract name '_a2' is reserved for the app's own routes")
            mounted[name] = server
        if scheduler_secret is not None and not scheduler_secret:
            raise ValueError("`scheduler_secret` must not be empty")
        if metrics:
            require_prometheus_client()
        self.servers: Mapping[str, Server] = mounted
        self.views: Mapping[str, View] = _check_views(mounted, views or {})
        self.authorize = authorize
        self.limits = limits
        self.scheduler_secret = scheduler_secret
        self.inspect = inspect
        self.metrics = metrics
        #: WebSocket connections open now (the ``a2trio_live_sockets`` gauge).
        self.sockets_open = 0
        self.static = static_mounts(static)
        self.cors = cors
        self.socket_origins = SocketOriginCheck(cors, socket_origins)
        self.grants = Grants()
        self._routes = self._route_table()
        self._sockets = self._socket_table()

    def __repr__(self) -> str:
        return f"App({', '.join(self.servers)})"

    def revoke(self, predicate: RevokePredicate, message: str = "access was withdrawn") -> int:
        """End, at once, every open SSE stream and socket lane whose
        ``(request, operation)`` ``predicate`` matches (the operation it was
        authorized for: a :class:`~a2trio.transport.StreamOperation` or
        :class:`~a2trio.transport.SubscribeOperation`).

        Each ends resumably, with ``FORBIDDEN`` and ``message``: see
        ``transport/server/access.py``. Does no I/O; the streams end in their
        own tasks.

        Returns:
          How many streams and lanes were ended.
        """
        return self.grants.revoke(predicate, message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point: ``lifespan``, ``http`` and ``websocket`` scopes.

        Cancellation: the server cancels a request's task when it shuts down;
        the request's feeds close with it. A push cancelled midway is atomic
        (all of its events or none), so the client's retry with the same ids
        replays. A cancelled lifespan closes the servers as shutdown would.
        """
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)

    # -- lifespan ----------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Open every server for the app's lifetime, in the lifespan task, so the
        servers' nurseries span every request."""
        await receive()  # lifespan.startup
        async with AsyncExitStack() as stack:
            try:
                for server in self.servers.values():
                    await stack.enter_async_context(server)
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    # -- HTTP ------------------------------------------------------------------------

    def _server(self, name: str) -> Server:
        server = self.servers.get(name)
        if server is None:
            raise Refusal(404, f"no contract named {name[:80]!r} is mounted here")
        return server

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = request_of(scope)
        if "content-length" in request.headers and "transfer-encoding" in request.headers:
            # Framed two ways (RFC 9112 6.3: a request smuggling vector):
            # refused before any route reads the body, which h11 would frame
            # as chunked and wait on until the body timeout; the connection
            # closes, since where this request ends is unknown.
            status, body = failure(
                Refusal(400, "a request may not carry both Content-Length and Transfer-Encoding")
            )
            await respond(send, status, body, [(b"connection", b"close")])
            return
        if self.cors is not None:
            if is_preflight(request):
                await answer_preflight(self.cors, request, send)
                return
            send = with_cors_headers(self.cors, request, send)
        try:
            segments = path_segments(scope)
            route = match(self._routes, segments, request.method)
            if route is None:
                raise Refusal(
                    404, "routes are /{contract}/{session} and /{contract}[/{session}]/ws"
                )
            await route.handler(request, receive, send, segments)
        except Disconnected:
            return
        except Exception as exc:
            status, body = failure(exc)
            headers = [(b"allow", b"GET, POST")] if status == 405 else None
            await respond(send, status, body, headers)

    def _route_table(self) -> list[Route[Handler]]:
        """The HTTP routes, in the order they are tried: the app's own under
        ``/_a2`` (those enabled), static files (with ``static=``) for paths
        outside the mounts, then each mount's lanes."""
        routes: list[Route[Handler]] = []
        if self.scheduler_secret is not None:
            scheduler = functools.partial(self._scheduler, self.scheduler_secret)
            routes.append(
                Route(("_a2", "scheduler"), scheduler, methods=_POST, refusal=_SCHEDULER_METHODS)
            )
        if self.inspect:
            routes.append(Route(("_a2", "inspect", "**"), self._inspector))
        if self.metrics:
            routes.append(Route(("_a2", "metrics"), self._metrics_route))
        routes.append(
            Route(("_a2", "health"), self._health_route, methods=_GET, refusal=_HEALTH_METHODS)
        )
        if self.static:
            routes.append(Route(("**",), self._static, when=self._outside_mounts))
        routes.append(Route(("*", "*"), self._lanes))
        return routes

    def _body(self, request: Request, receive: Receive) -> Awaitable[bytes]:
        return read_body(request, receive, self.limits)

    async def _scheduler(
        self,
        secret: str | bytes,
        request: Request,
        receive: Receive,
        send: Send,
        segments: list[str],
    ) -> None:
        body = await self._body(request, receive)
        await deliver_signed(self.servers, secret, body, request.headers)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def _inspector(
        self, request: Request, receive: Receive, send: Send, segments: list[str]
    ) -> None:
        await serve_inspector(
            self.servers,
            self.authorize,
            segments[2:],
            request,
            lambda: self._body(request, receive),
            send,
        )

    async def _metrics_route(
        self, request: Request, receive: Receive, send: Send, segments: list[str]
    ) -> None:
        await serve_metrics(self.servers, self.authorize, request, send, sockets=self.sockets_open)

    async def _health_route(
        self, request: Request, receive: Receive, send: Send, segments: list[str]
    ) -> None:
        await serve_health(self.servers, send)

    def _outside_mounts(self, segments: list[str]) -> bool:
        return segments[0] not in self.servers and segments[0] != "_a2"

    async def _static(
        self, request: Request, receive: Receive, send: Send, segments: list[str]
    ) -> None:
        await serve_static(self.static, segments, request, send)

    def _lanes(
        self, request: Request, receive: Receive, send: Send, segments: list[str]
    ) -> Awaitable[None]:
        """A mount's lanes, ``/{contract}/{session}``: an actor's (:mod:`.actors`)
        or a session's (:mod:`.sessions`). The id is checked here, once; the
        lane's own coroutine is handed back, so the busiest route adds no
        frame to every wake-up of a request."""
        server = self._server(segments[0])
        if isinstance(server.contract, Actor):
            with bad_input():
                actor = server.actor(segments[1])
            return serve_actor_http(
                server,
                actor,
                request,
                receive,
                send,
                body=lambda: self._body(request, receive),
                authorize=self.authorize,
                limits=self.limits,
                view=self.views.get(server.contract.name),
                grants=self.grants,
            )
        with bad_input():
            session = server.session(segments[1])
        return serve_session_http(
            server,
            session,
            request,
            receive,
            send,
            body=functools.partial(read_body, request, receive, self.limits),
            authorize=self.authorize,
            limits=self.limits,
            grants=self.grants,
        )

    # -- sockets --------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = request_of(scope)
        try:
            if not self.socket_origins.allows(request):
                # Before the upgrade: a page on another site gets no socket
                # (cross-site WebSocket hijacking, transport/server/cors.py).
                origin = request.headers.get("origin", "")[:80]
                logger.info("socket refused: origin %r is not allowed", origin)
                raise Refusal(
                    403, f"origin {origin!r} may not open a socket here", ErrorCode.FORBIDDEN
                )
            segments = path_segments(scope)
            route = match(self._sockets, segments, request.method)
            if route is None:
                raise Refusal(404, "sockets are /{contract}/{session}/ws and /{contract}/ws")
            serve = route.handler(request, segments)
        except Exception as exc:
            message = await receive()
            if message["type"] == "websocket.connect":
                await refuse_handshake(send, exc)
            return
        self.sockets_open += 1
        try:
            await serve(receive, send)
        finally:
            self.sockets_open -= 1

    def _socket_table(self) -> list[Route[SocketHandler]]:
        """The socket routes: a session's (or an actor's) socket, and a
        contract's multiplexed socket."""
        return [
            Route(("*", "*", "ws"), self._session_socket),
            Route(("*", "ws"), self._multiplexed_socket),
        ]

    def _session_socket(self, request: Request, segments: list[str]) -> SocketServe:
        """``/{contract}/{session}/ws``, or an actor's ``/{actor}/{id}/ws``:
        the id is checked here, once."""
        server = self._server(segments[0])
        if isinstance(server.contract, Actor):
            with bad_input():
                actor = server.actor(segments[1])
            return functools.partial(
                serve_actor_socket,
                server,
                actor,
                request,
                authorize=self.authorize,
                limits=self.limits,
                view=self.views.get(server.contract.name),
                grants=self.grants,
            )
        presence = presence_param(server, request)
        with bad_input():
            session = server.session(segments[1])
        start_after = index_param("startAfter", request.query.get("startAfter")) or 0
        return functools.partial(
            serve_session_socket,
            server,
            session,
            request,
            authorize=self.authorize,
            limits=self.limits,
            start_after=start_after,
            presence=presence,
            grants=self.grants,
        )

    def _multiplexed_socket(self, request: Request, segments: list[str]) -> SocketServe:
        """``/{contract}/ws``: its lanes' session ids are checked as they subscribe."""
        server = self._server(segments[0])
        if isinstance(server.contract, Actor):
            raise Refusal(404, "an actor's socket is /{actor}/{id}/ws")
        return functools.partial(
            serve_multiplexed_socket,
            server,
            request,
            authorize=self.authorize,
            limits=self.limits,
            presence=presence_param(server, request),
            grants=self.grants,
        )


def _check_views(servers: Mapping[str, Server], views: Mapping[str, View]) -> dict[str, View]:
    for name, view in views.items():
        server = servers.get(name)
        if server is None or not isinstance(server.contract, Actor):
            raise ValueError(f"views= names {name!r}, which is not a mounted actor")
        if not callable(view):
            raise TypeError(f"the view for {name!r} must be callable, got {view!r}")
    return dict(views)


def asgi(
    *servers: Server,
    authorize: Authorize | None = None,
    limits: Limits = DEFAULT_LIMITS,
    scheduler_secret: str | bytes | None = None,
    inspect: bool = False,
    metrics: bool = False,
    views: Mapping[str, View] | None = None,
    static: Mapping[str, Static | str | os.PathLike[str]] | None = None,
    cors: Cors | None = None,
    socket_origins: SocketOrigins = None,
) -> App:
    """An ASGI app mounting every server by its contract's name.

    Args:
      servers: one or more :class:`a2trio.Server`, each with a distinct contract.
      authorize: ``authorize(request, operation) -> bool`` (or awaitable), asked
        before every read, write and subscription; anything but ``True``
        answers 403 ``FORBIDDEN``. See :mod:`a2trio.transport.server.auth`.
      limits: body, batch, frame and lane limits and the heartbeat intervals.
      scheduler_secret: enables ``POST /_a2/scheduler`` with HMAC-signed tasks
        (:func:`~a2trio.transport.sign_task`). Without it the route is 404.
      inspect: enables ``/_a2/inspect``: the inspector page, and the JSON
        of ``server.inspect`` and its actions (:mod:`.inspector`), each
        request authorized as an :class:`~a2trio.transport.InspectOperation`
        (reads) or a ``RedriveOperation``, ``SkipOperation`` or
        ``RetryNowOperation`` (refused without a policy that allows it). Off
        by default: the routes are 404.
      metrics: enables ``GET /_a2/metrics``: the Prometheus text exposition
        of the servers' :class:`~a2trio.metrics.PrometheusMetrics`
        (:mod:`.metrics`), each scrape authorized as a
        :class:`~a2trio.transport.MetricsOperation` (refused without a
        policy that allows it). Needs ``prometheus_client`` (the ``metrics``
        extra). Off by default: the route is 404.
      views: actor name -> ``view(state, request)``: what that actor's mount
        shows of its state, on every lane alike (:mod:`.actors`). A
        server of an :func:`a2trio.actor` is mounted with the actor lanes.
      static: URL prefix to directory (or :class:`~a2trio.transport.Static`),
        e.g. ``{"/": "web"}``: ``GET``/``HEAD`` of paths the lanes do not own
        serve its files (:mod:`a2trio.transport.server.static`).
      cors: the origins whose pages may read answers
        (:class:`~a2trio.transport.Cors`); off by default.
      socket_origins: which ``Origin`` may open a socket: by default the
        app's own, the CORS origins, or none sent (non-browsers); others
        answer 403 before the upgrade. ``"*"`` turns the check off; a list
        adds origins; a callable ``(origin, request) -> bool`` decides alone.

    Raises:
      TypeError: no servers, or something that is not a server; a view that
        is not callable.
      ImportError: ``metrics=True`` without ``prometheus_client`` (the
        ``metrics`` extra).
      ValueError: two servers for one contract; an empty secret; a view for
        a name that is not a mounted actor; a static prefix without a leading
        ``/`` or a directory that is not one; a listed socket origin that is
        not an origin.
    """
    return App(
        servers,
        authorize=authorize,
        limits=limits,
        scheduler_secret=scheduler_secret,
        inspect=inspect,
        metrics=metrics,
        views=views,
        static=static,
        cors=cors,
        socket_origins=socket_origins,
    )
