"""Sessions over the network: the wire format, an ASGI app, SSE and WebSockets.

``asgi(*servers)`` builds the app (serve it with ``python -m a2trio.serve`` or any
ASGI server on Trio, such as hypercorn's trio worker); :mod:`.wire` holds the
frames, byte-compatible with the seed's ``wire.ts``; :func:`open_client` is a Trio
client of the multiplexed socket.
"""

from __future__ import annotations

from .access import RevokePredicate
from .asgi import App, asgi
from .auth import (
    Authorize,
    HistoryOperation,
    InspectOperation,
    Operation,
    PushOperation,
    Request,
    StreamOperation,
    SubscribeOperation,
)
from .client import Client, Lane, open_client
from .limits import DEFAULT_LIMITS, Limits
from .scheduler_route import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_task

__all__ = [
    "DEFAULT_LIMITS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "App",
    "Authorize",
    "Client",
    "HistoryOperation",
    "InspectOperation",
    "Lane",
    "Limits",
    "Operation",
    "PushOperation",
    "Request",
    "RevokePredicate",
    "StreamOperation",
    "SubscribeOperation",
    "asgi",
    "open_client",
    "sign_task",
]
