"""``POST /_a2/scheduler``: a durable scheduler's HTTP delivery of due tasks.

A hosted scheduler (a queue with HTTP push, a cron service) posts the task's
JSON (:data:`a2trio.scheduler.SchedulerTask`) with two headers:

* ``X-A2-Timestamp``: the signing time, whole epoch seconds;
* ``X-A2-Signature``: ``v1=`` and the hex HMAC-SHA256, over the shared secret,
  of ``<timestamp>.<body bytes>``.

Binding the timestamp into the MAC makes a captured request unusable after
:data:`MAX_SKEW_S`; delivery is idempotent (tasks carry deterministic ids), so a
replay inside the window appends nothing new. Answers: 401 without the headers,
403 for a wrong signature or a stale or future timestamp, 400 for a body that is
not a task, 404 for a contract this app does not mount, 204 once delivered, and
the task's own error status (503 for a store outage: the scheduler retries).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Final

import msgspec

from ...errors import A2Error, ErrorCode
from ...scheduler import task_decoder
from ...server import Server
from .http import Refusal, bad_input

__all__ = [
    "MAX_SKEW_S",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "deliver_signed",
    "sign_task",
    "verify_signature",
]

SIGNATURE_HEADER: Final = "x-a2-signature"
TIMESTAMP_HEADER: Final = "x-a2-timestamp"
#: How far a signature's timestamp may be from our clock, either way (5 minutes,
#: as Stripe's and Slack's webhook signatures).
MAX_SKEW_S: Final = 300


def _mac(secret: str | bytes, body: bytes, timestamp: int) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign_task(secret: str | bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The headers that authenticate ``body`` to ``POST /_a2/scheduler``.

    Args:
      secret: the app's ``scheduler_secret``.
      body: the exact bytes that will be posted.
      timestamp: epoch seconds; now when omitted.
    """
    ts = int(time.time()) if timestamp is None else timestamp
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: "v1=" + _mac(secret, body, ts)}


def verify_signature(
    secret: str | bytes, body: bytes, headers: Mapping[str, str], now_s: float
) -> None:
    """Raise a 401/403 refusal unless ``headers`` sign ``body`` within the window."""
    stamp = headers.get(TIMESTAMP_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if stamp is None or signature is None:
        raise Refusal(
            401,
            f"scheduler deliveries must be signed: send {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}",
            ErrorCode.FORBIDDEN,
        )
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise Refusal(403, f"{TIMESTAMP_HEADER} must be epoch seconds", ErrorCode.FORBIDDEN)
    ts = int(stamp)
    if abs(now_s - ts) > MAX_SKEW_S:
        raise Refusal(
            403, f"{TIMESTAMP_HEADER} is outside the {MAX_SKEW_S} s window", ErrorCode.FORBIDDEN
        )
    if not hmac.compare_digest(signature.encode(), ("v1=" + _mac(secret, body, ts)).encode()):
        raise Refusal(403, "scheduler signature does not match", ErrorCode.FORBIDDEN)


async def deliver_signed(
    servers: Mapping[str, Server],
    secret: str | bytes,
    body: bytes,
    headers: Mapping[str, str],
) -> None:
    """Verify, decode and deliver one task to its contract's server.

    Raises:
      Refusal: 401/403 (signature), 404 (unknown contract).
      A2Error: ``INVALID_PAYLOAD`` for a body that is not a task; the
        delivery's own error (``STORE_UNAVAILABLE``: the scheduler retries).

    Cancellation: as :meth:`a2trio.Server.deliver`: a delayed append is atomic
    and idempotent, so a retried delivery is safe.
    """
    verify_signature(secret, body, headers, time.time())
    try:
        task = task_decoder().decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise A2Error(ErrorCode.INVALID_PAYLOAD, f"not a scheduler task: {exc}") from None
    server = servers.get(task.contract)
    if server is None:
        raise Refusal(404, f"no contract named {task.contract!r} is mounted here")
    with bad_input():
        await server.deliver(task)
