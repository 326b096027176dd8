"""Lanes for ``python -m a2trio.serve`` in the Durable Streams tests, on a
store the URL of ``--store`` cannot name: Redis under a key prefix of the
test's own (``DS_TEST_REDIS_URL``, ``DS_TEST_REDIS_PREFIX``)."""

from __future__ import annotations

import os

from a2trio.stores import redis
from a2trio.transport import Cors
from a2trio.transport.durable_streams import durable_streams

__all__ = ["redis_lane"]

redis_lane = durable_streams(
    redis(os.environ["DS_TEST_REDIS_URL"], key_prefix=os.environ["DS_TEST_REDIS_PREFIX"]),
    cors=Cors("*"),
    local_webhooks=True,
)
