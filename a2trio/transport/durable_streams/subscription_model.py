"""Subscriptions (Sections 6 and 7) as one a2trio session: the contract, the
state it folds to, the glob.

Every subscription of a store lives in one session, ``all``, of the
built-in contract ``durable_streams_subscriptions``, and every change to one
is an event, committed conditionally on the session's index as stream
writes are, so any lane process on the store decides on the same state:

=============== ===============================================================
event           what changed
=============== ===============================================================
``keyed``       the webhook signing seed (the session's first event)
``subscribed``  a subscription: its configuration and first links
``unsubscribed`` it is deleted (tombstoned: its callbacks fail)
``linked``      streams linked (by glob or explicitly), at an acked offset
``unlinked``    a link removed (an explicit one, or a deleted stream's glob)
``woke``        a wake: generation, wake id, the tails it covers, its lease
``claimed``     a pull-wake worker holds the wake, with a lease
``acked``       cursors advanced (``done``: the wake ends)
``released``    the wake ends unacked (released, or its lease ran out)
``failed``      a webhook delivery failed: the next attempt's time
``retrying``    that attempt was taken (by one process)
``delivered``   the webhook answered 2xx
=============== ===============================================================

A subscription's key is its stream root and id (``root\\x1fid``): the lane
serves any path, so ``/v1/stream/__ds/subscriptions/s1`` and
``/__ds/subscriptions/s1`` are two subscriptions, over the streams under
``/v1/stream/`` and ``/``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final, Literal, NamedTuple

import msgspec

from ... import Event, Reducer, contract

__all__ = [
    "BEFORE_FIRST",
    "CONTRACT",
    "REDUCER",
    "SESSION",
    "Config",
    "Link",
    "Registry",
    "Subscribed",
    "Subscription",
    "SubscriptionError",
    "Wake",
    "fold",
    "glob_match",
    "key_of",
    "missing",
    "relative",
]

#: The offset a stream first linked by its first append is acked at: before
#: everything (Section 6.2: "linked before that append").
BEFORE_FIRST: Final = "-1"
#: The session holding every subscription of the store.
SESSION: Final = "all"

LinkKind = Literal["glob", "explicit"]


class Link(msgspec.Struct):
    """A linked stream: how it is linked and its cursor (inclusive)."""

    acked: str
    glob: bool = False
    explicit: bool = False


class Wake(msgspec.Struct):
    """A wake in flight: its id, the tails it covers (what a synchronous
    ``done`` acks), the worker holding it and its lease, and the webhook's
    retry schedule."""

    id: str
    snapshot: dict[str, str]
    holder: str | None = None
    lease_until_ms: int | None = None
    attempts: int = 0
    next_attempt_ms: int | None = None


class Subscription(msgspec.Struct):
    id: str
    root: str
    type: Literal["webhook", "pull-wake"]
    config_hash: str
    created_at: str
    base_url: str
    lease_ttl_ms: int
    pattern: str | None = None
    streams: list[str] = msgspec.field(default_factory=list)
    webhook_url: str | None = None
    wake_stream: str | None = None
    description: str | None = None
    links: dict[str, Link] = msgspec.field(default_factory=dict)
    generation: int = 0
    wake: Wake | None = None
    status: Literal["active", "failed"] = "active"


class Keyed(msgspec.Struct, frozen=True):
    seed: bytes


class Subscribed(msgspec.Struct, frozen=True):
    key: str
    subscription: Subscription


class Keyref(msgspec.Struct, frozen=True):
    key: str


class Linked(msgspec.Struct, frozen=True):
    key: str
    kind: LinkKind
    paths: dict[str, str]  # path -> acked offset, for links that are new


class Unlinked(msgspec.Struct, frozen=True):
    key: str
    kind: LinkKind
    path: str


class Woke(msgspec.Struct, frozen=True):
    key: str
    generation: int
    wake_id: str
    snapshot: dict[str, str]
    lease_until_ms: int | None = None
    holder: str | None = None


class Claimed(msgspec.Struct, frozen=True):
    key: str
    wake_id: str
    holder: str
    lease_until_ms: int


class Acked(msgspec.Struct, frozen=True):
    key: str
    wake_id: str
    offsets: dict[str, str]
    done: bool
    lease_until_ms: int | None = None


class Released(msgspec.Struct, frozen=True):
    key: str
    wake_id: str
    reason: Literal["released", "lease"]


class Failed(msgspec.Struct, frozen=True):
    key: str
    wake_id: str
    next_attempt_ms: int


class Retrying(msgspec.Struct, frozen=True):
    key: str
    wake_id: str
    lease_until_ms: int


class Delivered(msgspec.Struct, frozen=True):
    key: str
    wake_id: str


#: The built-in contract the subscriptions session is of.
CONTRACT: Final = contract(
    "durable_streams_subscriptions",
    events={
        "keyed": Keyed,
        "subscribed": Subscribed,
        "unsubscribed": Keyref,
        "linked": Linked,
        "unlinked": Unlinked,
        "woke": Woke,
        "claimed": Claimed,
        "acked": Acked,
        "released": Released,
        "failed": Failed,
        "retrying": Retrying,
        "delivered": Delivered,
    },
)


class Registry(msgspec.Struct):
    """Every subscription of the store, folded; ``index`` the last event."""

    index: int = 0
    seed: bytes | None = None
    subscriptions: dict[str, Subscription] = msgspec.field(default_factory=dict)


def _end_wake(sub: Subscription) -> None:
    sub.wake = None
    sub.status = "active"


def _apply(sub: Subscription, kind: str, payload: Any) -> None:
    wake = sub.wake
    if kind == "linked":
        for path, acked in payload.paths.items():
            link = sub.links.get(path)
            if link is None:
                link = sub.links[path] = Link(acked)
            if payload.kind == "glob":
                link.glob = True
            else:
                link.explicit = True
    elif kind == "unlinked":
        link = sub.links.get(payload.path)
        if link is not None:
            if payload.kind == "glob":
                link.glob = False
            else:
                link.explicit = False
            if not (link.glob or link.explicit):
                del sub.links[payload.path]
    elif kind == "woke":
        sub.generation = payload.generation
        sub.wake = Wake(
            payload.wake_id, dict(payload.snapshot), payload.holder, payload.lease_until_ms
        )
    elif wake is None or wake.id != payload.wake_id:
        return  # about a wake that has ended
    elif kind == "claimed":
        wake.holder = payload.holder
        wake.lease_until_ms = payload.lease_until_ms
    elif kind == "acked":
        for path, offset in payload.offsets.items():
            if path in sub.links:
                sub.links[path].acked = offset
        if payload.done:
            _end_wake(sub)
        elif payload.lease_until_ms is not None:
            wake.lease_until_ms = payload.lease_until_ms
    elif kind == "released":
        _end_wake(sub)
    elif kind == "failed":
        wake.attempts += 1
        wake.next_attempt_ms = payload.next_attempt_ms
        sub.status = "failed"
    elif kind == "retrying":
        wake.next_attempt_ms = None
        wake.lease_until_ms = payload.lease_until_ms
    elif kind == "delivered":
        wake.attempts = 0
        sub.status = "active"


def fold(state: Registry, event: Event[Any]) -> Registry:
    """Fold one event of the subscriptions session into its state (in place)."""
    state.index = event.index
    kind = event.type
    payload = event.payload
    if kind == "keyed":
        if state.seed is None:
            state.seed = payload.seed
    elif kind == "subscribed":
        state.subscriptions[payload.key] = msgspec.structs.replace(payload.subscription)
    elif kind == "unsubscribed":
        state.subscriptions.pop(payload.key, None)
    else:
        sub = state.subscriptions.get(payload.key)
        if sub is not None:
            _apply(sub, kind, payload)
    return state


#: The fold as a reducer: the subscriptions are a snapshot away after a restart.
REDUCER: Final[Reducer[Registry]] = Reducer("durable_streams_subscriptions.state", Registry(), fold)


class SubscriptionError(Exception):
    """A request refused with the protocol's error envelope (nothing written)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"code": code, "message": message, **extra}}


class Config(NamedTuple):
    """A subscription's configuration, as ``PUT`` gave it (normalized)."""

    type: str
    pattern: str | None
    streams: tuple[str, ...]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None

    def digest(self) -> str:
        canonical = self._replace(streams=tuple(sorted(set(self.streams))))._asdict()
        return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def key_of(root: str, sub_id: str) -> str:
    return f"{root}\x1f{sub_id}"


def relative(root: str, path: str) -> str | None:
    """``path`` relative to the stream root ``root``; ``None`` outside it or
    under the reserved ``__ds``."""
    if not path.startswith(root + "/"):
        return None
    rest = path[len(root) + 1 :]
    if not rest or rest.split("/", 1)[0] == "__ds":
        return None
    return rest


def missing() -> SubscriptionError:
    return SubscriptionError(404, "SUBSCRIPTION_NOT_FOUND", "Subscription not found")


def _segments(path: str) -> list[str]:
    return [s for s in path.strip("/").split("/") if s]


def glob_match(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern``: ``*`` is one segment, ``**``
    zero or more (Section 6.2)."""
    wanted, given = _segments(pattern), _segments(path)

    def match(p: int, s: int) -> bool:
        while p < len(wanted) and s < len(given):
            segment = wanted[p]
            if segment == "**":
                return any(match(p + 1, i) for i in range(s, len(given) + 1))
            if segment != "*" and segment != given[s]:
                return False
            p, s = p + 1, s + 1
        while p < len(wanted) and wanted[p] == "**":
            p += 1
        return p == len(wanted) and s == len(given)

    return match(0, 0)
