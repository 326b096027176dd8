"""The memory store's presence plane: field-wise last-writer-wins registers
with expiry on the store's clock, pushed to subscribers in process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from ...clock import Clock
from ..records import PresenceRow, StoredPresencePatch

__all__ = ["MemoryPresence"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclasses.dataclass(slots=True)
class _Register:
    value: bytes
    seen: int
    at_ms: int
    expires_at_ms: int


class MemoryPresence:
    """The memory store's presence plane: registers per session, pushed to
    subscribers as they change."""

    push = True

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._registers: dict[str, dict[tuple[str, str], _Register]] = {}
        self._listeners: dict[str, set[Callable[[StoredPresencePatch], None]]] = {}

    async def set(
        self,
        session_id: str,
        participant: str,
        values: dict[str, Any],
        *,
        seen: int,
        at_ms: int,
        ttl_ms: int,
    ) -> StoredPresencePatch | None:
        await trio.lowlevel.checkpoint()
        registers = self._registers.setdefault(session_id, {})
        expires_at_ms = self._clock.now_ms() + ttl_ms
        applied: dict[str, Any] = {}
        for field, value in values.items():
            key = (participant, field)
            current = registers.get(key)
            # Field-wise LWW: a strictly newer stored `at` survives; ties go to
            # the incoming write (store-postgres.ts `presence.set`).
            if current is not None and current.at_ms > at_ms:
                continue
            if value is None:
                registers.pop(key, None)
            else:
                registers[key] = _Register(_encode(value), seen, at_ms, expires_at_ms)
            applied[field] = value
        if not registers:
            self._registers.pop(session_id, None)
        if not applied:
            return None
        patch = StoredPresencePatch(participant, applied, seen, at_ms)
        for listener in list(self._listeners.get(session_id, ())):
            listener(patch)
        return patch

    async def read(self, session_id: str) -> list[PresenceRow]:
        await trio.lowlevel.checkpoint()
        registers = self._registers.get(session_id, {})
        now = self._clock.now_ms()
        for key in [key for key, reg in registers.items() if reg.expires_at_ms <= now]:
            del registers[key]
        return [
            PresenceRow(p, f, _decode(r.value), r.seen, r.at_ms, r.expires_at_ms)
            for (p, f), r in sorted(registers.items())
        ]

    def subscribe(
        self, session_id: str, on_patch: Callable[[StoredPresencePatch], None]
    ) -> Callable[[], None]:
        listeners = self._listeners.setdefault(session_id, set())
        listeners.add(on_patch)

        def unsubscribe() -> None:
            listeners.discard(on_patch)
            if not listeners and self._listeners.get(session_id) is listeners:
                del self._listeners[session_id]

        return unsubscribe

    def forget(self, session_id: str) -> int:
        """Drop the session's rows (an erasure); how many there were."""
        return len(self._registers.pop(session_id, {}))

    def subscriber_count(self) -> int:
        return sum(len(listeners) for listeners in self._listeners.values())
