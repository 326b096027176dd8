"""The Trio clients: the multiplexed socket (:mod:`.client`), SSE and HTTP
(:mod:`.http_client`), an actor's lanes (:mod:`.actor_client`), and what they
share: connection states, the reconnect policy and the push retry budget
(:mod:`.connection`), lanes and their reconnect loop (:mod:`.lane`), and
backscroll (:mod:`.history`).

Their public names are :mod:`a2trio.transport`'s. This package's own are the
socket client's, which lived at this path as a module before the clients were
a package; the httpx clients are not imported here (the ``client`` extra).
"""

from __future__ import annotations

from .client import CONNECT_TIMEOUT_S, Client, open_client, with_ids

__all__ = ["CONNECT_TIMEOUT_S", "Client", "open_client", "with_ids"]
