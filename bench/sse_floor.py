"""The floor for SSE fan-out: a raw ``trio.serve_tcp`` broadcaster.

It speaks just enough HTTP/1.1 for ``bench/stream.py``'s sse scenario and
writes the bytes a2trio's lane writes: ``GET /bench/{session}`` with
``Accept: text/event-stream`` answers a chunked ``text/event-stream`` that
opens with an ``ok`` comment, then carries an ``event`` frame (``id:`` its
index, ``data:`` the wire event's JSON) for each event posted to the
session; ``POST /bench/{session}`` with ``{"events": [...]}`` appends them
and answers their indexes. There is no store, no routing, no ASGI, no
access review and no heartbeat: each follower is one task waiting on the
session's current ``trio.Event``, which an append sets and replaces, and
writing the shared frame with ``send_all``. What a2trio spends beyond this
per delivery is its own.

Run (``bench/stream.py --floor`` starts it)::

    .venv/bin/python bench/sse_floor.py [--port 0]

Prints ``http://HOST:PORT`` and ``Ctrl-C to stop`` once it listens.
"""

from __future__ import annotations

import argparse
import json

import trio

__all__ = ["Session", "serve"]

HEAD_LIMIT = 16 * 1024
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class Session:
    """One session's log and its followers' wake-up."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.changed = trio.Event()

    def append(self, events: list[dict[str, object]]) -> list[int]:
        indexes = []
        for event in events:
            index = len(self.frames) + 1
            wire = {"index": index, "type": event["type"], "payload": event["payload"]}
            data = json.dumps(wire, separators=(",", ":")).encode()
            self.frames.append(chunk(b"id: %d\nevent: event\ndata: %s\n\n" % (index, data)))
            indexes.append(index)
        self.changed.set()
        self.changed = trio.Event()
        return indexes

    async def follow(self, stream: trio.SocketStream) -> None:
        await stream.send_all(SSE_HEAD + chunk(b": ok\n\n"))
        sent = len(self.frames)
        while True:
            if sent == len(self.frames):
                await self.changed.wait()
            frames, sent = self.frames[sent:], len(self.frames)
            await stream.send_all(b"".join(frames))


async def read_head(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    """The next request's head (through the blank line), or None at EOF."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > HEAD_LIMIT:
            raise ValueError("request head too long")
        data = await stream.receive_some()
        if not data:
            return None
        buffer += data
    head = bytes(buffer[: end + 4])
    del buffer[: end + 4]
    return head


async def serve(port: int) -> None:
    sessions: dict[str, Session] = {}

    async def handle(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while (head := await read_head(stream, buffer)) is not None:
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                session = sessions.setdefault(target.removeprefix("/bench/"), Session())
                if method == "GET":
                    await session.follow(stream)
                    return
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += await stream.receive_some()
                body, buffer[:length] = json.loads(bytes(buffer[:length])), b""
                answer = json.dumps({"indexes": session.append(body["events"])}).encode()
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
        except trio.BrokenResourceError:
            pass

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    print(f"floor serving on http://127.0.0.1:{port}", flush=True)
    print("Ctrl-C to stop", flush=True)
    await trio.serve_listeners(handle, listeners)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    trio.run(serve, parser.parse_args().port)
