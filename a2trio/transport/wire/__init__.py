"""The wire format: msgspec frames byte-compatible with the seed's ``wire.ts``.

Sans-I/O: every function here maps Python objects to bytes or bytes to
Python objects, and nothing here touches a socket (the shape of h11). The
package's modules hold the records (:mod:`.records`: events, presence), the
error envelope and status table (:mod:`.envelope`), the HTTP bodies
(:mod:`.bodies`), the actor lanes' (:mod:`.actors`), the socket frames
(:mod:`.frames`) and what an operator reads (:mod:`.inspection`); every name
is this module's.

* Events travel as ``{id, type, payload, index, sessionId, createdAt}`` with
  ``createdAt`` in ISO 8601 as JavaScript's ``Date.toISOString`` writes it
  (millisecond precision, ``Z``).
* Presence travels as a patch ``{participant, values, seen, at}`` and a
  snapshot ``{snapshot: {participant: {field: {value, seen, at}}}}``, every
  ``at`` in ISO 8601.
* Errors travel in the envelope ``{"error": {code, message, details?}}`` with
  the HTTP status from :data:`ERROR_STATUS`, the one status table.
* Socket frames are one JSON text message each, tagged by ``kind``. Down
  (server to client): ``event``, ``presence``, ``presence-snapshot``, ``ack``,
  ``subscribed``, ``unsubscribed``, ``ping``. Up: ``push``, ``presence``,
  ``subscribe``, ``unsubscribe``.
* The actor lanes (an a2trio addition) take a :class:`CallBody` and answer
  ``{state, index}`` (:class:`StateBody`); their socket writes ``state``
  frames (:class:`StateFrame`).
* Inspection (``a2trio inspect --json``, ``/_a2/inspect``) answers in the
  same camelCase: ``{sessions, cursor}``, ``{deadLetters, cursor}``, ``{events,
  snapshots, throughIndex, nextIndex}``, each event ``{event, status, actions,
  traceId}`` with ``event`` a ``WireEvent``.

Every frame and body is a struct here, and both sides encode through them, so
field order and omitted optionals are the struct's: fields in the order of the
seed's types, an absent optional omitted (``UNSET``, or ``omit_defaults``
where the seed leaves a key out rather than writing ``null``).

Forward compatibility follows ``parseSocketFrame``: a frame of unknown kind is
skipped, and an ``ack`` is never dropped, because its waiter would hang behind a
healthy socket: an ack whose outcome cannot be read degrades to a retryable
``STORE_UNAVAILABLE`` ack (client ids make the retry idempotent).
"""

from __future__ import annotations

from .actors import (
    CallBody,
    StateBody,
    StateFrame,
    decode_call_body,
)
from .bodies import (
    EventsBody,
    PushBody,
    PushedEventWire,
    PushedPresenceWire,
    decode_push_body,
    encode_events,
)
from .envelope import (
    ERROR_STATUS,
    WireError,
    WireErrorBody,
    as_a2_error,
    encode_error,
    error_from_wire,
    error_status,
    error_to_wire,
)
from .frames import (
    PING_FRAME,
    AckFrame,
    BadFrame,
    DownFrame,
    EventFrame,
    PingFrame,
    PresenceFrame,
    PresenceSnapshotFrame,
    PresenceUpFrame,
    PushFrame,
    SubscribedFrame,
    SubscribeFrame,
    SubscribeSession,
    UnsubscribedFrame,
    UnsubscribeFrame,
    UpFrame,
    decode_down_frame,
    decode_up_frame,
    encode_ack,
    encode_error_ack,
    encode_event_text,
    encode_item_frame,
    encode_subscribed,
    encode_unsubscribed,
    event_frame,
    wire_event,
)
from .inspection import (
    WireBulkItem,
    WireBulkRequest,
    WireBulkResult,
    WireCron,
    WireDeadLetterFilter,
    WireDeadLettersPage,
    WireErased,
    WireEventStatus,
    WireInspectedEvent,
    WireOperatorAction,
    WireSessionEventsPage,
    WireSessionsPage,
    WireSessionSummary,
    WireSnapshotInfo,
    WireTrimmed,
    actions_to_wire,
    bulk_result_to_wire,
    crons_to_wire,
    dead_letters_page_to_wire,
    decode_bulk_request,
    erased_to_wire,
    session_events_page_to_wire,
    sessions_page_to_wire,
    trimmed_to_wire,
)
from .records import (
    WireEvent,
    WirePresencePatch,
    WirePresenceSnapshot,
    WirePresenceValue,
    encode,
    event_to_wire,
    iso_ms,
    presence_patch_to_wire,
    presence_snapshot_to_wire,
)

__all__ = [
    "ERROR_STATUS",
    "PING_FRAME",
    "AckFrame",
    "BadFrame",
    "CallBody",
    "DownFrame",
    "EventFrame",
    "EventsBody",
    "PingFrame",
    "PresenceFrame",
    "PresenceSnapshotFrame",
    "PresenceUpFrame",
    "PushBody",
    "PushFrame",
    "PushedEventWire",
    "PushedPresenceWire",
    "StateBody",
    "StateFrame",
    "SubscribeFrame",
    "SubscribeSession",
    "SubscribedFrame",
    "UnsubscribeFrame",
    "UnsubscribedFrame",
    "UpFrame",
    "WireBulkItem",
    "WireBulkRequest",
    "WireBulkResult",
    "WireCron",
    "WireDeadLetterFilter",
    "WireDeadLettersPage",
    "WireErased",
    "WireError",
    "WireErrorBody",
    "WireEvent",
    "WireEventStatus",
    "WireInspectedEvent",
    "WireOperatorAction",
    "WirePresencePatch",
    "WirePresenceSnapshot",
    "WirePresenceValue",
    "WireSessionEventsPage",
    "WireSessionSummary",
    "WireSessionsPage",
    "WireSnapshotInfo",
    "WireTrimmed",
    "actions_to_wire",
    "as_a2_error",
    "bulk_result_to_wire",
    "crons_to_wire",
    "dead_letters_page_to_wire",
    "decode_bulk_request",
    "decode_call_body",
    "decode_down_frame",
    "decode_push_body",
    "decode_up_frame",
    "encode",
    "encode_ack",
    "encode_error",
    "encode_error_ack",
    "encode_event_text",
    "encode_events",
    "encode_item_frame",
    "encode_subscribed",
    "encode_unsubscribed",
    "erased_to_wire",
    "error_from_wire",
    "error_status",
    "error_to_wire",
    "event_frame",
    "event_to_wire",
    "iso_ms",
    "presence_patch_to_wire",
    "presence_snapshot_to_wire",
    "session_events_page_to_wire",
    "sessions_page_to_wire",
    "trimmed_to_wire",
    "wire_event",
]
