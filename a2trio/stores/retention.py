"""A store's retention capability (issue 35): the protocol
(:class:`Retention`, ``store.retention``, re-exported by
:mod:`a2trio.stores.base` with the other capabilities) and its records:
what an export holds, what an erasure and a trim removed, and the refusal.
``a2trio.stores.rules`` decides every refusal once (``rules.retention``).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from .records import OperatorAction, StoredEvent

__all__ = [
    "ArchivedSnapshot",
    "Erased",
    "Retention",
    "RetentionError",
    "RetentionRefusal",
    "SessionArchive",
    "Trimmed",
]

RetentionRefusal = Literal["claimed", "changed", "no_snapshot", "unprocessed"]


class RetentionError(ValueError):
    """A retention operation refused for its session; nothing was removed.

    ``reason``: ``claimed`` (a live claim holds one of the session's events,
    unexpired on the store's clock: its attempt is running), ``changed``
    (an erasure that expected the session at one index found it elsewhere:
    events were appended since it was read), ``no_snapshot`` (a trim names a
    reducer with no snapshot of the session), ``unprocessed`` (an archive of
    a session with an event still to run, or a trim with an unprocessed
    event, dead or alive, at or below its trim point: let it run, skip or
    redrive it first). The message names the session, then ``detail``.
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


class Trimmed(msgspec.Struct, frozen=True):
    """What a trim removed: the session's events at or below
    ``through_index`` are gone (``events`` of them by this trim; 0 when an
    earlier trim took them already). ``at_ms`` is the store's clock."""

    session_id: str
    reducer_name: str
    through_index: int
    events: int
    at_ms: int


class Retention(Protocol):
    """The optional retention capability (``store.retention``: memory,
    SQLite, Postgres, Redis; issue 35): read a session whole, erase it with
    everything derived from it, trim its events below a snapshot.

    Every operation is one transaction (a script on Redis) that reads the
    session's claims and decides with ``rules`` (``check_unclaimed``,
    ``check_expected``, ``check_trim``) before it removes anything: a live
    claim on any of the session's events (unexpired on the store's clock)
    refuses it with :class:`RetentionError`, and a refused operation removes
    nothing. None of them keeps a copy of what it removed.
    """

    async def export(self, session_id: str) -> SessionArchive:
        """The session's events with their bookkeeping, its snapshots and the
        operator actions recorded on it, read in one transaction (an empty
        archive, index 0, for a session the store does not hold).

        Cancellation: a read."""
        ...

    async def erase(self, session_id: str, *, expected_index: int | None = None) -> Erased:
        """Remove the session and everything derived from it: its events (and
        their ids, which may then be appended again, as new), snapshots,
        operator actions and presence rows. An erased session reads as one
        never written; its next append is index 1. Erasing a session the
        store does not hold removes nothing and answers zeros.

        With ``expected_index``, remove it only if its last index is still
        that one (an export's ``index``: nothing appended since).

        Raises:
          RetentionError: ``claimed``, ``changed``.

        Cancellation: removed entirely or not at all; repeating it is safe.
        """
        ...

    async def trim(self, session_id: str, reducer: str) -> Trimmed:
        """Remove the session's events at or below the trim point: the index
        of ``reducer``'s snapshot, or the one before the last index, whichever
        is lower (the last event always stays, so indexes go on). Their ids
        are forgotten with them; snapshots, presence and operator actions
        stay. A trim at or below an earlier one removes nothing.

        Raises:
          RetentionError: ``claimed``, ``no_snapshot``, ``unprocessed`` (an
            event at or below the trim point has work left or is a dead
            letter).

        Cancellation: removed entirely or not at all; repeating it is safe.
        """
        ...
