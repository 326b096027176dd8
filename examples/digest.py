"""A daily digest on a cron: every morning at 07:00 in Paris, one ``digest_due``
event lands in the ``newsroom`` session and a handler writes the digest.

Serve it (as many processes as you like: each fires the cron, and the slot's
derived event ids make exactly one append land per morning)::

    python -m a2trio.serve examples.digest:app

See each cron's last and next slot::

    python -m a2trio.inspect --app examples.digest:server crons

Run the file itself to watch three mornings pass in a second: it serves the
same contract on the memory store under Trio's mock clock (the store's
``TrioClock`` follows it, so the cron's sleeps are virtual)::

    python examples/digest.py
"""

from __future__ import annotations

from datetime import datetime

import msgspec
import trio
import trio.testing

import a2trio
from a2trio.transport import asgi


class DigestDue(msgspec.Struct, frozen=True):
    day: str


class Digest(msgspec.Struct, frozen=True):
    day: str
    text: str


digest_due = a2trio.event_type("digest_due", DigestDue)
digest = a2trio.event_type("digest", Digest)
newsroom = a2trio.contract("newsroom", events=[digest_due, digest])


def morning(slot: datetime) -> list[a2trio.AppendInput]:
    """The cron's events for one slot (an aware datetime in Europe/Paris)."""
    return [digest_due(DigestDue(slot.date().isoformat()))]


# catch_up="latest": after a night with no process running, the missed
# morning still gets its digest when the first process starts.
daily = a2trio.cron(
    "morning-digest", "0 7 * * *", session="newsroom", events=morning, timezone="Europe/Paris"
)


async def write_digest(ctx: a2trio.HandlerContext[DigestDue]) -> a2trio.AppendInput:
    return digest(Digest(ctx.event.payload.day, f"the news of {ctx.event.payload.day}"))


handlers = [a2trio.on(digest_due, write_digest)]
server = a2trio.Server(newsroom, handlers=handlers, crons=[daily])
app = asgi(server)


async def main() -> None:
    # Trio time 0 is 2025-01-01T00:00:00Z on TrioClock's default epoch.
    store = a2trio.stores.memory(clock=a2trio.TrioClock())
    async with a2trio.Server(newsroom, store=store, handlers=handlers, crons=[daily]) as local:
        await trio.sleep(3 * 86_400)
        await local.settle()
        for event in await local.session("newsroom").history():
            print(f"{event.index}: {event.type} {msgspec.to_builtins(event.payload)}")
        for info in await local.inspect.crons():
            print(f"cron {info.name}: last {info.last_slot}, next {info.next_slot}")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
