"""Pull-wake claims, acks and releases, webhook callbacks, and a
subscription's answer (Sections 6.3, 7.1-7.3).

Every callback, ack and release carries a token made for one wake of one
subscription (:meth:`~.webhooks.Signer.token`) and names that wake's id and
generation: all of them must be the subscription's current wake, or the
request is fenced (409 ``FENCED``) and nothing moves.
"""

from __future__ import annotations

import secrets
from typing import Any

from .subscription_log import Plan
from .subscription_model import (
    BEFORE_FIRST,
    Acked,
    Claimed,
    Registry,
    Released,
    Subscription,
    SubscriptionError,
    Woke,
    key_of,
    missing,
)
from .subscriptions import ZERO, Subscriptions, infos, plan

__all__ = ["acknowledge", "claim", "release", "serialize"]


def _fenced() -> SubscriptionError:
    return SubscriptionError(409, "FENCED", "Wake generation is stale")


async def claim(subs: Subscriptions, root: str, sub_id: str, worker: str) -> dict[str, Any]:
    """A pull-wake worker takes the wake (one is issued if none is).

    Raises:
      SubscriptionError: 404, 400 (not pull-wake), 409 ``ALREADY_CLAIMED``
        or ``NO_PENDING_WORK``.
    """
    key = key_of(root, sub_id)
    sub = await subs.get(root, sub_id)
    _of_type(sub, "pull-wake")
    tails = await subs.tails(sub)
    fresh_id = f"w_{secrets.token_hex(12)}"
    now = subs.now_ms

    def decide(state: Registry) -> Plan[tuple[int, str]]:
        current = state.subscriptions.get(key)
        if current is None:
            raise missing()
        wake = current.wake
        if wake is not None and wake.holder is not None and (wake.lease_until_ms or 0) > now:
            raise SubscriptionError(
                409,
                "ALREADY_CLAIMED",
                "Another worker holds the subscription",
                current_holder=wake.holder,
                generation=current.generation,
            )
        links = current.links
        if not any(p in links and tail > links[p].acked for p, tail in tails.items()):
            raise SubscriptionError(409, "NO_PENDING_WORK", "Subscription has no pending work")
        events: list[tuple[str, Any]] = []
        generation = current.generation
        if wake is not None and wake.holder is not None:
            events.append(("released", Released(key, wake.id, "lease")))
            wake = None
        wake_id = wake.id if wake is not None else fresh_id
        if wake is None:
            generation += 1
            events.append(("woke", Woke(key, generation, wake_id, tails)))
        lease = now + current.lease_ttl_ms
        events.append(("claimed", Claimed(key, wake_id, worker, lease)))
        return events, lambda _s: (generation, wake_id)

    generation, wake_id = await subs.log.write(decide)
    signer = await subs.signer()
    return {
        "wake_id": wake_id,
        "generation": generation,
        "token": signer.token(key, generation, wake_id),
        "streams": infos(sub, tails),
        "lease_ttl_ms": sub.lease_ttl_ms,
    }


async def acknowledge(
    subs: Subscriptions, root: str, sub_id: str, token: str, request: Any, *, kind: str
) -> dict[str, Any]:
    """A webhook's callback or a pull-wake worker's ack: advance cursors,
    extend the lease or (``done``) end the wake and wake again if work is
    pending.

    Raises:
      SubscriptionError: 401 ``TOKEN_INVALID``, 404, 400, 409 ``FENCED``
        or ``INVALID_OFFSET``.
    """
    wake_id, generation, acks, done = await _fence_request(subs, root, sub_id, token, request)
    key = key_of(root, sub_id)
    sub = await subs.get(root, sub_id)
    _of_type(sub, kind)
    tails = {path: await subs.tail(f"{root}/{path}") for path in acks if path in sub.links}
    now = subs.now_ms

    def decide(state: Registry) -> Plan[None]:
        current = _fence(state, key, kind, generation, wake_id)
        for path, offset in acks.items():
            link = current.links.get(path)
            if link is None:
                raise SubscriptionError(
                    409, "INVALID_OFFSET", "Ack references an unknown subscription stream"
                )
            if offset == BEFORE_FIRST or offset < link.acked:
                raise SubscriptionError(
                    409, "INVALID_OFFSET", "Ack offset regresses the committed cursor"
                )
            if offset > tails.get(path, ZERO):
                raise SubscriptionError(409, "INVALID_OFFSET", "Ack offset is beyond stream tail")
        lease = None if done else now + current.lease_ttl_ms
        return plan([("acked", Acked(key, wake_id, acks, done, lease))])

    await subs.log.write(decide)
    return {"ok": True, "next_wake": done and await subs.wake(key)}


async def release(subs: Subscriptions, root: str, sub_id: str, token: str, request: Any) -> None:
    """A pull-wake worker lets go of its wake unacked (a new one is issued
    when work is pending).

    Raises:
      SubscriptionError: as :meth:`acknowledge`.
    """
    wake_id, generation, _, _ = await _fence_request(subs, root, sub_id, token, request)
    key = key_of(root, sub_id)

    def decide(state: Registry) -> Plan[None]:
        _fence(state, key, "pull-wake", generation, wake_id)
        return plan([("released", Released(key, wake_id, "released"))])

    await subs.log.write(decide)
    await subs.wake(key)


async def _fence_request(
    subs: Subscriptions, root: str, sub_id: str, token: str, request: Any
) -> tuple[str, int, dict[str, str], bool]:
    claims = (await subs.signer()).read_token(token)
    if claims is None or claims[0] != key_of(root, sub_id):
        raise SubscriptionError(401, "TOKEN_INVALID", "Token invalid")
    if not isinstance(request, dict):
        raise SubscriptionError(400, "INVALID_REQUEST", "the body must be a JSON object")
    wake_id, generation = request.get("wake_id"), request.get("generation")
    if not isinstance(wake_id, str) or type(generation) is not int:
        raise SubscriptionError(400, "INVALID_REQUEST", "wake_id and generation are required")
    if claims[1] != generation or claims[2] != wake_id:
        raise _fenced()
    acks: dict[str, str] = {}
    for ack in request.get("acks") or []:
        path = ack.get("stream", ack.get("path")) if isinstance(ack, dict) else None
        offset = ack.get("offset") if isinstance(ack, dict) else None
        if not isinstance(path, str) or not isinstance(offset, str):
            raise SubscriptionError(400, "INVALID_REQUEST", "acks are {stream, offset} objects")
        acks[path.strip("/")] = offset
    return wake_id, generation, acks, request.get("done") is True


def serialize(sub: Subscription, base_url: str, kid: str | None) -> dict[str, Any]:
    """The subscription as ``GET`` answers it (Section 6.3)."""
    webhook: dict[str, Any] | None = None
    if sub.webhook_url is not None:
        webhook = {"url": sub.webhook_url}
        if kid is not None:
            webhook["signing"] = {
                "alg": "ed25519",
                "kid": kid,
                "jwks_url": f"{base_url}{sub.root}/__ds/jwks.json",
            }
    return {
        "id": sub.id,
        "subscription_id": sub.id,
        "type": sub.type,
        "pattern": sub.pattern,
        "streams": [
            {
                "path": p,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": link.acked,
            }
            for p, link in sub.links.items()
        ],
        "webhook": webhook,
        "wake_stream": sub.wake_stream,
        "lease_ttl_ms": sub.lease_ttl_ms,
        "created_at": sub.created_at,
        "status": sub.status,
        "description": sub.description,
    }


def _of_type(sub: Subscription, kind: str) -> None:
    if sub.type != kind:
        raise SubscriptionError(400, "INVALID_REQUEST", f"Subscription is not {kind}")


def _fence(state: Registry, key: str, kind: str, generation: int, wake_id: str) -> Subscription:
    sub = state.subscriptions.get(key)
    if sub is None:
        raise missing()
    _of_type(sub, kind)
    if sub.wake is None or sub.wake.id != wake_id or sub.generation != generation:
        raise _fenced()
    return sub
