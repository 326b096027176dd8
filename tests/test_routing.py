"""The route tables (``transport/server/routing.py``): patterns, order, 405s."""

from __future__ import annotations

import pytest

from a2trio.transport.server.auth import Request
from a2trio.transport.server.http import Receive, Refusal, Send
from a2trio.transport.server.routing import Handler, Route, match


async def nothing(request: Request, receive: Receive, send: Send, segments: list[str]) -> None:
    """A handler the table never calls: matching does no I/O."""


HEALTH = Route(("_a2", "health"), nothing, methods=frozenset({"GET"}), refusal="GET it")
INSPECT = Route(("_a2", "inspect", "**"), nothing)
STATIC = Route(("**",), nothing, when=lambda segments: segments[0] != "orders")
LANES = Route(("*", "*"), nothing)
TABLE = [HEALTH, INSPECT, STATIC, LANES]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (["_a2", "health"], HEALTH),
        (["_a2", "inspect"], INSPECT),
        (["_a2", "inspect", "sessions", "s1"], INSPECT),
        ([""], STATIC),
        (["app", "index.html"], STATIC),
        (["orders", "s1"], LANES),
        (["orders", "s1", "extra"], None),
        (["orders"], None),
    ],
)
def test_the_first_matching_row_answers(path: list[str], expected: Route[Handler] | None) -> None:
    assert match(TABLE, path, "GET") is expected


def test_a_row_refuses_the_methods_it_does_not_take() -> None:
    with pytest.raises(Refusal) as caught:
        match(TABLE, ["_a2", "health"], "POST")
    assert (caught.value.status, caught.value.error.message) == (405, "GET it")
    assert match(TABLE, ["orders", "s1"], "DELETE") is LANES
