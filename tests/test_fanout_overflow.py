"""Shared encodings and the bounded lag of network subscribers (``fanout.py``).

A subscriber whose client stops reading is dropped once the session has gone
``RING`` events past it: its stream ends resumably, the others never wait
for it, and a resume from the last index it received reads the gap once.
The ASGI app is driven in-process; a "stalled" client is a peer whose
``send`` blocks until the test reads it, as a full socket does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import a2trio
from a2trio.engine import fanout
from a2trio.stores import memory
from a2trio.transport import App, Limits, asgi, sse
from a2trio.transport.server import sockets

from .test_transport import orders, rooms
from .test_transport_asgi import QUIET, Message, Peer, http_scope, send_frame, socket, ws_scope

#: The ring these tests run with: small, so a few appends lap a reader.
SMALL_RING = 4


class StalledPeer(Peer):
    """A client that reads nothing until told: every ``send`` waits for the test."""

    def __init__(self) -> None:
        super().__init__()
        self._outbox_send, self._outbox = trio.open_memory_channel[Message](0)


@asynccontextmanager
async def serving(app: App, scope: Message, peer: Peer) -> AsyncIterator[Peer]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, peer.receive, peer.send)
        yield peer
        nursery.cancel_scope.cancel()


def note(n: int) -> a2trio.AppendInput:
    return orders.event("note", {"text": str(n)})


def indexes(chunks: list[bytes]) -> list[int]:
    decoder = sse.SSEDecoder()
    frames = [f for chunk in chunks for f in decoder.feed(chunk)]
    return [json.loads(f.data)["index"] for f in frames if f.event == "event"]


async def test_every_reader_of_a_session_shares_each_entry_and_its_encoding() -> None:
    calls: list[int] = []

    def encode(event: a2trio.Event[Any]) -> bytes:
        calls.append(event.index)
        return str(event.index).encode()

    server = a2trio.Server(orders, store=memory())
    async with server:
        session = server.session("s1")
        async with session.subscribe() as first, session.subscribe() as second:
            await session.append(note(1), note(2))
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(1):
                one = await first.receive_run()
                two = await second.receive_run()
            assert [e.event.index for e in one] == [1, 2]
            assert [a is b for a, b in zip(one, two, strict=True)] == [True, True]
            assert [e.encoded(encode) for e in one + two] == [b"1", b"2", b"1", b"2"]
            assert calls == [1, 2]


async def test_a_subscriber_lapped_by_the_ring_is_dropped_and_a_stream_reader_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "RING", SMALL_RING)
    server = a2trio.Server(orders, store=memory())
    async with server:
        session = server.session("s1")
        async with session.subscribe() as lane, session.stream() as reader:
            await session.append(note(1))
            with trio.fail_after(1):
                assert [e.event.index for e in await lane.receive_run()] == [1]
                assert (await reader.receive()).index == 1
            for n in range(2, 12):
                await session.append(note(n))
            with pytest.raises(fanout.Lapped, match="resume after index 1") as lapped:
                await lane.receive_run()
            assert lapped.value.last_index == 1
            assert lapped.value.code is a2trio.ErrorCode.STORE_UNAVAILABLE
            # An in-process reader is never dropped: it reads the gap from the store.
            assert [(await reader.receive()).index for _ in range(10)] == list(range(2, 12))


async def test_a_resuming_subscriber_reads_its_gap_from_the_store_then_follows_the_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "RING", SMALL_RING)
    monkeypatch.setattr(fanout, "RUN", 3)
    server = a2trio.Server(orders, store=memory())
    async with server:
        session = server.session("s1")
        async with session.subscribe(9) as live:
            for n in range(1, 11):
                await session.append(note(n))
            assert [e.event.index for e in await live.receive_run()] == [10]
            # Far behind the ring, it is catching up, not lagging: never dropped.
            async with session.subscribe(0) as late:
                runs = [[e.event.index for e in await late.receive_run()] for _ in range(4)]
        assert runs == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]


async def test_an_interrupt_makes_a_waiting_run_come_back_empty(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = a2trio.Server(orders, store=memory())
    async with server:
        session = server.session("s1")
        async with session.subscribe() as lane:
            lane.interrupt()
            assert await lane.receive_run() == []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_interrupt_later, lane)
                assert await lane.receive_run() == []
            await session.append(note(1))
            await trio.testing.wait_all_tasks_blocked()
            lane.interrupt()
            # Ready entries win over an interrupt, which they consume.
            assert [e.event.index for e in await lane.receive_run()] == [1]
            with trio.move_on_after(1) as idle:
                await lane.receive_run()
            assert idle.cancelled_caught


async def _interrupt_later(lane: fanout.Subscription) -> None:
    await trio.sleep(1)
    lane.interrupt()


async def test_a_subscription_on_a_server_that_is_not_open_has_its_own_store_feed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory()
    server = a2trio.Server(orders, store=store)
    session = server.session("s1")
    async with server:
        await session.append(note(1))
    async with session.subscribe() as lane:
        assert store.feed_statistics().listeners == 1
        assert [e.event.index for e in await lane.receive_run()] == [1]
        lane.interrupt()
        assert await lane.receive_run() == []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_interrupt_later, lane)
            assert await lane.receive_run() == []
    assert store.feed_statistics().listeners == 0


async def test_a_stalled_sse_client_is_dropped_the_others_keep_up_and_a_resume_reads_the_gap_once(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(fanout, "RING", SMALL_RING)
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=QUIET)
    scope = http_scope("GET", "/orders/s1", [(b"accept", b"text/event-stream")])
    async with server:
        session = server.session("s1")
        async with (
            serving(app, scope, Peer()) as healthy,
            serving(app, scope, StalledPeer()) as stalled,
        ):
            for peer in (healthy, stalled):
                assert (await peer.heard())["status"] == 200
                assert (await peer.heard())["body"] == b": ok\n\n"
            await session.append(note(1))
            assert indexes([(await healthy.heard())["body"]]) == [1]
            assert indexes([(await stalled.heard())["body"]]) == [1]
            # The stalled client reads nothing more; the healthy one gets every event.
            for n in range(2, 13):
                await session.append(note(n))
                await trio.testing.wait_all_tasks_blocked()
                assert indexes([(await healthy.heard())["body"]]) == [n]
            # Event 2 was on its way when the client stalled; then the ring lapped it.
            assert indexes([(await stalled.heard())["body"]]) == [2]
            end = await stalled.heard()
            [frame] = sse.SSEDecoder().feed(end["body"])
            assert frame.event == "error"
            error = json.loads(frame.data)["error"]
            assert error["code"] == "STORE_UNAVAILABLE"
            assert "resume after index 2" in error["message"]
            assert await stalled.heard() == {"type": "http.response.body", "body": b""}
        resume = http_scope(
            "GET", "/orders/s1", [(b"accept", b"text/event-stream"), (b"last-event-id", b"2")]
        )
        async with serving(app, resume, Peer()) as again:
            assert (await again.heard())["status"] == 200
            assert (await again.heard())["body"] == b": ok\n\n"
            chunks: list[bytes] = []
            while len(indexes(chunks)) < 10:
                chunks.append((await again.heard())["body"])
            assert indexes(chunks) == list(range(3, 13))
            with trio.move_on_after(1):
                await again.heard()
                raise AssertionError("an event was delivered twice")


async def test_a_stalled_socket_loses_its_lapped_lanes_resumably_and_the_others_keep_up(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(fanout, "RING", SMALL_RING)
    monkeypatch.setattr(sockets, "OUTBOX_FRAMES", 1)
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=QUIET)
    subscribe = {"kind": "subscribe", "sessions": [{"id": "s1", "index": 0}]}
    async with server:
        session = server.session("s1")
        async with (
            serving(app, ws_scope("/orders/ws"), Peer()) as healthy,
            serving(app, ws_scope("/orders/ws"), StalledPeer()) as stalled,
        ):
            for peer in (healthy, stalled):
                await socket(peer)
                await send_frame(peer, subscribe)
                assert (await peer.frame())["kind"] == "subscribed"
            for n in range(1, 13):
                await session.append(note(n))
                await trio.testing.wait_all_tasks_blocked()
                assert (await healthy.frame())["index"] == n
            # The writer held one frame, the outbox one, the lane one more.
            assert [(await stalled.frame())["index"] for _ in range(3)] == [1, 2, 3]
            assert await stalled.frame() == {
                "kind": "unsubscribed",
                "sessionId": "s1",
                "reason": "overflow",
                "error": {
                    "code": "STORE_UNAVAILABLE",
                    "message": f"the subscriber fell {SMALL_RING} events behind session 's1' "
                    "and was dropped: resume after index 3",
                },
            }
            # The socket stays open: the client resubscribes from its last index.
            await send_frame(stalled, {"kind": "subscribe", "sessions": [{"id": "s1", "index": 3}]})
            assert (await stalled.frame())["kind"] == "subscribed"
            assert [(await stalled.frame())["index"] for _ in range(9)] == list(range(4, 13))


async def test_a_lapped_single_session_socket_closes_with_try_again_later(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(fanout, "RING", SMALL_RING)
    monkeypatch.setattr(sockets, "OUTBOX_FRAMES", 1)
    server = a2trio.Server(orders, store=memory())
    app = asgi(server, limits=QUIET)
    async with server, serving(app, ws_scope("/orders/s1/ws"), StalledPeer()) as stalled:
        await socket(stalled)
        session = server.session("s1")
        for n in range(1, 13):
            await session.append(note(n))
            await trio.testing.wait_all_tasks_blocked()
        assert [(await stalled.frame())["index"] for _ in range(3)] == [1, 2, 3]
        assert await stalled.heard() == {
            "type": "websocket.close",
            "code": 1013,
            "reason": "overflow: resume after index 3",
        }
        await stalled.tell({"type": "websocket.disconnect"})


@pytest.mark.parametrize("presence", [False, True], ids=["events", "presence"])
async def test_an_idle_sse_stream_pings_after_heartbeat_s_of_silence(
    presence: bool, autojump_clock: trio.testing.MockClock
) -> None:
    server = a2trio.Server(rooms, store=memory())
    app = asgi(server, limits=Limits(heartbeat_s=10, ping_s=1000))
    query = b"presence=1" if presence else b""
    scope = http_scope("GET", "/rooms/r1", [(b"accept", b"text/event-stream")], query)
    async with server, serving(app, scope, Peer()) as peer:
        assert (await peer.heard())["status"] == 200
        assert (await peer.heard())["body"] == b": ok\n\n"
        if presence:
            assert (await peer.heard())["body"].startswith(b"event: presence-snapshot")
        opened = trio.current_time()
        assert (await peer.heard())["body"] == b": ping\n\n"
        assert trio.current_time() - opened == pytest.approx(10)
        await trio.sleep(4)
        await server.session("r1").append(rooms.event("note", {"text": "hi"}))
        assert indexes([(await peer.heard())["body"]]) == [1]
        # Silence counts from the last write, not from the last ping.
        assert (await peer.heard())["body"] == b": ping\n\n"
        assert trio.current_time() - opened == pytest.approx(24)
