"""The wire format and the SSE codec: pure functions over bytes, no sockets."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

import a2trio
from a2trio import A2Error, ErrorCode
from a2trio.transport import sse, wire
from a2trio.transport.server import scheduler
from a2trio.transport.server.http import Refusal


class Item(msgspec.Struct, frozen=True):
    name: str
    tags: list[str] = []


def event(index: int = 1) -> a2trio.Event[Item]:
    return a2trio.Event(
        id=f"e-{index}",
        type="item",
        payload=Item("book", ["a"]),
        index=index,
        session_id="s1",
        created_at=datetime(2025, 1, 2, 3, 4, 5, 678_900, tzinfo=UTC),
    )


def test_events_go_out_in_the_seed_shape() -> None:
    assert json.loads(wire.encode(wire.event_to_wire(event()))) == {
        "id": "e-1",
        "type": "item",
        "payload": {"name": "book", "tags": ["a"]},
        "index": 1,
        "sessionId": "s1",
        "createdAt": "2025-01-02T03:04:05.678Z",
    }


def test_iso_ms_matches_to_iso_string() -> None:
    assert wire.iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert wire.iso_ms(1_735_689_600_123) == "2025-01-01T00:00:00.123Z"


def test_presence_goes_out_with_iso_stamps() -> None:
    patch = a2trio.PresencePatch("ann", {"cursor": Item("c")}, 3, 1_000)
    assert json.loads(wire.encode_item_frame(patch, "s1")) == {
        "kind": "presence",
        "participant": "ann",
        "values": {"cursor": {"name": "c", "tags": []}},
        "seen": 3,
        "at": "1970-01-01T00:00:01.000Z",
        "sessionId": "s1",
    }
    snapshot = a2trio.PresenceSnapshot({"ann": {"typing": a2trio.PresenceValue(True, 2, 5)}})
    assert json.loads(wire.encode_item_frame(snapshot)) == {
        "kind": "presence-snapshot",
        "snapshot": {
            "ann": {"typing": {"value": True, "seen": 2, "at": "1970-01-01T00:00:00.005Z"}}
        },
    }


def test_status_table_covers_every_code_as_wire_ts() -> None:
    assert set(wire.ERROR_STATUS) == set(ErrorCode)
    assert wire.error_status("INVALID_PAYLOAD") == 400
    assert wire.error_status(ErrorCode.FORBIDDEN) == 403
    assert wire.error_status(ErrorCode.SUPERSEDED_ATTEMPT) == 409
    assert wire.error_status("SOMETHING_NEW") == 503


def test_the_documented_status_table_is_the_code() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "transport.md").read_text()
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|$", page, re.MULTILINE))
    assert documented == {code.value: str(status) for code, status in wire.ERROR_STATUS.items()}


def test_error_envelope_round_trips_and_hides_internal_failures() -> None:
    failure = A2Error(ErrorCode.INVALID_PAYLOAD, "bad", {"path": "$.x"})
    body = wire.encode_error(failure)
    assert json.loads(body) == {
        "error": {"code": "INVALID_PAYLOAD", "message": "bad", "details": {"path": "$.x"}}
    }
    back = wire.error_from_wire(body)
    assert back is not None
    assert (back.code, back.message, back.details) == (failure.code, "bad", {"path": "$.x"})
    assert json.loads(wire.encode_error(RuntimeError("db password is hunter2"))) == {
        "error": {"code": "STORE_UNAVAILABLE", "message": "internal error"}
    }
    assert wire.error_from_wire(b'{"error": {"code": "NEW_CODE", "message": "m"}}') is None
    assert wire.error_from_wire(b"[]") is None


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            {"kind": "push", "req": 1, "events": [{"type": "t", "payload": {"a": 1}, "id": "x"}]},
            wire.PushFrame(1, [wire.PushedEventWire("t", {"a": 1}, "x")]),
        ),
        (
            {"kind": "presence", "participant": "p", "values": {"f": 1}, "at": 5, "sessionId": "s"},
            wire.PresenceUpFrame("p", {"f": 1}, at=5, session_id="s"),
        ),
        (
            {"kind": "subscribe", "sessions": [{"id": "a", "index": 3}, {"id": "b"}]},
            wire.SubscribeFrame([wire.SubscribeSession("a", 3), wire.SubscribeSession("b")]),
        ),
        ({"kind": "unsubscribe", "sessions": ["a"]}, wire.UnsubscribeFrame(["a"])),
        ({"kind": "from-the-future", "anything": [1]}, None),
    ],
)
def test_up_frames_decode_and_unknown_kinds_are_skipped(frame: Any, expected: Any) -> None:
    assert wire.decode_up_frame(json.dumps(frame).encode()) == expected


#: Every up-frame and request body as the seed's types write them (the fields
#: in the order of ``SocketPushFrame`` & co., absent optionals left out).
UP_BYTES = [
    (
        wire.PushFrame(
            req=7,
            events=[wire.PushedEventWire("note", {"text": "hi"}, "e-1")],
            session_id="s1",
        ),
        b'{"kind":"push","req":7,"events":[{"type":"note","payload":{"text":"hi"},"id":"e-1"}],'
        b'"sessionId":"s1"}',
    ),
    (
        wire.PushFrame(
            7,
            [wire.PushedEventWire("note", None, "e-1")],
            traceparent="00-a-b-01",
            tracestate="k=v",
        ),
        b'{"kind":"push","req":7,"events":[{"type":"note","payload":null,"id":"e-1"}],'
        b'"traceparent":"00-a-b-01","tracestate":"k=v"}',
    ),
    (
        wire.PresenceUpFrame("ann", {"cursor": 3}, session_id="s1"),
        b'{"kind":"presence","participant":"ann","values":{"cursor":3},"sessionId":"s1"}',
    ),
    (
        wire.PresenceUpFrame("ann", {}, 2, 1000, "s1"),
        b'{"kind":"presence","participant":"ann","values":{},"seen":2,"at":1000,"sessionId":"s1"}',
    ),
    (
        wire.SubscribeFrame([wire.SubscribeSession("s1"), wire.SubscribeSession("s2", 4)]),
        b'{"kind":"subscribe","sessions":[{"id":"s1","index":0},{"id":"s2","index":4}]}',
    ),
    (wire.UnsubscribeFrame(["s1"]), b'{"kind":"unsubscribe","sessions":["s1"]}'),
    (
        wire.PushBody(events=[wire.PushedEventWire("note", {}, "e-1")]),
        b'{"events":[{"type":"note","payload":{},"id":"e-1"}]}',
    ),
    (
        wire.PushBody(presence=wire.PushedPresenceWire("ann", {"typing": True})),
        b'{"presence":{"participant":"ann","values":{"typing":true}}}',
    ),
    (
        wire.PushBody(presence=wire.PushedPresenceWire("ann", {}, 2, 1000)),
        b'{"presence":{"participant":"ann","values":{},"seen":2,"at":1000}}',
    ),
    (
        wire.CallBody("deposit", {"amount": 5}, "m-1"),
        b'{"event":"deposit","input":{"amount":5},"messageId":"m-1"}',
    ),
    (wire.CallBody("close"), b'{"event":"close","input":null}'),
]


@pytest.mark.parametrize(("frame", "expected"), UP_BYTES)
def test_up_frames_and_bodies_encode_as_the_seed_writes_them(frame: Any, expected: bytes) -> None:
    assert wire.encode(frame) == expected


def test_state_answers_and_frames_encode_in_one_shape() -> None:
    assert wire.encode(wire.StateBody({"n": 1}, 3)) == b'{"state":{"n":1},"index":3}'
    assert wire.encode(wire.StateFrame(None, 0)) == b'{"kind":"state","state":null,"index":0}'
    events = wire.encode_events([event(2)])
    assert events.startswith(b'{"events":[{"id":"e-2","type":"item",')


def test_call_bodies_read_an_absent_or_null_message_id_as_none() -> None:
    for data in (b'{"event": "x"}', b'{"event": "x", "messageId": null}'):
        call = wire.decode_call_body(data)
        assert (call.event, call.input, call.id) == ("x", None, None)
    assert wire.decode_call_body(b'{"event": "x", "input": 1, "messageId": "m"}').id == "m"
    for bad in (b"{}", b'{"event": "x", "messageId": 5}', b"nope"):
        with pytest.raises(A2Error) as caught:
            wire.decode_call_body(bad)
        assert caught.value.code is ErrorCode.INVALID_PAYLOAD


@pytest.mark.parametrize(
    ("data", "req"),
    [
        (b"{nope", None),
        (b"[1, 2]", None),
        (b'{"kind": 3}', None),
        (b'{"req": 4}', 4),
        (b'{"kind": "push", "req": 5}', 5),
        (b'{"kind": "push", "req": 5.5, "events": []}', None),
        (b'{"kind": "push", "req": 6, "events": [{"type": 1}]}', 6),
        (b'{"kind": "subscribe", "sessions": [{"id": 1}]}', None),
    ],
)
def test_bad_up_frames_keep_their_correlator(data: bytes, req: int | None) -> None:
    bad = wire.decode_up_frame(data)
    assert isinstance(bad, wire.BadFrame)
    assert bad.req == req
    assert bad.error.code is ErrorCode.INVALID_PAYLOAD


def test_down_frames_round_trip() -> None:
    frames: list[bytes] = [
        wire.encode_item_frame(event(2)),
        wire.encode_ack(7, [event()], "s1"),
        wire.encode_error_ack(8, A2Error(ErrorCode.FORBIDDEN, "no")),
        wire.encode_subscribed("s1"),
        wire.encode_unsubscribed("s1"),
        wire.encode_unsubscribed("s1", "stream failed", A2Error(ErrorCode.STORE_UNAVAILABLE, "x")),
        wire.PING_FRAME,
    ]
    decoded = [wire.decode_down_frame(f) for f in frames]
    assert [type(f).__name__ for f in decoded] == [
        "EventFrame",
        "AckFrame",
        "AckFrame",
        "SubscribedFrame",
        "UnsubscribedFrame",
        "UnsubscribedFrame",
        "PingFrame",
    ]
    assert [wire.encode(f) for f in decoded] == frames
    assert json.loads(frames[1])["events"][0]["sessionId"] == "s1"
    assert json.loads(frames[4]) == {"kind": "unsubscribed", "sessionId": "s1"}


@pytest.mark.parametrize(
    "data",
    [
        b'{"kind": "ack", "req": 3, "events": [{"id": 1}]}',
        b'{"kind": "ack", "req": 3, "error": {"code": "FROM_A_NEWER_SERVER", "message": "m"}}',
        b'{"kind": "ack", "req": 3}',
        b'{"kind": "ack", "req": 3, "error": "boom"}',
    ],
)
def test_an_ack_is_never_dropped(data: bytes) -> None:
    ack = wire.decode_down_frame(data)
    assert isinstance(ack, wire.AckFrame)
    assert ack.req == 3
    assert isinstance(ack.error, wire.WireErrorBody)
    assert (ack.error.code, ack.error.message) == ("STORE_UNAVAILABLE", "unintelligible ack")


def test_unreadable_down_frames_are_skipped_and_lost_lanes_keep_their_error() -> None:
    for data in (
        b"nope",
        b'{"kind": "telepathy"}',
        b'{"kind": "event", "id": 3}',
        b'{"kind": "ack"}',
    ):
        assert wire.decode_down_frame(data) is None
    lost = wire.decode_down_frame(b'{"kind": "unsubscribed", "sessionId": "s", "error": 1}')
    assert isinstance(lost, wire.UnsubscribedFrame)
    assert isinstance(lost.error, wire.WireErrorBody)
    assert lost.error.message == "unintelligible subscription error"


# Frames the seed writes and its parseSocketFrame / errorFromWire accept: an
# event without ``payload`` (isWireEvent does not ask for one) and an error
# without ``message`` (``String(message ?? code)``).
SEED_EVENT = '{"kind":"event","id":"e-1","type":"cleared","index":1,"sessionId":"s1","createdAt":"2025-01-02T03:04:05.678Z"}'  # noqa: E501


def test_down_frames_decode_as_the_seed_does() -> None:
    frame = wire.decode_down_frame(SEED_EVENT)
    assert isinstance(frame, wire.EventFrame)
    assert (frame.id, frame.type, frame.payload, frame.index) == ("e-1", "cleared", None, 1)
    events = '[{"id":"e-1","type":"cleared","index":1,"sessionId":"s1","createdAt":"t"}]'
    ack = wire.decode_down_frame('{"kind":"ack","req":2,"events":' + events + "}")
    assert isinstance(ack, wire.AckFrame)
    assert ack.error is msgspec.UNSET
    assert isinstance(ack.events, list)
    assert ack.events[0].payload is None
    for data in (
        '{"kind":"ack","req":3,"error":{"code":"FORBIDDEN"}}',
        '{"kind":"ack","req":3,"error":{"code":"FORBIDDEN","message":null}}',
    ):
        refused = wire.decode_down_frame(data)
        assert isinstance(refused, wire.AckFrame)
        assert isinstance(refused.error, wire.WireErrorBody)
        error = wire.error_from_wire(refused.error)
        assert error is not None
        assert (error.code, error.message) == (ErrorCode.FORBIDDEN, "FORBIDDEN")
    lost = wire.decode_down_frame(
        '{"kind":"unsubscribed","sessionId":"s1","reason":"gone","error":{"code":"FORBIDDEN"}}'
    )
    assert isinstance(lost, wire.UnsubscribedFrame)
    assert isinstance(lost.error, wire.WireErrorBody)
    gone = wire.error_from_wire(lost.error)
    assert gone is not None
    assert (gone.code, gone.message) == (ErrorCode.FORBIDDEN, "FORBIDDEN")
    envelope = wire.error_from_wire(b'{"error":{"code":"CALL_REFUSED","details":{"n":1}}}')
    assert envelope is not None
    assert (envelope.code, envelope.message, envelope.details) == (
        ErrorCode.CALL_REFUSED,
        "CALL_REFUSED",
        {"n": 1},
    )


def test_push_body_shapes() -> None:
    body = wire.decode_push_body(b'{"events": [{"type": "t"}], "presence": null}')
    assert body.events == [wire.PushedEventWire("t")]
    for bad in (b"", b"{}", b'{"events": {}}', b'{"presence": {"participant": "p"}}', b"null"):
        with pytest.raises(A2Error) as caught:
            wire.decode_push_body(bad)
        assert caught.value.code is ErrorCode.INVALID_PAYLOAD


# -- SSE -----------------------------------------------------------------------------


def test_sse_frames_for_feed_items() -> None:
    frame = sse.encode_item(event(4))
    assert frame.startswith(b"id: 4\nevent: event\ndata: {")
    assert frame.endswith(b"}\n\n")
    patch = sse.encode_item(a2trio.PresencePatch("p", {"f": None}, 0, 0))
    assert patch.startswith(b"event: presence\ndata: ")
    assert sse.encode_comment("ping") == b": ping\n\n"
    error = sse.encode_error_frame(A2Error(ErrorCode.STORE_UNAVAILABLE, "down"))
    assert (
        error == b'event: error\ndata: {"error":{"code":"STORE_UNAVAILABLE","message":"down"}}\n\n'
    )


def test_sse_decoder_one_byte_at_a_time() -> None:
    stream = (
        b": hello\n\n"
        + sse.encode_item(event(1))
        + b"event: custom\r\ndata: line one\r\ndata: line two\r\n\r\n"
        + b"data: bare\r\r"
        + sse.encode_comment("ping")
    )
    frames: list[sse.SSEEvent] = []
    decoder = sse.SSEDecoder()
    for position in range(len(stream)):
        frames += decoder.feed(stream[position : position + 1])
    assert [(f.event, f.id) for f in frames] == [
        ("event", "1"),
        ("custom", "1"),
        ("message", "1"),
    ]
    assert json.loads(frames[0].data)["id"] == "e-1"
    assert frames[1].data == "line one\nline two"
    assert frames[2].data == "bare"


def test_sse_decoder_bounds_a_line() -> None:
    decoder = sse.SSEDecoder()
    with pytest.raises(ValueError, match="SSE line exceeds"):
        decoder.feed(b"data: " + b"x" * sse.MAX_SSE_LINE_BYTES)


def test_sse_decoder_ignores_ids_with_nul_and_unknown_fields() -> None:
    decoder = sse.SSEDecoder()
    frames = decoder.feed(b"id: 7\ndata: a\n\nid: 8\x009\nretry: 10\ndata: b\n\n")
    assert [(f.id, f.data) for f in frames] == [("7", "a"), ("7", "b")]


@pytest.mark.parametrize("stamp", ["-5", "1.5", "１２３", "1234567890123"])
def test_scheduler_signatures_need_an_epoch_seconds_stamp(stamp: str) -> None:
    body = b"{}"
    headers = scheduler.sign_task("s3cret", body, timestamp=1_000)
    headers[scheduler.TIMESTAMP_HEADER] = stamp
    with pytest.raises(Refusal, match="must be epoch seconds") as refused:
        scheduler.verify_signature("s3cret", body, headers, now_s=1_000)
    assert refused.value.status == 403
    assert refused.value.error.code is ErrorCode.FORBIDDEN
