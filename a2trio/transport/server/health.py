"""``GET /_a2/health``: one round trip to each mounted server's store, timed.

``{"status": "ok", "stores": {contract: {"roundTripMs": ...}}}`` with 200
when every store answered within :data:`HEALTH_TIMEOUT_S`; the error envelope
with 503 ``STORE_UNAVAILABLE`` naming the first contract whose store did not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import trio

from ...errors import A2Error, ErrorCode
from ...server import Server
from .. import wire
from .http import Send, logger, respond

__all__ = ["HEALTH_TIMEOUT_S", "health", "serve_health"]

#: How long ``GET /_a2/health`` waits for each store before answering 503.
HEALTH_TIMEOUT_S: Final = 5.0


async def health(servers: Mapping[str, Server]) -> bytes:
    """One round trip to each server's store (an empty read), timed.

    Raises:
      A2Error: ``STORE_UNAVAILABLE`` naming the contract whose store did
        not answer within ``HEALTH_TIMEOUT_S`` (503; the cause is logged,
        never sent).
    """
    stores: dict[str, dict[str, float]] = {}
    for name, server in servers.items():
        try:
            with trio.fail_after(HEALTH_TIMEOUT_S):
                round_trip_s = await server.ping()
        except (Exception, trio.TooSlowError) as exc:
            logger.warning("health: the store for %r is unavailable: %s", name, exc)
            raise A2Error(
                ErrorCode.STORE_UNAVAILABLE, f"the store for '{name}' is unavailable"
            ) from exc
        stores[name] = {"roundTripMs": round(round_trip_s * 1000, 3)}
    return wire.encode({"status": "ok", "stores": stores})


async def serve_health(servers: Mapping[str, Server], send: Send) -> None:
    """Answer the health route (:func:`health`'s body with 200).

    Raises:
      A2Error: as :func:`health` (the app answers the envelope).
    """
    await respond(send, 200, await health(servers))
