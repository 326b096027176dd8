"""The durable handlers' journal (``store.journal``, issue 34): steps
written once per (event, name), in order, and fenced by the attempt that
holds the event's claim (``rules.journals``)."""

from __future__ import annotations

from ...errors import ErrorCode
from ..base import Journal, Store
from .kit import (
    T0,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    append_n,
    claim,
    claimed_events,
    new_sid,
    raises,
)

__all__ = ["check_journal_erased_with_its_session", "check_journal_fence", "check_journal_steps"]


def _journal(store: Store) -> Journal:
    if store.journal is None:
        raise CapabilityMissing("journal")
    return store.journal


async def check_journal_steps(open_store: StoreFactory) -> None:
    """A step is journaled durably once per (event, name): read back in the
    order written, a repeat of a name answers the first entry unchanged,
    and each event (and session) has its own journal."""
    clock = ManualClock()
    async with open_store(clock) as store:
        journal = _journal(store)
        sid, other = new_sid("journal"), new_sid("journal-other")
        await append_n(store, sid, 2)
        await append_n(store, other, 1)
        claimed_events(await claim(store, sid))
        claimed_events(await claim(store, other))
        assert await journal.read_journal(sid, 1) == [], "a new event has no steps"
        assert await journal.read_journal(sid, 9) == [], "no event, no steps"
        clock.advance(5)
        first = await journal.write_step(
            sid, index=1, attempt=1, name="charge", result=b'{"id":"ch-1","cents":1250}'
        )
        assert (first.name, first.result, first.attempt, first.at_ms) == (
            "charge",
            b'{"id":"ch-1","cents":1250}',
            1,
            T0 + 5,
        ), first
        clock.advance(5)
        # Names sort the other way from the order written: the order is kept.
        await journal.write_step(sid, index=1, attempt=1, name="a-second", result=b'"\xc3\xa9"')
        again = await journal.write_step(sid, index=1, attempt=1, name="charge", result=b"null")
        assert again == first, f"a repeat answers the first entry, got {again!r}"
        await journal.write_step(sid, index=2, attempt=1, name="charge", result=b"2")
        await journal.write_step(other, index=1, attempt=1, name="charge", result=b"3")
        entries = await journal.read_journal(sid, 1)
        assert [(e.name, e.result, e.at_ms) for e in entries] == [
            ("charge", b'{"id":"ch-1","cents":1250}', T0 + 5),
            ("a-second", b'"\xc3\xa9"', T0 + 10),
        ], entries
        assert [e.result for e in await journal.read_journal(sid, 2)] == [b"2"]
        assert [e.result for e in await journal.read_journal(other, 1)] == [b"3"]
        # A later attempt reads what the earlier one journaled.
        clock.advance(2_000)
        retaken = claimed_events(await claim(store, sid, holder="h2"))
        assert [e.attempt_count for e in retaken] == [2, 2]
        assert await journal.read_journal(sid, 1) == entries
        late = await journal.write_step(sid, index=1, attempt=2, name="ship", result=b"{}")
        assert late.attempt == 2
        assert [e.name for e in await journal.read_journal(sid, 1)] == [
            "charge",
            "a-second",
            "ship",
        ]


async def check_journal_fence(open_store: StoreFactory) -> None:
    """Only the attempt that holds the event's claim journals: a superseded
    attempt, an unclaimed, processed or dead-lettered event is refused with
    ``SUPERSEDED_ATTEMPT`` and nothing is written; a missing index is a
    ``ValueError``."""
    clock = ManualClock()
    async with open_store(clock) as store:
        journal = _journal(store)
        sid = new_sid("journal-fence")
        await append_n(store, sid, 3)
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await journal.write_step(sid, index=1, attempt=0, name="s", result=b"0")
        try:
            await journal.write_step(sid, index=9, attempt=1, name="s", result=b"0")
        except ValueError:
            pass
        else:
            raise AssertionError("a step of a missing event must raise ValueError")
        claimed_events(await claim(store, sid, ttl_ms=1_000))
        clock.advance(1_000)
        claimed_events(await claim(store, sid, holder="h2"))
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await journal.write_step(sid, index=1, attempt=1, name="s", result=b"1")
        assert await journal.read_journal(sid, 1) == [], "a superseded step landed"
        await journal.write_step(sid, index=1, attempt=2, name="s", result=b"2")
        done = await store.complete_attempt(sid, index=1, attempt=2, events=[])
        assert done.outcome == "completed"
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await journal.write_step(sid, index=1, attempt=2, name="t", result=b"3")
        failed = await store.fail_attempt(sid, index=2, attempt=2, error="e", max_failures=1)
        assert failed.outcome == "dead_lettered", failed
        with raises(ErrorCode.SUPERSEDED_ATTEMPT):
            await journal.write_step(sid, index=2, attempt=2, name="s", result=b"4")
        assert [e.result for e in await journal.read_journal(sid, 1)] == [b"2"]
        assert await journal.read_journal(sid, 2) == []


async def check_journal_erased_with_its_session(open_store: StoreFactory) -> None:
    """Erasing a session (``store.retention``) erases its journal: a session
    written again under the same id starts with none."""
    clock = ManualClock()
    async with open_store(clock) as store:
        journal = _journal(store)
        retention = store.retention
        if retention is None:
            raise CapabilityMissing("retention")
        sid, kept = new_sid("journal-erased"), new_sid("journal-kept")
        for session in (sid, kept):
            await append_n(store, session, 1)
            claimed_events(await claim(store, session))
            await journal.write_step(session, index=1, attempt=1, name="s", result=b"1")
            await store.complete_attempt(session, index=1, attempt=1, events=[])
        await retention.erase(sid)
        assert await journal.read_journal(sid, 1) == [], "an erased session kept its journal"
        await append_n(store, sid, 1)
        claimed_events(await claim(store, sid))
        assert await journal.read_journal(sid, 1) == []
        again = await journal.write_step(sid, index=1, attempt=1, name="s", result=b"2")
        assert again.result == b"2", "a step of the new event answered the erased one"
        assert [e.result for e in await journal.read_journal(kept, 1)] == [b"1"]
