"""Sessions over the network: the wire format, an ASGI app, SSE and WebSockets.

``asgi(*servers)`` builds the app (serve it with ``python -m a2trio.serve`` or any
ASGI server on Trio, such as hypercorn's trio worker); :mod:`.wire` holds the
frames, byte-compatible with the seed's ``wire.ts``; :func:`open_client` (the
multiplexed socket) and :func:`open_http_client` (SSE and HTTP) are Trio clients
that reconnect, resume and retry (``docs/client.md``); :func:`open_actor_client`
is one of an actor's lanes (``docs/actors.md``). For browsers: :class:`Static`
pages, :class:`Cors`, the sockets' ``Origin`` check, and signed tokens
(:func:`issue_token`, :func:`token_authorize`).

The two HTTP clients need httpx, the ``client`` extra (``pip install
'a2trio[client]'``); they are imported on first use, so serving, pushing,
streaming and the socket client need only the core install, and using one
without httpx raises ``ModuleNotFoundError`` naming the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .access import RevokePredicate
from .actor_routes import View
from .asgi import App, asgi
from .auth import (
    Authorize,
    CallOperation,
    HistoryOperation,
    InspectOperation,
    Operation,
    PushOperation,
    RedriveOperation,
    Request,
    RetryNowOperation,
    SkipOperation,
    StateOperation,
    StreamOperation,
    SubscribeOperation,
)
from .client import Client, open_client
from .connection import (
    DEFAULT_RECONNECT,
    Backoff,
    Closed,
    Connecting,
    ConnectionState,
    ConnectionWatch,
    Idle,
    Live,
    Paused,
    ReconnectPolicy,
)
from .cors import Cors, SocketOrigins
from .history import Backscroll, History
from .lane import Fold, Folded, Lane, LaneFrame
from .limits import DEFAULT_LIMITS, Limits
from .scheduler_route import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_task
from .static import Static
from .tokens import TokenClaims, issue_token, token_authorize, verify_token
from .wire import EventFrame, PresenceFrame, PresenceSnapshotFrame

if TYPE_CHECKING:
    from .actor_client import ActorClient, ActorRequestError, ActorStates, open_actor_client
    from .http_client import HttpClient, open_http_client
else:
    #: The names of the httpx clients, by module: imported on first use.
    _HTTPX_CLIENTS = {
        "ActorClient": "actor_client",
        "ActorRequestError": "actor_client",
        "ActorStates": "actor_client",
        "open_actor_client": "actor_client",
        "HttpClient": "http_client",
        "open_http_client": "http_client",
    }

    def __getattr__(name: str) -> Any:
        """Import an httpx client on first use (PEP 562).

        Raises:
          ModuleNotFoundError: httpx is not installed; the message names the
            ``client`` extra.
        """
        module = _HTTPX_CLIENTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value


__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_RECONNECT",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "ActorClient",
    "ActorRequestError",
    "ActorStates",
    "App",
    "Authorize",
    "Backoff",
    "Backscroll",
    "CallOperation",
    "Client",
    "Closed",
    "Connecting",
    "ConnectionState",
    "ConnectionWatch",
    "Cors",
    "EventFrame",
    "Fold",
    "Folded",
    "History",
    "HistoryOperation",
    "HttpClient",
    "Idle",
    "InspectOperation",
    "Lane",
    "LaneFrame",
    "Limits",
    "Live",
    "Operation",
    "Paused",
    "PresenceFrame",
    "PresenceSnapshotFrame",
    "PushOperation",
    "ReconnectPolicy",
    "RedriveOperation",
    "Request",
    "RetryNowOperation",
    "RevokePredicate",
    "SkipOperation",
    "SocketOrigins",
    "StateOperation",
    "Static",
    "StreamOperation",
    "SubscribeOperation",
    "TokenClaims",
    "View",
    "asgi",
    "issue_token",
    "open_actor_client",
    "open_client",
    "open_http_client",
    "sign_task",
    "token_authorize",
    "verify_token",
]
