"""The durable handlers' journal (issue 34): the record a store keeps per
step and the optional capability that keeps it (``store.journal``).

:mod:`a2trio.stores.base` re-exports both with the other protocols; the
write's fence is ``a2trio.stores.rules.journals``.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

__all__ = ["Journal", "JournalEntry"]


class JournalEntry(msgspec.Struct, frozen=True):
    """One journaled step of a durable handler (issue 34): the result of the
    step ``name`` of the event's handler, as the attempt ``attempt`` wrote it.

    ``result`` is the step's return value as JSON bytes (the engine encodes
    and decodes it; a store keeps it verbatim); ``at_ms`` is the store's
    clock when it committed.
    """

    name: str
    result: bytes
    attempt: int
    at_ms: int


class Journal(Protocol):
    """The optional journal of durable handlers (``store.journal``: memory,
    SQLite, Postgres, Redis): each event's completed steps, by name, so a
    later attempt of the same event answers them without running them again.

    Entries are keyed by (session, index, name) and never change once
    written: the first write of a name wins and a repeat answers it. A write
    is fenced by its attempt (:func:`a2trio.stores.rules.journals`): only the
    attempt that holds the event's claim writes, so a superseded attempt's
    step never lands. The journal lives beside the event's row, for as long
    as the session's events are (erasing a session erases its journal).
    """

    async def read_journal(self, session_id: str, index: int) -> list[JournalEntry]:
        """The steps journaled for the event at ``index``, in the order written
        (none for an index the session does not have). Cancellation: a read."""
        ...

    async def write_step(
        self, session_id: str, *, index: int, attempt: int, name: str, result: bytes
    ) -> JournalEntry:
        """Journal ``result`` (JSON bytes) as the step ``name`` of the event at
        ``index``, written by ``attempt``, durably before returning; if ``name``
        is journaled already, write nothing and answer the stored entry.

        Raises:
          ValueError: no event at ``index``.
          A2Error: ``SUPERSEDED_ATTEMPT``, ``attempt`` no longer holds the
            event's claim (a newer attempt took it, it was processed or
            dead-lettered); nothing is written.

        Cancellation: written entirely or not at all; writing again replays.
        """
        ...
