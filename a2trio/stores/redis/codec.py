"""The Redis store's encoding: key names, and the records in its keys as bytes.

``scripts`` documents the key layout; this module spells it for Python
(:class:`Keys`) and turns what the scripts store and return into records and
back. The stream entry (:class:`Entry`) is a JSON array; an unsettled event's
bookkeeping (:class:`Meta`) a JSON object with one-letter keys, because the
scripts read and write it field by field (``m.a``, ``m.h``): :class:`Meta`
names each key after the :class:`~a2trio.stores.base.StoredEvent` field it
holds. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import msgspec

from ..base import (
    ActionKind,
    AppendEvent,
    EventCause,
    FailedAttempt,
    PresenceRow,
    Snapshot,
    SnapshotInfo,
    StoredEvent,
)

__all__ = [
    "SETTLED",
    "Action",
    "Cause",
    "Entry",
    "Failure",
    "Keys",
    "Meta",
    "PresenceNote",
    "append_args",
    "appended_rows",
    "complete_args",
    "decode",
    "decode_action",
    "decode_entry",
    "decode_ids",
    "decode_meta",
    "decode_note",
    "encode",
    "entry",
    "failures",
    "lane_arg",
    "presence_row",
    "returned_rows",
    "row",
    "rows",
    "snapshot",
    "snapshot_info",
    "stored",
    "text",
]

encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode
decode_ids = msgspec.json.Decoder(list[str]).decode


class Keys:
    """The store's key and channel names under ``P``, its key prefix (the
    layout is in ``scripts``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: Where the concurrency keys' sets live: ``P:flow:K`` for key ``K``.
        self.flow_prefix = f"{prefix}:flow:"
        #: Where the throttles' sets live: ``P:throttle:K`` for key ``K``.
        self.throttle_prefix = f"{prefix}:throttle:"
        # Built once: every append and completion names them.
        self._globals = [
            f"{prefix}:{name}" for name in ("ids", "sessions", "pending:watched", "open-sessions")
        ]

    def key(self, session_id: str, suffix: str) -> str:
        """A session's key, ``P:S:suffix``."""
        return f"{self.prefix}:{session_id}:{suffix}"

    def global_key(self, name: str) -> str:
        """A store-wide key or channel, ``P:name``."""
        return f"{self.prefix}:{name}"

    def channel(self, session_id: str, kind: str) -> bytes:
        """A session's channel (``notify``, ``presence``), as the subscriber names it."""
        return self.key(session_id, kind).encode()

    def session_keys(self, session_id: str) -> list[str]:
        """``KEYS[1..4]`` of the scripts that take the session keys."""
        at = f"{self.prefix}:{session_id}:"
        return [at + "log", at + "meta", at + "open", at + "head"]

    def write_keys(self, session_id: str) -> list[str]:
        """The keys of the scripts that append (``APPEND``, ``COMPLETE``)."""
        at = f"{self.prefix}:{session_id}:"
        ids, sessions, pending_watched, open_sessions = self._globals
        return [
            at + "log",
            at + "meta",
            at + "open",
            at + "head",
            ids,
            sessions,
            at + "watched",
            pending_watched,
            open_sessions,
        ]


class Cause(msgspec.Struct, frozen=True, array_like=True):
    index: int
    attempt: int
    batch_size: int | None = None


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """An event's immutable half, as stored in the stream. Entries written
    before the trace context existed end at ``settled``, and those written
    before versions at ``trace_context``: both still decode (a missing
    version is version 1)."""

    id: str
    type: str
    payload: Any
    created_at_ms: int
    cause: Cause | None
    lane: str | None
    settled: bool
    trace_context: str | None = None
    version: int | None = None


class Meta(msgspec.Struct, omit_defaults=True):
    """An unsettled event's bookkeeping, as the scripts store it (see
    ``scripts``): each attribute is stored under the one-letter key in its
    ``name``. It satisfies ``rules.Bookkeeping``."""

    attempt_count: int = msgspec.field(default=0, name="a")
    failure_count: int = msgspec.field(default=0, name="f")
    claim_holder: str | None = msgspec.field(default=None, name="h")
    claim_expires_at_ms: int | None = msgspec.field(default=None, name="x")
    first_claimed_at_ms: int | None = msgspec.field(default=None, name="fc")
    last_claimed_at_ms: int | None = msgspec.field(default=None, name="lc")
    last_failed_at_ms: int | None = msgspec.field(default=None, name="lf")
    last_failed_attempt: int | None = msgspec.field(default=None, name="la")
    last_error: str | None = msgspec.field(default=None, name="e")
    failed_at_ms: int | None = msgspec.field(default=None, name="d")
    processed_at_ms: int | None = msgspec.field(default=None, name="p")
    processed_by_attempt: int | None = msgspec.field(default=None, name="pb")
    #: The returned event ids, as JSON text.
    returned_ids: str | None = msgspec.field(default=None, name="r")
    lane: str | None = msgspec.field(default=None, name="l")
    not_before_ms: int | None = msgspec.field(default=None, name="nb")
    concurrency_key: str | None = msgspec.field(default=None, name="ck")
    concurrency_limit: int | None = msgspec.field(default=None, name="cl")
    #: A debounced event's type and key (the type only to match them in Lua).
    debounce_type: str | None = msgspec.field(default=None, name="t")
    debounce_key: str | None = msgspec.field(default=None, name="k")
    debounced_by: int | None = msgspec.field(default=None, name="db")
    throttle_key: str | None = msgspec.field(default=None, name="tk")
    throttle_limit: int | None = msgspec.field(default=None, name="tl")
    throttle_period_ms: int | None = msgspec.field(default=None, name="tp")
    priority: int | None = msgspec.field(default=None, name="pr")
    #: A suspended wait's wake mark (issue 34; HEAD's ``w`` lists the row).
    wake_on: list[str] | None = msgspec.field(default=None, name="w")


class Action(msgspec.Struct, frozen=True, array_like=True):
    """An operator action as ``P:S:actions`` stores it."""

    action: ActionKind
    index: int
    by: str
    reason: str
    at_ms: int


class Failure(msgspec.Struct, frozen=True, array_like=True):
    """A failed attempt as ``P:S:failures`` stores it (its index is the field)."""

    attempt: int
    error: str
    failed_at_ms: int
    holder: str
    claimed_at_ms: int | None


class PresenceNote(msgspec.Struct, frozen=True):
    """A published presence patch, as the script writes it."""

    origin: str = msgspec.field(name="o")
    participant: str = msgspec.field(name="p")
    seen: int = msgspec.field(name="s")
    at_ms: int = msgspec.field(name="a")
    values: dict[str, Any] = msgspec.field(name="v")


decode_entry = msgspec.json.Decoder(Entry).decode
decode_action = msgspec.json.Decoder(Action).decode
decode_meta = msgspec.json.Decoder(Meta).decode
decode_note = msgspec.json.Decoder(PresenceNote).decode
_decode_failure = msgspec.json.Decoder(Failure).decode


def failures(index: int, raw: bytes) -> list[FailedAttempt]:
    """One field of ``P:S:failures``: a JSON array of each failed attempt's
    JSON text, oldest first."""
    found = []
    for text in decode_ids(raw):
        f = _decode_failure(text)
        found.append(
            FailedAttempt(index, f.attempt, f.error, f.failed_at_ms, f.holder, f.claimed_at_ms)
        )
    return found


#: A settled event's bookkeeping for the verdicts: processed, by no attempt.
SETTLED = Meta(processed_at_ms=0)


def row(session_id: str, index: int, entry: bytes, meta: bytes | None) -> StoredEvent:
    e = decode_entry(entry)
    cause = None if e.cause is None else EventCause(*msgspec.structs.astuple(e.cause))
    if meta is None:
        return StoredEvent(
            id=e.id,
            type=e.type,
            payload=e.payload,
            index=index,
            session_id=session_id,
            created_at_ms=e.created_at_ms,
            cause=cause,
            lane=e.lane,
            processed_at_ms=e.created_at_ms if e.settled else None,
            trace_context=e.trace_context,
            version=e.version,
        )
    m = decode_meta(meta)
    return StoredEvent(
        id=e.id,
        type=e.type,
        payload=e.payload,
        index=index,
        session_id=session_id,
        created_at_ms=e.created_at_ms,
        cause=cause,
        lane=e.lane,
        trace_context=e.trace_context,
        version=e.version,
        processed_at_ms=m.processed_at_ms,
        processed_by_attempt=m.processed_by_attempt,
        returned_event_ids=None if m.returned_ids is None else decode_ids(m.returned_ids),
        first_claimed_at_ms=m.first_claimed_at_ms,
        last_claimed_at_ms=m.last_claimed_at_ms,
        attempt_count=m.attempt_count,
        failure_count=m.failure_count,
        last_failed_at_ms=m.last_failed_at_ms,
        last_failed_attempt=m.last_failed_attempt,
        last_error=m.last_error,
        failed_at_ms=m.failed_at_ms,
        claim_holder=m.claim_holder,
        claim_expires_at_ms=m.claim_expires_at_ms,
        not_before_ms=m.not_before_ms,
        concurrency_key=m.concurrency_key,
        concurrency_limit=m.concurrency_limit,
        debounce_key=m.debounce_key,
        debounced_by=m.debounced_by,
        throttle_key=m.throttle_key,
        throttle_limit=m.throttle_limit,
        throttle_period_ms=m.throttle_period_ms,
        priority=m.priority,
    )


def rows(session_id: str, flat: Sequence[Any]) -> list[StoredEvent]:
    """Rows from a script's ``{index, entry, meta, ...}``."""
    return [row(session_id, int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def stored(session_id: str, flat: Sequence[Any]) -> list[StoredEvent]:
    """The rows of ``stored_rows``' ``{id, session, index, entry, meta, ...}``.

    A row in another session is not read (the script names only this
    session's keys): it stands for its id and session, which is all the
    verdicts ask of a foreign row."""
    out = []
    for i in range(0, len(flat), 5):
        event_id, where, index, entry, meta = flat[i : i + 5]
        if entry is None:
            out.append(
                StoredEvent(
                    id=event_id.decode(),
                    type="",
                    payload=None,
                    index=int(index),
                    session_id=where.decode(),
                    created_at_ms=0,
                )
            )
        else:
            out.append(row(session_id, int(index), entry, meta))
    return out


def entry(event: AppendEvent, event_id: str, now: int, cause: EventCause | None) -> bytes:
    stored_cause = None if cause is None else Cause(cause.index, cause.attempt, cause.batch_size)
    return encode(
        Entry(
            event_id,
            event.type,
            event.payload,
            now,
            stored_cause,
            event.lane,
            event.settled,
            event.trace_context,
            event.version,
        )
    )


def lane_arg(lane: str | None) -> str:
    return "" if lane is None else "=" + lane


def append_args(events: Sequence[AppendEvent], ids: Sequence[str], now: int) -> list[Any]:
    """``APPEND``'s arguments per event: id, entry, lane, settled, the
    cause's index and attempt, the concurrency key and limit, the delay, the
    debounce key (as a lane), the type, the throttle key, limit and period,
    and the priority."""
    args: list[Any] = []
    for event, event_id in zip(events, ids, strict=True):
        cause = event.cause
        args += [
            event_id,
            entry(event, event_id, now, cause),
            lane_arg(event.lane),
            "1" if event.settled else "0",
            "" if cause is None else cause.index,
            "" if cause is None else cause.attempt,
            event.concurrency_key or "",
            event.concurrency_limit or "",
            "" if event.delay_ms is None else event.delay_ms,
            lane_arg(event.debounce_key),
            event.type,
            event.throttle_key or "",
            event.throttle_limit or "",
            event.throttle_period_ms or "",
            "" if event.priority is None else event.priority,
        ]
    return args


def complete_args(
    events: Sequence[AppendEvent], ids: Sequence[str], now: int, cause: EventCause
) -> list[Any]:
    """``COMPLETE``'s arguments per returned event: id, entry, lane, settled,
    concurrency key and limit, throttle key, limit and period, priority, the
    delay, the debounce key (as a lane) and the type."""
    args: list[Any] = []
    for event, event_id in zip(events, ids, strict=True):
        args += [
            event_id,
            entry(event, event_id, now, cause),
            lane_arg(event.lane),
            "1" if event.settled else "0",
            event.concurrency_key or "",
            event.concurrency_limit or "",
            event.throttle_key or "",
            event.throttle_limit or "",
            event.throttle_period_ms or "",
            "" if event.priority is None else event.priority,
            "" if event.delay_ms is None else event.delay_ms,
            lane_arg(event.debounce_key),
            event.type,
        ]
    return args


def appended_rows(
    session_id: str,
    events: Sequence[AppendEvent],
    ids: Sequence[str],
    base: int,
    now: int,
    claimed_set: Container[int],
    holder: str,
    expires_at: int,
) -> list[StoredEvent]:
    """The rows ``APPEND`` wrote after index ``base``, those at
    ``claimed_set`` claimed by ``holder`` (their first attempt)."""
    inserted = []
    for ord_, (event, event_id) in enumerate(zip(events, ids, strict=True), 1):
        index = base + ord_
        claimed = index in claimed_set
        inserted.append(
            StoredEvent(
                id=event_id,
                type=event.type,
                payload=event.payload,
                index=index,
                session_id=session_id,
                created_at_ms=now,
                cause=event.cause,
                lane=event.lane,
                processed_at_ms=now if event.settled else None,
                trace_context=event.trace_context,
                version=event.version,
                concurrency_key=event.concurrency_key,
                concurrency_limit=event.concurrency_limit,
                throttle_key=event.throttle_key,
                throttle_limit=event.throttle_limit,
                throttle_period_ms=event.throttle_period_ms,
                priority=event.priority,
                first_claimed_at_ms=now if claimed else None,
                last_claimed_at_ms=now if claimed else None,
                attempt_count=1 if claimed else 0,
                claim_holder=holder if claimed else None,
                claim_expires_at_ms=expires_at if claimed else None,
                not_before_ms=None if event.delay_ms is None else now + event.delay_ms,
                debounce_key=event.debounce_key,
            )
        )
    return inserted


def returned_rows(
    session_id: str,
    events: Sequence[AppendEvent],
    ids: Sequence[str],
    base: int,
    now: int,
    cause: EventCause,
) -> list[StoredEvent]:
    """The rows ``COMPLETE`` wrote after index ``base``: the attempt's
    returned events."""
    return [
        StoredEvent(
            id=event_id,
            type=event.type,
            payload=event.payload,
            index=base + ord_,
            session_id=session_id,
            created_at_ms=now,
            cause=cause,
            lane=event.lane,
            processed_at_ms=now if event.settled else None,
            trace_context=event.trace_context,
            version=event.version,
            concurrency_key=event.concurrency_key,
            concurrency_limit=event.concurrency_limit,
            not_before_ms=None if event.delay_ms is None else now + event.delay_ms,
            debounce_key=event.debounce_key,
            throttle_key=event.throttle_key,
            throttle_limit=event.throttle_limit,
            throttle_period_ms=event.throttle_period_ms,
            priority=event.priority,
        )
        for ord_, (event, event_id) in enumerate(zip(events, ids, strict=True), 1)
    ]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def snapshot(raw: bytes) -> Snapshot:
    """A ``P:S:snap`` value, ``<index>:<updated_at>:<state json>``."""
    index, _, state = raw.split(b":", 2)
    return Snapshot(int(index), decode(state))


def snapshot_info(reducer: bytes, raw: bytes) -> SnapshotInfo:
    """A ``P:S:snap`` field and value, without decoding the state."""
    index, updated, _ = raw.split(b":", 2)
    return SnapshotInfo(reducer.decode(), int(index), int(updated))


def presence_row(name: bytes, raw: bytes) -> PresenceRow:
    """A ``P:S:presence`` field, ``participant NUL field``, and its value,
    ``<at>:<seen>:<expires_at>:<value json>``."""
    participant, _, field = name.partition(b"\0")
    at, seen, expires, value = raw.split(b":", 3)
    return PresenceRow(
        participant.decode(),
        field.decode(),
        decode(value),
        int(seen),
        int(at),
        int(expires),
    )
