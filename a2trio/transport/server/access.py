"""Withdrawing access from what is already open: SSE streams and socket lanes.

``authorize`` is asked when a stream or a lane opens. Access can end later (a
user is removed from a board, a token expires), so every open stream and lane
is registered here with the request and operation it was authorized for, and
ends in two ways:

* **re-asked**: every ``Limits.reauthorize_s`` each open stream and lane asks
  ``authorize`` again; a refusal ends it;
* **revoked**: ``App.revoke(predicate)`` ends, at once, every open stream and
  lane whose ``(request, operation)`` the predicate matches.

An end is *resumable*: an SSE stream gets a last ``error`` frame with the
``FORBIDDEN`` envelope (the client reconnects with ``Last-Event-ID`` and is
asked again); a multiplexed lane gets ``unsubscribed`` with reason
``forbidden``; a single-session socket closes with 1008. Nothing written is
undone: this governs reading, and writes are authorized one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

from ...errors import A2Error, ErrorCode
from .. import wire
from .auth import Authorize, Operation, Request, check_authorized
from .http import report

__all__ = ["Grants", "RevokePredicate", "Withdrawal", "reauthorize", "under_review"]

#: ``predicate(request, operation) -> bool``: True ends the stream or lane.
RevokePredicate = Callable[[Request, Operation], bool]
#: How a stream or lane is told to end, with the error its client is sent.
End = Callable[[A2Error], None]


class _Grant:
    __slots__ = ("end", "operation", "request")

    def __init__(self, request: Request, operation: Operation, end: End) -> None:
        self.request = request
        self.operation = operation
        self.end = end


class Grants:
    """The open streams and lanes of one app, each with what it was authorized for."""

    def __init__(self) -> None:
        self._open: set[_Grant] = set()

    def __len__(self) -> int:
        return len(self._open)

    @contextmanager
    def holding(self, request: Request, operation: Operation, end: End) -> Iterator[None]:
        """Register an open stream or lane for the block's duration; ``end`` is
        called (synchronously, at most once) if access is revoked meanwhile."""
        grant = _Grant(request, operation, end)
        self._open.add(grant)
        try:
            yield
        finally:
            self._open.discard(grant)

    def revoke(self, predicate: RevokePredicate, message: str) -> int:
        """End every open grant the predicate matches; return how many."""
        matched = [g for g in list(self._open) if predicate(g.request, g.operation)]
        for grant in matched:
            self._open.discard(grant)
            grant.end(A2Error(ErrorCode.FORBIDDEN, message))
        return len(matched)


async def reauthorize(
    authorize: Authorize, request: Request, operation: Operation, interval_s: float, end: End
) -> None:
    """Ask ``authorize`` again every ``interval_s`` until it refuses, then
    ``end`` the stream or lane with the refusal. A policy that crashes ends it
    too (logged; the client is told a retryable ``STORE_UNAVAILABLE``): access
    fails closed."""
    while True:
        await trio.sleep(interval_s)
        try:
            await check_authorized(authorize, request, operation)
        except A2Error as exc:
            end(exc)
            return
        except Exception as exc:
            report(exc)
            end(wire.as_a2_error(exc))
            return


class Withdrawal:
    """How an open stream or lane is ended (an :data:`End`): the first error
    is kept for its client, and ``scope``, which the stream or lane runs in,
    is cancelled."""

    __slots__ = ("error", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.error: A2Error | None = None

    def __call__(self, error: A2Error) -> None:
        if self.error is None:
            self.error = error
            self.scope.cancel(reason="access withdrawn")


@contextmanager
def under_review(
    nursery: trio.Nursery,
    grants: Grants,
    authorize: Authorize | None,
    request: Request,
    operation: Operation,
    reauthorize_s: float | None,
    end: End,
) -> Iterator[None]:
    """Keep an open stream or lane's access under review for the block: held
    in ``grants`` (so ``App.revoke`` reaches it) and, with an ``authorize``
    policy and a ``reauthorize_s``, re-asked in a task of ``nursery``.
    Either way a withdrawal calls ``end``."""
    if authorize is not None and reauthorize_s is not None:
        nursery.start_soon(reauthorize, authorize, request, operation, reauthorize_s, end)
    with grants.holding(request, operation, end):
        yield
