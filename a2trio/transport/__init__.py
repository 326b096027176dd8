"""Sessions over the network: the wire format, an ASGI app, SSE and WebSockets.

``asgi(*servers)`` builds the app (serve it with ``python -m a2trio.serve`` or any
ASGI server on Trio, such as hypercorn's trio worker); :mod:`.wire` holds the
frames, byte-compatible with the seed's ``wire.ts``; :func:`open_client` (the
multiplexed socket) and :func:`open_http_client` (SSE and HTTP) are Trio clients
that reconnect, resume and retry (``docs/client.md``); :func:`open_actor_client`
is one of an actor's lanes (``docs/actors.md``). For browsers: :class:`Static`
pages, :class:`Cors`, the sockets' ``Origin`` check, and signed tokens
(:func:`issue_token`, :func:`token_authorize`).

The package has two halves over the sans-I/O codecs (:mod:`.wire`, every
frame and body; :mod:`.sse`): :mod:`.server`, the app and its lanes, and
:mod:`.client`, the clients. The public names are this module's.

The two HTTP clients need httpx, the ``client`` extra (``pip install
'a2trio[client]'``); they are imported on first use, so serving, pushing,
streaming and the socket client need only the core install, and using one
without httpx raises ``ModuleNotFoundError`` naming the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .asgi import App, asgi
from .client import Client, open_client
from .client.connection import (
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
from .client.history import Backscroll, History
from .client.lane import Fold, Folded, Lane, LaneFrame
from .server.access import RevokePredicate
from .server.actors import View
from .server.auth import (
    Authorize,
    CallOperation,
    CancelOperation,
    EraseOperation,
    HistoryOperation,
    InspectOperation,
    MetricsOperation,
    Operation,
    PushOperation,
    RedriveOperation,
    Request,
    RetryNowOperation,
    SkipOperation,
    StateOperation,
    StreamOperation,
    SubscribeOperation,
    TrimOperation,
    WakeOperation,
)
from .server.cors import Cors, SocketOrigins
from .server.limits import DEFAULT_LIMITS, Limits
from .server.scheduler import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_task
from .server.static import Static
from .server.tokens import TokenClaims, issue_token, token_authorize, verify_token
from .wire import EventFrame, PresenceFrame, PresenceSnapshotFrame

if TYPE_CHECKING:
    from .client.actor_client import (
        ActorClient,
        ActorRequestError,
        ActorStates,
        open_actor_client,
    )
    from .client.http_client import HttpClient, open_http_client
else:
    #: The names of the httpx clients, by module: imported on first use.
    _HTTPX_CLIENTS = {
        "ActorClient": "client.actor_client",
        "ActorRequestError": "client.actor_client",
        "ActorStates": "client.actor_client",
        "open_actor_client": "client.actor_client",
        "HttpClient": "client.http_client",
        "open_http_client": "client.http_client",
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
    "CancelOperation",
    "Client",
    "Closed",
    "Connecting",
    "ConnectionState",
    "ConnectionWatch",
    "Cors",
    "EraseOperation",
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
    "MetricsOperation",
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
    "TrimOperation",
    "View",
    "WakeOperation",
    "asgi",
    "issue_token",
    "open_actor_client",
    "open_client",
    "open_http_client",
    "sign_task",
    "token_authorize",
    "verify_token",
]
