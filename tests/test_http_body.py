"""Reading a request body (``transport/server/http.read_body``) through a trio
memory channel's ``receive``, as hypercorn's trio worker hands it to the app:
a body already there is taken at once, anything else is awaited within the
body timeout and the size limit, as through any other server's ``receive``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from a2trio.transport import Limits
from a2trio.transport.server.auth import Request
from a2trio.transport.server.http import Disconnected, Message, Refusal, read_body

LIMITS = Limits(max_body_bytes=16, body_timeout_s=5.0)


def post(length: int | None) -> Request:
    headers = {} if length is None else {"content-length": str(length)}
    return Request("POST", "/orders/s1", headers, {})


def part(body: bytes, more: bool = False) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


async def read(request: Request, *messages: Message) -> bytes:
    """``read_body`` with ``messages`` already in the server's channel."""
    sender, receiver = trio.open_memory_channel[Message](8)
    for message in messages:
        sender.send_nowait(message)
    return await read_body(request, receiver.receive, LIMITS)


async def test_a_body_that_arrived_is_taken_without_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.testing.assert_no_checkpoints():
        # Whole by its declared length, before the server's last empty message.
        assert await read(post(4), part(b"abcd", more=True)) == b"abcd"
        assert await read(post(None), part(b"abcd")) == b"abcd"


async def test_a_body_in_parts_is_joined_and_the_last_part_may_come_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await read(post(None), part(b"ab", more=True), part(b"cd")) == b"abcd"
    assert await read(post(4), part(b"ab", more=True), part(b"cd", more=True)) == b"abcd"
    sender, receiver = trio.open_memory_channel[Message](8)
    sender.send_nowait(part(b"ab", more=True))

    async def rest() -> None:
        await trio.sleep(1)
        await sender.send(part(b"cd"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rest)
        assert await read_body(post(4), receiver.receive, LIMITS) == b"abcd"


async def test_limits_and_a_leaving_client_hold_on_either_path(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(Refusal, match="limited to 16 bytes") as declared:
        await read(post(17), part(b"x" * 17))
    with pytest.raises(Refusal, match="limited to 16 bytes") as arrived:
        await read(post(None), part(b"x" * 17))
    with pytest.raises(Refusal, match="limited to 16 bytes") as streamed:
        await read(post(None), part(b"x" * 10, more=True), part(b"x" * 10))
    assert {declared.value.status, arrived.value.status, streamed.value.status} == {413}
    with pytest.raises(Disconnected):
        await read(post(4), {"type": "http.disconnect"})
    with pytest.raises(Disconnected):
        await read(post(4), part(b"ab", more=True), {"type": "http.disconnect"})
    started = trio.current_time()
    with pytest.raises(Refusal, match="did not arrive within 5 s") as late:
        await read(post(4), part(b"ab", more=True))
    assert late.value.status == 408
    assert trio.current_time() - started == pytest.approx(5.0)
