"""The HTTP route table: rows matched in order against the path's segments.

A row names a path pattern, the methods it takes and its handler; the app
builds its table once (``asgi.App``), with the optional routes (scheduler,
inspector, static files) present only when enabled, and answers a request
with the first row that matches. Adding a route is one handler and one row.

Patterns are segment tuples: a literal matches itself, ``*`` any one segment,
and a last ``**`` any rest (none included). A row may add a ``when``
predicate over the segments. A matched row with ``methods`` refuses any other
method with 405 and its ``refusal`` text before its handler runs; a row
without them lets its handler answer every method.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from ._http import Receive, Refusal, Send
from .auth import Request

__all__ = ["Handler", "Route", "match"]

#: ``handler(request, receive, send, segments)``: answers one request.
Handler = Callable[[Request, Receive, Send, list[str]], Awaitable[None]]


class Route:
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
        handler: Handler,
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


def match(routes: Sequence[Route], segments: list[str], method: str) -> Route | None:
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
