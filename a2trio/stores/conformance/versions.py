"""Schema versions: every event's ``version`` is stored with it and comes back
from every read, unchanged (the engine upcasts from it: :mod:`a2trio.upcasting`).
"""

from __future__ import annotations

import msgspec

from ..base import AppendEvent, ClaimRequest
from .kit import (
    ManualClock,
    StoreFactory,
    claim,
    claimed_events,
    ev,
    new_sid,
    new_uid,
    receive,
)

__all__ = ["check_version_is_stored_with_the_event"]


def _at(event: AppendEvent, version: int | None) -> AppendEvent:
    return msgspec.structs.replace(event, version=version)


async def check_version_is_stored_with_the_event(open_store: StoreFactory) -> None:
    """An event's ``version`` comes back, exactly, from every read: the
    append's rows (claimed at insert or not), ``read``, ``find_event``, a
    claim, ``stream``, ``read_state``'s tail and a completion's returned
    events; None (an event written before versions) stays None, and a replay
    keeps the stored version."""
    async with open_store(ManualClock()) as store:
        sid = new_sid("version")
        fixed = new_uid("versioned")
        plain = await store.append(
            sid,
            [
                _at(ev("ordered", {"item": "a"}, id=fixed, lane="a"), 2),
                ev(lane="a"),
                _at(ev("ordered", {"item": "b"}, settled=True), 7),
            ],
        )
        expected = [2, None, 7]
        assert [e.version for e in plain.events] == expected, plain.events
        assert [e.version for e in await store.read(sid)] == expected
        found = await store.find_event(sid, fixed)
        assert found is not None, "a stored id was not found"
        assert found.version == 2, found
        [claimed] = claimed_events(await claim(store, sid))
        assert (claimed.index, claimed.version) == (1, 2)
        async with store.stream(sid, start_after=0) as feed:
            streamed = await receive(feed, 3)
        assert [e.version for e in streamed] == expected, "the feed lost a version"
        state = await store.read_state(sid, "versions")
        assert [e.version for e in state.events] == expected, "read_state lost a version"
        replayed = await store.append(sid, [_at(ev("ordered", {"item": "a"}, id=fixed), 3)])
        assert [e.version for e in replayed.events] == [2], "a replay rewrote the version"
        done = await store.complete_attempt(
            sid,
            index=1,
            attempt=1,
            events=[_at(ev("r", id=new_uid("returned")), 4), ev("r", id=new_uid("plain"))],
        )
        assert [e.version for e in done.events] == [4, None]
        assert [e.version for e in (await store.read(sid))[-2:]] == [4, None]
        at_insert = await store.append(sid, [_at(ev(), 5)], claim=ClaimRequest("h2", 1_000))
        [row] = at_insert.claimed
        assert row.version == 5
        assert (await store.read(sid))[-1] == row
