"""``server.retention``: export, archive, erase and trim a session of the
server's contract (issue 35), over the store's retention capability
(``Store.retention``, :class:`~a2trio.stores.base.Retention`: memory,
SQLite, Postgres, Redis).

The store decides and removes in one transaction, refusing while a claim on
the session is live (``rules.check_unclaimed``); this module checks the
inputs, names sessions without their namespace, writes an archive's file
before anything is removed, and logs every removal on ``a2trio.retention``
(who, why, how many rows: never a payload).

An archive is an export written to a new file (JSON lines, flushed and
synced to disk), then an erasure that expects the session at the index the
export read: an event appended in between refuses it (``changed``) and the
file is removed again. The erasure cannot share the export's transaction,
since a file is not in the store; in this order a crash leaves the file and
the session both, never neither.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import msgspec
import trio

from ..contract import Reducer
from ..identifiers import MAX_SAFE_INTEGER, check_session_id
from ..stores import rules
from ..stores.base import Erased, Retention, RetentionError, SessionArchive, Trimmed
from .actions import MAX_ACTOR_CHARS, MAX_REASON_CHARS, check_words
from .context import Engine
from .inspection_records import InspectionUnsupportedError

__all__ = ["ARCHIVE_FORMAT", "ServerRetention", "logger"]

logger: Final = logging.getLogger("a2trio.retention")

#: The version of an archive's JSON lines, in its first line.
ARCHIVE_FORMAT: Final = 1

_encode = msgspec.json.Encoder().encode


class ServerRetention:
    """``server.retention`` (see the module docstring).

    Args:
      engine: the server's engine.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _store(self) -> Retention:
        retention = self._engine.store.retention
        if retention is None:
            raise InspectionUnsupportedError(
                f"the store {type(self._engine.store).__name__} has no retention "
                "(export, archive, erase, trim)"
            )
        return retention

    def _public(self, archive: SessionArchive, session_id: str) -> SessionArchive:
        replace = msgspec.structs.replace
        return replace(
            archive,
            session_id=session_id,
            events=[replace(e, session_id=session_id) for e in archive.events],
            actions=[replace(a, session_id=session_id) for a in archive.actions],
        )

    async def export(self, session_id: str) -> SessionArchive:
        """The session's events with their bookkeeping, its snapshots and the
        operator actions recorded on it, read in one transaction; nothing is
        removed. A session with no events exports empty (``index`` 0).

        Raises:
          TypeError / ValueError: a bad session id.
          InspectionUnsupportedError: the store has no retention.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: a read.
        """
        check_session_id(session_id)
        archive = await self._store().export(self._engine.key(session_id))
        return self._public(archive, session_id)

    def lines(self, archive: SessionArchive) -> bytes:
        """An export as JSON lines: first ``{"kind": "session", "format",
        "contract", "sessionId", "index"}``, then one line per event
        (``"kind": "event"`` and every field of a stored event, its
        bookkeeping included), snapshot (``"snapshot"``) and operator action
        (``"action"``), in the export's order. Keys are the records' fields in
        the wire's camelCase (``createdAtMs``), as every JSON an operator
        reads; payloads and states keep their own."""
        head = {
            "kind": "session",
            "format": ARCHIVE_FORMAT,
            "contract": self._engine.contract.name,
            "session_id": archive.session_id,
            "index": archive.index,
        }
        out = [_encode(_camel(head))]
        for kind, records in (
            ("event", archive.events),
            ("snapshot", archive.snapshots),
            ("action", archive.actions),
        ):
            for record in records:
                out.append(_encode({"kind": kind, **_camel(msgspec.to_builtins(record))}))
        return b"\n".join(out) + b"\n"

    async def erase(
        self, session_id: str, *, by: str, reason: str, expected_index: int | None = None
    ) -> Erased:
        """Remove the session and everything derived from it: its events
        (their ids may then be appended again, as new), snapshots, operator
        actions and presence rows (the right to erasure). Logged on
        ``a2trio.retention`` with ``by``, ``reason`` and the counts; nothing
        of what was removed is kept. Erasing a session with no rows answers
        zeros. With ``expected_index`` (an export's ``index``), only if
        nothing was appended since: how an archive is made over HTTP.

        Raises:
          TypeError / ValueError: a bad session id, ``by``, ``reason`` (both
            required) or ``expected_index``.
          RetentionError: ``claimed`` (a live claim holds one of its events:
            its attempt is running), ``changed`` (not at ``expected_index``);
            nothing removed.
          InspectionUnsupportedError: the store has no retention.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: removed entirely or not at all; repeating it is safe.
        """
        check_session_id(session_id)
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=True)
        if expected_index is not None and (
            isinstance(expected_index, bool)
            or not isinstance(expected_index, int)
            or not 0 <= expected_index <= MAX_SAFE_INTEGER
        ):
            raise TypeError(
                f"`expected_index` is an index (0 to {MAX_SAFE_INTEGER}) or None, "
                f"got {expected_index!r}"
            )
        erased = await self._erase(session_id, expected_index)
        self._log("erased", erased, by, reason)
        return erased

    async def archive(
        self, session_id: str, path: str | os.PathLike[str], *, by: str, reason: str
    ) -> Erased:
        """Export the session to a new file at ``path`` (JSON lines, see
        :meth:`lines`; flushed and synced), then erase it, expecting it at
        the index exported. Logged on ``a2trio.retention`` as an erasure is,
        with the path.

        Raises:
          TypeError / ValueError: a bad session id, ``by`` or ``reason``.
          FileExistsError / OSError: ``path`` exists or cannot be written
            (nothing removed).
          RetentionError: ``unprocessed`` (an event still has work: archive
            a finished session; dead letters may stay), ``claimed``,
            ``changed`` (appended to since the export); nothing removed and
            the file deleted again.
          InspectionUnsupportedError: the store has no retention.
          A2Error: ``STORE_UNAVAILABLE`` (the file stays if it was written).

        Cancellation: a cancel before the erasure commits leaves the file
        and the session; after, the file and no session. Either way nothing
        is lost; remove the file to run it again.
        """
        check_session_id(session_id)
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=True)
        target = os.fspath(path)
        archive = await self.export(session_id)
        rules.check_finished(session_id, archive.events)
        await trio.to_thread.run_sync(_write_new, target, self.lines(archive))
        try:
            erased = await self._erase(session_id, archive.index)
        except RetentionError:
            await trio.to_thread.run_sync(os.unlink, target)
            raise
        self._log(f"archived to {target!r} and erased", erased, by, reason)
        return erased

    async def trim(
        self, session_id: str, reducer: Reducer[Any] | str, *, by: str, reason: str
    ) -> Trimmed:
        """Remove the session's processed events at or below ``reducer``'s
        snapshot (the last event always stays, so indexes go on). The state
        of ``reducer`` still reads, from its snapshot; a read that starts
        below the trim point (history from the start, a feed's cursor, the
        state of a reducer whose snapshot is older, or which has none) raises
        ``A2Error(TRIMMED)``, and the trimmed events' ids are forgotten (one
        appended again is new). Logged on ``a2trio.retention``. A trim at or
        below an earlier one removes nothing.

        Args:
          reducer: the :class:`~a2trio.Reducer` (or its name) whose snapshot
            is the trim point: read its state first so one is written.

        Raises:
          TypeError / ValueError: a bad session id, reducer, ``by`` or ``reason``.
          RetentionError: ``no_snapshot``, ``unprocessed`` (an event at or
            below the point has work left, or is a dead letter), ``claimed``;
            nothing removed.
          InspectionUnsupportedError: the store has no retention.
          A2Error: ``STORE_UNAVAILABLE``.

        Cancellation: removed entirely or not at all; repeating it is safe.
        """
        check_session_id(session_id)
        name = reducer.name if isinstance(reducer, Reducer) else reducer
        if not isinstance(name, str) or not name:
            raise TypeError(f"`reducer` is an a2trio.Reducer or its name, got {reducer!r}")
        by = check_words("by", by, MAX_ACTOR_CHARS, required=True)
        reason = check_words("reason", reason, MAX_REASON_CHARS, required=True)
        store = self._store()
        try:
            trimmed = await store.trim(self._engine.key(session_id), name)
        except RetentionError as exc:
            raise RetentionError(exc.reason, session_id, exc.detail) from None
        trimmed = msgspec.structs.replace(trimmed, session_id=session_id)
        logger.info(
            "trimmed session %r of %r through index %d (reducer %r): %d events, by %r: %s",
            session_id,
            self._engine.contract.name,
            trimmed.through_index,
            name,
            trimmed.events,
            by,
            reason,
        )
        return trimmed

    async def _erase(self, session_id: str, expected_index: int | None) -> Erased:
        store = self._store()
        try:
            erased = await store.erase(self._engine.key(session_id), expected_index=expected_index)
        except RetentionError as exc:
            raise RetentionError(exc.reason, session_id, exc.detail) from None
        return msgspec.structs.replace(erased, session_id=session_id)

    def _log(self, what: str, erased: Erased, by: str, reason: str) -> None:
        logger.info(
            "%s session %r of %r: %d events, %d snapshots, %d operator actions, "
            "%d presence rows, by %r: %s",
            what,
            erased.session_id,
            self._engine.contract.name,
            erased.events,
            erased.snapshots,
            erased.actions,
            erased.presence,
            by,
            reason,
        )


def _camel(record: dict[str, Any]) -> dict[str, Any]:
    """A record's keys in camelCase, and those of the records inside it (a
    cause); a payload's and a state's keys are the application's."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        head, *rest = key.split("_")
        if isinstance(value, dict) and key not in ("payload", "state"):
            value = _camel(value)
        out[head + "".join(part.title() for part in rest)] = value
    return out


def _write_new(path: str, content: bytes) -> None:
    """Write ``content`` to a file that must not exist yet, and sync it."""
    with open(path, "xb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
