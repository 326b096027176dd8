"""Deterministic ids: the same work, retried, writes the same rows once.

A handler that is retried after a crash or a lapsed lease appends again; the
ids of what it appends, returns and schedules are derived from stable parts
(the trigger's id, a name, a position), so the store's idempotent replay turns
the retry into a no-op instead of a duplicate.

The derivation is part of the storage format and never changes: SHA-256 over
a version tag and the parts joined with U+001F, the first 16 bytes formatted
as a UUID string. A part never contains U+001F (session ids reject it).

Events appended without an id get one from the store's :class:`IdSource`
(``ids=`` on every store; :func:`random_id` unless given one).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Protocol

__all__ = [
    "IdSource",
    "call_event_count",
    "call_event_id",
    "cron_event_id",
    "deterministic_id",
    "handler_event_id",
    "random_id",
    "returned_event_id",
    "schedule_id",
    "scheduled_event_id",
]

_SEP = "\x1f"


def deterministic_id(kind: str, *parts: str | int) -> str:
    """Hash ``kind`` and ``parts`` into a stable UUID-shaped id."""
    text = _SEP.join(["a2:v1", kind, *(str(part) for part in parts)])
    digest = hashlib.sha256(text.encode()).digest()
    return str(uuid.UUID(bytes=digest[:16]))


def handler_event_id(trigger_id: str, name: str, position: int) -> str:
    """Id of the ``position``-th event of ``ctx.session.append(name, ...)``."""
    return deterministic_id("append", trigger_id, name, position)


def returned_event_id(trigger_id: str, position: int) -> str:
    """Id of the ``position``-th event a handler returns."""
    return deterministic_id("returned", trigger_id, position)


def call_event_id(contract: str, actor_id: str, message_id: str, position: int, count: int) -> str:
    """Id of the ``position``-th of the ``count`` events an actor call with
    ``message_id`` commits (``engine/actor_calls.py``). The first id leaves the count
    out, so a retry finds it without knowing it; the others hash it in, so a
    batch of another size under the same ``message_id`` never replays as a
    part of this one (the store refuses the mix), and end with ``/<count>``,
    so a retry reads the size off the second row (:func:`call_event_count`)."""
    if position == 0:
        return deterministic_id("call", contract, actor_id, message_id, 0)
    digest = deterministic_id("call", contract, actor_id, message_id, position, count)
    return f"{digest}/{count}"


def call_event_count(contract: str, actor_id: str, message_id: str, second_id: str) -> int | None:
    """The size of the call batch whose second event has id ``second_id``, or
    None if that event is not the second of this call's batch."""
    _, _, suffix = second_id.rpartition("/")
    if not suffix.isdigit() or suffix.startswith("0"):
        return None
    count = int(suffix)
    if count < 2 or second_id != call_event_id(contract, actor_id, message_id, 1, count):
        return None
    return count


def cron_event_id(contract: str, session_id: str, name: str, slot_ms: int, position: int) -> str:
    """Id of the ``position``-th event a cron named ``name`` appends to
    ``session_id`` for its slot at epoch ``slot_ms``: every process that fires
    the slot writes the same ids, so one append lands (``engine/crons.py``)."""
    return deterministic_id("cron", contract, session_id, name, slot_ms, position)


def schedule_id(contract: str, session_id: str, trigger_id: str | None, name: str) -> str:
    """Id of a schedule: one per (contract, session, trigger or none, name)."""
    return deterministic_id("schedule", contract, session_id, trigger_id or "", name)


def scheduled_event_id(schedule: str, position: int) -> str:
    """Id of the ``position``-th event of a schedule."""
    return deterministic_id("scheduled", schedule, position)


class IdSource(Protocol):
    """Where a store gets the ids it generates: those of events appended
    without one (the seed's ``IdSource``). Any ``() -> str`` is one, e.g.
    ``map("e-{}".format, itertools.count(1)).__next__`` for ids a test can
    predict; the default is :func:`random_id`.

    Each call must return a new non-empty string that no event in the store
    holds, in any session, ever (an id is store-wide and permanent): an id
    that repeats a stored one makes the append collide or replay the stored
    row. The store calls it once per event without an id, in batch order,
    before it writes, on the caller's Trio thread; it must not block.
    """

    def __call__(self) -> str:
        """A fresh id."""


#: The RFC 4122 variant's first hex digit, by the two random bits it keeps.
_VARIANT = "89ab"


def random_id() -> str:
    """A fresh random id for an event appended without one: a version 4
    UUID's text, as ``str(uuid.uuid4())`` writes it."""
    # Formatted from the bytes directly: 1.0 against 2.5 µs, once per event.
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"
