"""The route tables: rows matched in order against the path's segments.

A row names a path pattern, the methods it takes and its handler; the app
builds its tables once (:class:`~.app.App`), one for HTTP requests, with the
optional routes (scheduler, inspector, static files) present only when
enabled, and one for socket handshakes. It answers a request with the first
row that matches. Adding a route is one handler and one row.

Patterns are segment tuples: a literal matches itself, ``*`` any one segment,
and a last ``**`` any rest (none included). A row may add a ``when``
predicate over the segments. A matched row with ``methods`` refuses any other
method with 405 and its ``refusal`` text before its handler runs; a row
without them lets its handler answer every method.

An HTTP row's handler (:data:`Handler`) answers the request. A socket row's
(:data:`SocketHandler`) reads the handshake and returns what serves the
socket, or raises: the app then refuses the upgrade with the error envelope,
so every refusal happens before the socket is accepted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .auth import Request
from .http import Receive, Refusal, Send

__all__ = ["Handler", "Route", "SocketHandler", "SocketServe", "match"]

#: ``handler(request, receive, send, segments)``: answers one request.
Handler = Callable[[Request, Receive, Send, list[str]], Awaitable[None]]
#: ``serve(receive, send)``: serves one socket, from its handshake on.
SocketServe = Callable[[Receive, Send], Awaitable[None]]
#: ``handler(request, segments)``: checks a handshake and returns what serves it.
SocketHandler = Callable[[Request, list[str]], SocketServe]
#: A row's handler: a :data:`Handler` or a :data:`SocketHandler`.
H = TypeVar("H")


class Route(Generic[H]):
    """One row of the table.

    Args:
      path: the pattern (the module docstring).
      handler: what answers a request the row matches.
      methods: the methods it takes; ``None`` for any (the handler decides).
      refusal: the 405 message for another method.
      when: a further condition on the segments.
    """

    __slots__ = ("_fixed", "_open", "handler", "methods", "path", "refusal", "when")

    def __init__(
        self,
        path: tuple[str, ...],
        handler: H,
        *,
        methods: frozenset[str] | None = None,
        refusal: str = "",
        when: Callable[[list[str]], bool] | None = None,
    ) -> None:
        self.path = path
        self.handler = handler
        self.methods = methods
        self.refusal = refusal
        self.when = when
        self._open = bool(path) and path[-1] == "**"
        self._fixed = path[:-1] if self._open else path

    def __repr__(self) -> str:
        return f"Route({'/'.join(self.path)!r})"

    def matches(self, segments: list[str]) -> bool:
        """Whether the row takes a path of these segments (any method)."""
        fixed = self._fixed
        if len(segments) != len(fixed) and not (self._open and len(segments) > len(fixed)):
            return False
        for want, got in zip(fixed, segments, strict=False):
            if want != "*" and want != got:
                return False
        return self.when is None or self.when(segments)


def match(routes: Sequence[Route[H]], segments: list[str], method: str) -> Route[H] | None:
    """The first row that matches ``segments``, or ``None``.

    Raises:
      Refusal: 405 with the row's ``refusal``, when the first matching row
        does not take ``method``.
    """
    for route in routes:
        if route.matches(segments):
            if route.methods is not None and method not in route.methods:
                raise Refusal(405, route.refusal)
            return route
    return None
