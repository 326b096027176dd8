"""The presence plane: ephemeral per-participant fields beside the log.

Presence (cursors, typing, progress) is never appended: each (participant,
field) is a last-writer-wins register on the sender's ``at`` stamp, expiring
``presence_ttl_ms`` after its last write on the store's clock.

Two tiers, chosen by the store:

* **push** (memory, Postgres): the store delivers each applied patch to
  subscribers as it applies.
* **degraded** (sqlite): the feed re-reads the map and diffs it against what it
  has painted, on the event feed's cadence and at least every ``poll_idle_s``.
  Later, never lost while watched; cleared and expired fields surface as
  ``None`` patches.

The two-plane feed (``session.stream(presence=True)``) yields exactly one
:class:`PresenceSnapshot` first, then patches interleaved with events. It
subscribes before reading the snapshot, so a patch landing in between is
painted twice, never lost (repaints are idempotent). Arrivals wait in a
coalescing queue keyed by (participant, field) with per-field LWW, so a stalled
reader holds at most the live presence cardinality, never the arrival history.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from ..contract import Event
from ..identifiers import MAX_SAFE_INTEGER, check_participant
from ..push import MAX_DATE_MS, RESERVED_PARTICIPANTS, PushedPresence, PushValidation
from ..stores.base import PresenceRow, PresenceStore, StoredPresencePatch
from ..stores.feed import Feed, own_tasks
from .context import Engine
from .inputs import check_push

__all__ = [
    "PresenceMap",
    "PresencePatch",
    "PresenceSnapshot",
    "PresenceValue",
    "ValidatedPatch",
    "check_pushed_presence",
    "open_presence_feed",
    "read_presence",
    "set_presence",
    "store_patch",
    "validate_patch",
]

_fingerprint = msgspec.json.Encoder(order="sorted").encode


class PresenceValue(msgspec.Struct, frozen=True):
    """One field's value with its stamps: the index the sender had seen and its
    LWW stamp in epoch ms."""

    value: Any
    seen: int
    at_ms: int


#: participant -> field -> value with stamps.
PresenceMap = dict[str, dict[str, PresenceValue]]


class PresencePatch(msgspec.Struct, frozen=True):
    """A change to one participant's fields; a ``None`` value clears a field."""

    participant: str
    values: dict[str, Any]
    seen: int
    at_ms: int


class PresenceSnapshot(msgspec.Struct, frozen=True):
    """The whole pruned map: the first item of a two-plane feed."""

    snapshot: PresenceMap


def _api(engine: Engine) -> PresenceStore:
    if not engine.contract.declares_presence:
        raise TypeError(f"contract '{engine.contract.name}' declares no presence fields")
    api = engine.store.presence
    assert api is not None  # checked at construction
    return api


class ValidatedPatch(msgspec.Struct, frozen=True):
    """A validated patch, ready to store."""

    participant: str
    values: dict[str, Any]
    seen: int
    at: int | None


async def set_presence(
    engine: Engine,
    session_id: str,
    participant: str | PushedPresence,
    values: Mapping[str, Any],
    seen: int | None,
    at: int | None,
    fallback_seen: int,
) -> None:
    """Validate the whole patch, then store it (see ``Session.set_presence``)."""
    if isinstance(participant, PushedPresence):
        patch = await check_pushed_presence(engine, session_id, participant)
    else:
        patch = validate_patch(engine, participant, values, seen, at, fallback_seen)
    await store_patch(engine, session_id, patch)


async def check_pushed_presence(
    engine: Engine, session_id: str, pushed: PushedPresence
) -> ValidatedPatch | None:
    """Ask ``validate_push`` about a patch from the wire, then validate it;
    nothing is stored. None for a patch with no fields."""
    _api(engine)
    # Copy before the hook: authorization must not rewrite what is stored.
    values = dict(pushed.values)
    await check_push(
        engine, PushValidation(session_id, (), msgspec.structs.replace(pushed, values=dict(values)))
    )
    return validate_patch(engine, pushed.participant, values, pushed.seen, pushed.at, 0)


def validate_patch(
    engine: Engine,
    participant: str,
    values: Mapping[str, Any],
    seen: int | None,
    at: int | None,
    fallback_seen: int,
) -> ValidatedPatch | None:
    """Validate a patch without I/O; None for a patch with no fields.

    Raises:
      A2Error: ``UNKNOWN_PRESENCE_FIELD`` or ``INVALID_PAYLOAD``.
      TypeError / ValueError: a bad participant, ``at`` or ``seen``; a
        contract without presence.
    """
    _api(engine)
    check_participant(participant)
    if participant in RESERVED_PARTICIPANTS:
        raise ValueError(f"presence participant must not be {participant!r}")
    if at is not None:
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise TypeError(f"presence at must be epoch milliseconds, got {at!r}")
        if not math.isfinite(at) or not 0 <= at <= MAX_DATE_MS:
            raise ValueError(f"presence at must be epoch milliseconds in range, got {at!r}")
    if seen is not None and (
        isinstance(seen, bool) or not isinstance(seen, int) or not 0 <= seen <= MAX_SAFE_INTEGER
    ):
        raise ValueError(
            f"presence seen must be a non-negative integer up to 2**53 - 1, got {seen!r}"
        )
    if not isinstance(values, Mapping):
        raise TypeError(f"presence values must be a mapping of field -> value, got {values!r}")
    validated: dict[str, Any] = {}
    for field, value in values.items():
        validated[field] = (
            None if value is None else engine.contract.validate_presence(field, value)
        )
        if value is None and field not in engine.contract.presence:
            engine.contract.validate_presence(field, True)  # raises UNKNOWN_PRESENCE_FIELD
    if not validated:
        return None
    return ValidatedPatch(
        participant,
        validated,
        seen if seen is not None else fallback_seen,
        int(at) if at is not None else None,
    )


async def store_patch(engine: Engine, session_id: str, patch: ValidatedPatch | None) -> None:
    """Store a validated patch (receipt time when it carries no ``at``)."""
    if patch is None:
        return
    await _api(engine).set(
        engine.key(session_id),
        patch.participant,
        patch.values,
        seen=patch.seen,
        at_ms=patch.at if patch.at is not None else engine.clock.now_ms(),
        ttl_ms=engine.presence_ttl_ms,
    )


def _fold(engine: Engine, rows: list[PresenceRow]) -> PresenceMap:
    presence: PresenceMap = {}
    for row in rows:
        presence.setdefault(row.participant, {})[row.field] = PresenceValue(
            engine.contract.decode_presence(row.field, row.value), row.seen, row.at_ms
        )
    return presence


async def read_presence(engine: Engine, session_id: str) -> PresenceMap:
    """The pruned presence map of a session."""
    api = _api(engine)
    rows = await api.read(engine.key(session_id))
    return _fold(engine, rows)


class _Stamp(msgspec.Struct, frozen=True):
    seen: int
    at_ms: int
    value: bytes


class _TwoPlaneFeed(Feed["Event[Any] | PresencePatch | PresenceSnapshot"]):
    def __init__(self, engine: Engine, session_id: str, api: PresenceStore) -> None:
        self._engine = engine
        self._session_id = session_id
        self._key = engine.key(session_id)
        self._api = api
        self._snapshot: PresenceSnapshot | None = None
        self._painted: dict[tuple[str, str], _Stamp] = {}
        self._queue: dict[tuple[str, str], tuple[Any, int, int]] = {}
        self._event: Event[Any] | None = None
        self._taken = trio.Event()
        self._wake = trio.Event()
        self._events_flowing = trio.Event()
        self._error: BaseException | None = None
        self._done = False

    def queued(self) -> int:
        """Patches waiting in the coalescing queue (bounded by the live cardinality)."""
        return len(self._queue)

    def enqueue(self, patch: StoredPresencePatch) -> None:
        for field, value in patch.values.items():
            key = (patch.participant, field)
            queued = self._queue.get(key)
            # Per-field LWW inside the queue: delivery order is not apply order.
            if queued is not None and queued[2] > patch.at_ms:
                continue
            self._queue[key] = (value, patch.seen, patch.at_ms)
        self._wake.set()

    def _paint(self, key: tuple[str, str], value: Any, seen: int, at_ms: int) -> None:
        if value is None:
            self._painted.pop(key, None)
        else:
            self._painted[key] = _Stamp(seen, at_ms, _fingerprint(value))

    def _painted_already(self, key: tuple[str, str], value: Any, seen: int, at_ms: int) -> bool:
        painted = self._painted.get(key)
        if value is None:
            return painted is None
        return painted == _Stamp(seen, at_ms, _fingerprint(value))

    def _diff(self, rows: list[PresenceRow]) -> bool:
        """Queue what changed since the last paint; return whether anything did."""
        changed = False
        live = set()
        for row in rows:
            key = (row.participant, row.field)
            live.add(key)
            stamp = _Stamp(row.seen, row.at_ms, _fingerprint(row.value))
            if self._painted.get(key) != stamp and key not in self._queue:
                changed = True
                self.enqueue(
                    StoredPresencePatch(
                        row.participant, {row.field: row.value}, row.seen, row.at_ms
                    )
                )
        now = self._engine.clock.now_ms()
        for key, prior in list(self._painted.items()):
            if key not in live and key not in self._queue:
                # A cleared or expired field has no row left: its last painted
                # `seen` and the observation time are the honest stamps.
                changed = True
                self.enqueue(StoredPresencePatch(key[0], {key[1]: None}, prior.seen, now))
        return changed

    async def start(self, nursery: trio.Nursery, start_after: int) -> None:
        rows = await self._api.read(self._key)
        for row in rows:
            self._paint((row.participant, row.field), row.value, row.seen, row.at_ms)
        self._snapshot = PresenceSnapshot(_fold(self._engine, rows))
        nursery.start_soon(self._pump_events, start_after)
        nursery.start_soon(self._reconcile)

    async def _pump_events(self, start_after: int) -> None:
        try:
            # The session's shared event feed (see fanout.py), typed already.
            async with self._engine.feeds.open(self._session_id, start_after) as events:
                async for event in events:
                    self._event = event
                    self._taken = trio.Event()
                    self._events_flowing.set()
                    self._wake.set()
                    await self._taken.wait()
        except Exception as exc:
            self._error = exc
        self._done = True
        self._wake.set()

    async def _reconcile(self) -> None:
        """Re-read the map and diff it against what this feed painted.

        Degraded tier: this is the delivery path, on an adaptive cadence:
        ``poll_active_s`` after a change or an event, doubling to
        ``poll_idle_s`` while nothing changes. Push tier: a safety read that
        starts at ``poll_active_s`` and doubles to ``notify_safety_s``. The
        early reads find a patch that another process committed before this
        store's listener was on (no one heard its notification); the later
        ones surface expired fields (which no store broadcasts) as ``None``.
        """
        timings = self._engine.timings
        push = self._api.push
        interval = timings.poll_active_s
        while True:
            self._events_flowing = trio.Event()
            with trio.move_on_after(interval):
                if push:
                    await trio.sleep_forever()
                await self._events_flowing.wait()
            event_seen = self._events_flowing.is_set()
            try:
                rows = await self._api.read(self._key)
            except Exception as exc:
                self._error = exc
                self._done = True
                self._wake.set()
                return
            changed = self._diff(rows)
            if push:
                interval = min(interval * 2, timings.notify_safety_s)
            elif changed or event_seen:
                interval = timings.poll_active_s
            else:
                interval = min(interval * 2, timings.poll_idle_s)

    async def receive(self) -> Event[Any] | PresencePatch | PresenceSnapshot:
        while True:
            if self._snapshot is not None:
                snapshot, self._snapshot = self._snapshot, None
                return snapshot
            if self._queue:
                key = next(iter(self._queue))
                value, seen, at_ms = self._queue.pop(key)
                if self._painted_already(key, value, seen, at_ms):
                    continue  # a repaint of what the reader has: nothing to say
                self._paint(key, value, seen, at_ms)
                values = {key[1]: self._engine.contract.decode_presence(key[1], value)}
                return PresencePatch(key[0], values, seen, at_ms)
            if self._event is not None:
                event, self._event = self._event, None
                self._taken.set()
                return event
            if self._done:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wake = trio.Event()
            await self._wake.wait()


@asynccontextmanager
async def open_presence_feed(
    engine: Engine, session_id: str, start_after: int
) -> AsyncIterator[_TwoPlaneFeed]:
    """The two-plane feed; see the module docstring."""
    api = _api(engine)
    key = engine.key(session_id)
    feed = _TwoPlaneFeed(engine, session_id, api)
    unsubscribe = api.subscribe(key, feed.enqueue) if api.push else None
    try:
        async with own_tasks() as nursery:
            await feed.start(nursery, start_after)
            yield feed
    finally:
        if unsubscribe is not None:
            unsubscribe()
