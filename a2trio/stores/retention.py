"""The records of a store's retention capability (issue 35): what an export
holds, what an erasure removed, and the refusal.

:class:`~a2trio.stores.base.Retention` (``store.retention``) speaks them;
``a2trio.stores.rules`` decides every refusal once (``rules.retention``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .records import OperatorAction, StoredEvent

__all__ = [
    "ArchivedSnapshot",
    "Erased",
    "RetentionError",
    "RetentionRefusal",
    "SessionArchive",
]

RetentionRefusal = Literal["claimed", "changed", "unprocessed"]


class RetentionError(ValueError):
    """A retention operation refused for its session; nothing was removed.

    ``reason``: ``claimed`` (a live claim holds one of the session's events,
    unexpired on the store's clock: its attempt is running), ``changed``
    (an erasure that expected the session at one index found it elsewhere:
    events were appended since it was read), ``unprocessed`` (an archive of
    a session with an event still to run: let it run, or skip it, first).
    The message names the session, then ``detail``.
    """

    def __init__(self, reason: RetentionRefusal, session_id: str, detail: str) -> None:
        self.reason: RetentionRefusal = reason
        self.session_id = session_id
        self.detail = detail
        super().__init__(f"session {session_id!r} {detail}")


RetentionError.__module__ = "a2trio"


class ArchivedSnapshot(msgspec.Struct, frozen=True):
    """A reducer's snapshot of a session, as an export holds it."""

    reducer_name: str
    index: int
    state: Any
    updated_at_ms: int


class SessionArchive(msgspec.Struct, frozen=True):
    """Everything a store keeps of one session, read in one transaction:
    its events with their bookkeeping (by index), its snapshots (by reducer)
    and the operator actions recorded on it (by index, then in order).

    ``index`` is the session's last index (0: no events), what an erasure
    that follows the export expects (``erase(..., expected_index=index)``).
    """

    session_id: str
    index: int
    events: list[StoredEvent]
    snapshots: list[ArchivedSnapshot]
    actions: list[OperatorAction]


class Erased(msgspec.Struct, frozen=True):
    """What an erasure removed of one session: how many events, snapshots,
    operator actions and presence rows (all zero when there was nothing
    left: an erasure repeats harmlessly). ``at_ms`` is the store's clock."""

    session_id: str
    events: int
    snapshots: int
    actions: int
    presence: int
    at_ms: int
