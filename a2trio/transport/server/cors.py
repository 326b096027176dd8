"""Which browser origins may talk to the app: CORS for HTTP, Origin checks for sockets.

**CORS** (``asgi(..., cors=Cors([...]))``, off by default). A page on another
origin may read the app's answers (``fetch``, ``EventSource``) only if the
answer names its origin in ``Access-Control-Allow-Origin``. With a
:class:`Cors`, every answer to an allowed origin carries it (and
``Access-Control-Allow-Credentials`` / ``-Expose-Headers`` as configured), and
a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) of any path
answers 204 with the allowed methods and headers, or 403 for an origin that is
not allowed. Whenever the answer depends on the request's origin it says
``Vary: Origin``, so a shared cache never hands one origin's answer to another.

**Sockets** are not covered by CORS: a browser opens a WebSocket to any
origin and sends the page's cookies with it; only the ``Origin`` header tells
the server which page asked. Without a check, any site a signed-in user
visits can open a socket as that user and read the session (cross-site
WebSocket hijacking). So by default the app accepts a socket only when its
``Origin`` is the app's own (the ``Host`` it was asked on) or one the CORS
option allows, or when it sends no ``Origin`` at all (not a browser: the Trio
client, curl); any other answers 403 before the upgrade. ``socket_origins``
widens or replaces that rule (:data:`SocketOrigins`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final, Literal
from urllib.parse import urlsplit

from ...errors import A2Error, ErrorCode
from .. import wire
from .auth import Request
from .http import Message, Send

__all__ = [
    "DEFAULT_ALLOW_HEADERS",
    "DEFAULT_EXPOSE_HEADERS",
    "Cors",
    "OriginPredicate",
    "SocketOriginCheck",
    "SocketOrigins",
    "answer_preflight",
    "is_preflight",
    "normalize_origin",
    "with_cors_headers",
]

#: ``origin -> bool``: whether a page on that origin (``https://app.example``) is allowed.
OriginPredicate = Callable[[str], bool]
#: ``asgi``'s ``socket_origins``: ``None`` (own origin, CORS origins, or no
#: ``Origin``), ``"*"`` (no check), a list of further origins, or a callable
#: ``(origin, request) -> bool`` that decides alone (``origin`` is ``None``
#: when the client sent none).
SocketOrigins = None | Literal["*"] | Sequence[str] | Callable[[str | None, Request], bool]

#: Request headers a page may send by default: the push's JSON body, the
#: stream's resume point, a bearer token.
DEFAULT_ALLOW_HEADERS: Final = ("content-type", "last-event-id", "authorization")
#: Response headers a page may read by default, beyond the CORS-safelisted ones.
DEFAULT_EXPOSE_HEADERS: Final = ("last-event-id",)
_METHODS: Final = "GET, HEAD, POST"


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, without a default port.

    Raises:
      ValueError: not an origin (a path, a query, no host, not http(s)).
    """
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"not an origin: {origin!r}") from None
    scheme = parts.scheme.lower()
    if (
        scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
    default = 80 if scheme == "http" else 443
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{scheme}://{host}" + ("" if port in (None, default) else f":{port}")


class Cors:
    """The CORS option of :func:`~a2trio.transport.asgi`.

    Args:
      origins: the origins allowed to read answers: a list
        (``["https://app.example"]``), a predicate ``origin -> bool``, or
        ``"*"`` for any page (only without ``credentials``).
      credentials: send ``Access-Control-Allow-Credentials: true``, so pages
        may send cookies (``fetch(..., {credentials: "include"})``,
        ``new EventSource(url, {withCredentials: true})``).
      allow_headers: request headers a page may send (answered to preflights).
      expose_headers: response headers a page may read.
      max_age_s: how long a browser may cache a preflight's answer.

    Raises:
      TypeError: one origin as a string rather than a list.
      ValueError: an entry that is not an origin; ``"*"`` with credentials
        (it would let every site read as the signed-in user: pass a
        predicate if that is really meant).
    """

    def __init__(
        self,
        origins: Iterable[str] | OriginPredicate | Literal["*"],
        *,
        credentials: bool = False,
        allow_headers: Iterable[str] = DEFAULT_ALLOW_HEADERS,
        expose_headers: Iterable[str] = DEFAULT_EXPOSE_HEADERS,
        max_age_s: int = 600,
    ) -> None:
        self.any_origin = origins == "*"
        if self.any_origin and credentials:
            raise ValueError("Cors('*', credentials=True) is refused: list the origins")
        self.predicate: OriginPredicate | None = None
        self.origins: frozenset[str] = frozenset()
        if callable(origins):
            self.predicate = origins
        elif not self.any_origin:
            if isinstance(origins, str):
                raise TypeError(f"Cors() takes a list of origins: [{origins!r}]")
            self.origins = frozenset(normalize_origin(o) for o in origins)
        self.credentials = credentials
        self.allow_headers = ", ".join(h.lower() for h in allow_headers)
        self.expose_headers = ", ".join(h.lower() for h in expose_headers)
        self.max_age_s = max_age_s

    def __repr__(self) -> str:
        shown = "'*'" if self.any_origin else self.predicate or sorted(self.origins)
        return f"Cors({shown}, credentials={self.credentials})"

    def allows(self, origin: str) -> bool:
        """Whether a page on ``origin`` may read answers (and open sockets)."""
        if self.any_origin:
            return True
        try:
            normalized = normalize_origin(origin)
        except ValueError:
            return False
        if self.predicate is not None:
            return self.predicate(normalized) is True
        return normalized in self.origins

    def response_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """The headers an answer to a request from ``origin`` gets."""
        headers: list[tuple[bytes, bytes]] = []
        if self.any_origin:
            if origin is not None:
                headers.append((b"access-control-allow-origin", b"*"))
        else:
            headers.append((b"vary", b"Origin"))
            if origin is None or not self.allows(origin):
                return headers
            headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
            if self.credentials:
                headers.append((b"access-control-allow-credentials", b"true"))
        if self.expose_headers:
            headers.append((b"access-control-expose-headers", self.expose_headers.encode()))
        return headers

    def preflight_headers(self, origin: str | None) -> list[tuple[bytes, bytes]] | None:
        """A preflight's 204 headers, or ``None`` when ``origin`` is refused (403)."""
        if origin is None or not self.allows(origin):
            return None
        headers = [
            (b"access-control-allow-origin", b"*" if self.any_origin else origin.encode("latin-1")),
            (b"access-control-allow-methods", _METHODS.encode()),
            (b"access-control-max-age", str(self.max_age_s).encode()),
            (b"vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        ]
        if self.allow_headers:
            headers.append((b"access-control-allow-headers", self.allow_headers.encode()))
        if self.credentials:
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers


def _same_origin(origin: str, host: str | None) -> bool:
    """The page's origin names the host and port the socket was asked on. The
    scheme is not compared: behind a TLS-terminating proxy the app sees
    ``http`` for an ``https`` page."""
    if host is None:
        return False
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    default = 80 if parts.scheme == "http" else 443
    own = urlsplit(f"//{host.strip().lower()}")
    try:
        own_port = own.port
    except ValueError:
        return False
    return parts.hostname == own.hostname and (port or default) == (own_port or default)


class SocketOriginCheck:
    """The app's rule for a socket handshake's ``Origin`` (module docstring).

    Raises:
      TypeError: one origin as a string rather than a list.
      ValueError: a listed entry that is not an origin.
    """

    def __init__(self, cors: Cors | None, policy: SocketOrigins) -> None:
        self.cors = cors
        self.any_origin = policy == "*"
        self.decide: Callable[[str | None, Request], bool] | None = None
        self.origins: frozenset[str] = frozenset()
        if callable(policy):
            self.decide = policy
        elif policy is not None and not self.any_origin:
            if isinstance(policy, str):
                raise TypeError(f"socket_origins takes a list of origins: [{policy!r}]")
            self.origins = frozenset(normalize_origin(o) for o in policy)

    def allows(self, request: Request) -> bool:
        """Whether this handshake may open a socket."""
        origin = request.headers.get("origin")
        if self.any_origin:
            return True
        if self.decide is not None:
            return self.decide(origin, request) is True
        if origin is None or _same_origin(origin, request.headers.get("host")):
            return True
        if self.cors is not None and self.cors.allows(origin):
            return True
        try:
            return normalize_origin(origin) in self.origins
        except ValueError:
            return False


def is_preflight(request: Request) -> bool:
    """A browser's CORS preflight: ``OPTIONS`` naming the method it will use."""
    return request.method == "OPTIONS" and "access-control-request-method" in request.headers


async def answer_preflight(cors: Cors, request: Request, send: Send) -> None:
    """204 with the allowed methods and headers, or 403 with the envelope
    for an origin that is not allowed (the browser then refuses the request)."""
    headers = cors.preflight_headers(request.headers.get("origin"))
    if headers is None:
        origin = request.headers.get("origin", "")[:80]
        error = A2Error(ErrorCode.FORBIDDEN, f"origin {origin!r} is not allowed")
        body = wire.encode_error(error)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"vary", b"Origin"),
        ]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def with_cors_headers(cors: Cors, request: Request, send: Send) -> Send:
    """``send`` with the CORS headers for the request's origin added to the
    response's start."""
    extra = cors.response_headers(request.headers.get("origin"))

    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_with_cors
