"""The SQLite store's write path costs the same at any session length (issue 17).

Without timing anything: each transaction body of ``a2trio/stores/sqlite/store.py``
(append, claim, completion, over the statements of ``sql.py``) runs on a raw
connection to one file holding two sessions of the same shape, one with a
short history and one with a long one, and SQLite's progress handler counts
the virtual-machine instructions it executes. A statement that walks the
session (``max(idx)`` beside another column, an ``exists`` over the whole
primary-key prefix) executes a few instructions per row it passes, so its
count grows with the history; a seek costs the same at both lengths. Each
body runs inside ``BEGIN IMMEDIATE`` and is rolled back, so every operation
sees the same two sessions.

``EXPLAIN QUERY PLAN`` is checked too, but it cannot tell a seek from a walk
(both read ``SEARCH a2_events USING PRIMARY KEY (session_id=?)``): the counts
are the pin, the plans say which index each statement reads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from a2trio.stores.base import AppendEvent, ClaimRequest, EventCause
from a2trio.stores.sqlite import sql
from a2trio.stores.sqlite.schema import migrate
from a2trio.stores.sqlite.store import _append_rows, _claim_rows, _complete_rows

SHORT = "short"
LONG = "long"
#: History lengths: the long one is 40 times the short one, so a walk over it
#: would show as a count many times the short session's.
HISTORY = {SHORT: 250, LONG: 10_000}
AFTER = "~after"
#: Events per append when writing the history.
FILL = 1_000
NOW = 1_000_000
CLAIM = ClaimRequest(holder="worker-a", ttl_ms=30_000)

Work = Callable[[sqlite3.Connection, str], Any]


def _event(n: int, *, settled: bool = False, lane: str | None = None) -> AppendEvent:
    return AppendEvent("ordered", {"item": f"item-{n}"}, lane=lane, settled=settled)


def _committed(conn: sqlite3.Connection, work: Callable[[], Any]) -> Any:
    conn.execute("begin immediate")
    try:
        result = work()
    except BaseException:
        conn.execute("rollback")
        raise
    conn.execute("commit")
    return result


def _appended(
    conn: sqlite3.Connection,
    session_id: str,
    events: list[AppendEvent],
    claim: ClaimRequest | None = None,
) -> None:
    _committed(conn, lambda: _append_rows(conn, session_id, events, [], claim, NOW))


def _fill(conn: sqlite3.Connection, session_id: str, length: int) -> None:
    """A handled history, then the same live tail in every session:

    ``length + 1`` claimed by ``worker-a``; ``+ 2`` and ``+ 3`` in lane ``L``
    (the first claimed, the second waiting behind it); ``+ 4`` unclaimed; and
    ``+ 5`` dead-lettered.
    """
    for start in range(0, length, FILL):
        _appended(
            conn,
            session_id,
            [_event(n, settled=True) for n in range(start, min(length, start + FILL))],
        )
    _appended(conn, session_id, [_event(-1), _event(-2, lane="L"), _event(-3, lane="L")], CLAIM)
    _appended(conn, session_id, [_event(-4)])
    _appended(conn, session_id, [_event(-5)])
    _committed(
        conn,
        lambda: conn.execute(
            "update a2_events set failed_at = ?, failure_count = 1 "
            "where session_id = ? and idx = ?",
            (NOW, session_id, length + 5),
        ),
    )


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path = Path(tmp_path_factory.mktemp("plans")) / "plans.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _committed(conn, lambda: migrate(conn))
        for session_id, length in HISTORY.items():
            _fill(conn, session_id, length)
        # Sorted after both, so that every index walk the two sessions make
        # ends on another session's row rather than one on the index's end.
        _fill(conn, AFTER, 10)
        yield conn
    finally:
        conn.close()


def _steps(conn: sqlite3.Connection, session_id: str, work: Work) -> int:
    """Virtual-machine instructions ``work`` executes, rolled back after."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.execute("begin immediate")
    try:
        conn.set_progress_handler(count, 1)
        try:
            work(conn, session_id)
        finally:
            conn.set_progress_handler(None, 1)
    finally:
        conn.execute("rollback")
    return steps


def _costs(conn: sqlite3.Connection, work: Work) -> tuple[int, int]:
    # Once untimed each, so that preparing a statement is never counted.
    _steps(conn, SHORT, work)
    _steps(conn, LONG, work)
    return _steps(conn, SHORT, work), _steps(conn, LONG, work)


def _tail(session_id: str) -> int:
    return HISTORY[session_id]


def _append(*events: AppendEvent, claim: ClaimRequest | None = None) -> Work:
    def work(conn: sqlite3.Connection, session_id: str) -> Any:
        return _append_rows(conn, session_id, events, [], claim, NOW)

    return work


def _append_child(conn: sqlite3.Connection, session_id: str) -> Any:
    child = AppendEvent("ordered", {"item": "child"}, cause=EventCause(_tail(session_id) + 1, 1))
    return _append_rows(conn, session_id, [child], [], CLAIM, NOW)


def _replay(conn: sqlite3.Connection, session_id: str) -> Any:
    (stored_id,) = conn.execute(
        "select event_id from a2_events where session_id = ? and idx = ?",
        (session_id, _tail(session_id) + 4),
    ).fetchone()
    event = AppendEvent("ordered", {"item": "item--4"}, stored_id)
    return _append_rows(conn, session_id, [event], [stored_id], CLAIM, NOW)


def _pending(conn: sqlite3.Connection, session_id: str) -> Any:
    return sql.has_pending(conn, session_id)


def _claim(conn: sqlite3.Connection, session_id: str) -> Any:
    return _claim_rows(conn, session_id, NOW, "worker-b", NOW + 30_000, [], None)


def _claim_limited(conn: sqlite3.Connection, session_id: str) -> Any:
    return _claim_rows(conn, session_id, NOW, "worker-b", NOW + 30_000, [], 1)


def _claim_none(conn: sqlite3.Connection, session_id: str) -> Any:
    # The only claimable event excluded: the retry-at path.
    exclude = [_tail(session_id) + 4]
    return _claim_rows(conn, session_id, NOW, "worker-b", NOW + 30_000, exclude, None)


def _complete(index_in_tail: int, returned: int) -> Work:
    def work(conn: sqlite3.Connection, session_id: str) -> Any:
        events = [
            AppendEvent("ordered", {"item": f"out-{n}"}, f"{session_id}-out-{n}")
            for n in range(returned)
        ]
        ids = [e.id for e in events if e.id is not None]
        index = _tail(session_id) + index_in_tail
        return _complete_rows(conn, session_id, index, 1, events, ids, NOW)

    return work


def _frontier(conn: sqlite3.Connection, session_id: str) -> Any:
    return sql.next_index(conn, session_id)


WORK: dict[str, Work] = {
    "append 1": _append(_event(0)),
    "append 1, claimed": _append(_event(0), claim=CLAIM),
    "append 100": _append(*(_event(n) for n in range(100))),
    "append 100, claimed": _append(*(_event(n) for n in range(100)), claim=CLAIM),
    "append 1 settled": _append(_event(0, settled=True)),
    "append 1 in a busy lane": _append(_event(0, lane="L"), claim=CLAIM),
    "append 1 in a new lane": _append(_event(0, lane="M"), claim=CLAIM),
    "append a handler's child": _append_child,
    "append a replay": _replay,
    "append nothing (pending)": _pending,
    "claim": _claim,
    "claim with a limit": _claim_limited,
    "claim, nothing claimable": _claim_none,
    "complete": _complete(1, 0),
    "complete, returning 3": _complete(1, 3),
    "complete a lane's head": _complete(2, 1),
    "frontier": _frontier,
}


@pytest.mark.parametrize("name", list(WORK))
def test_the_write_path_costs_the_same_at_any_session_length(
    populated: sqlite3.Connection, name: str
) -> None:
    short, long = _costs(populated, WORK[name])
    assert long == short, (
        f"{name}: {short} steps at {HISTORY[SHORT]} events, {long} at {HISTORY[LONG]}"
    )


def test_the_count_sees_a_walk(populated: sqlite3.Connection) -> None:
    """The measure itself: the statement issue 17 replaced walks the session,
    and its count grows with the history."""

    def walk(conn: sqlite3.Connection, session_id: str) -> Any:
        return conn.execute(
            "select coalesce(max(idx), 0), exists(select 1 from a2_events "
            "where session_id = ?1 and processed_at is null) "
            "from a2_events where session_id = ?1",
            (session_id,),
        ).fetchone()

    short, long = _costs(populated, walk)
    assert long > 10 * short


class Planned(NamedTuple):
    statement: str
    parameters: tuple[Any, ...]
    #: The partial index of live rows it must read, if it reads live rows.
    live_index: str | None


PLANNED = {
    "TOP_AND_PENDING": Planned(sql.TOP_AND_PENDING, (LONG,), "a2_events_unprocessed"),
    "PENDING": Planned(sql.PENDING, (LONG,), "a2_events_unprocessed"),
    "NEXT_INDEX": Planned(sql.NEXT_INDEX, (LONG,), None),
    "CLAIMABLE": Planned(sql.CLAIMABLE, (LONG, NOW), "a2_events_dispatch_ready"),
    "CLAIM": Planned(sql.CLAIM, (LONG, NOW, "b", NOW + 1, "[]", 3), "a2_events_dispatch_ready"),
    "RETRY_AT": Planned(sql.RETRY_AT, (LONG, NOW), "a2_events_dispatch_ready"),
    "DRAINED": Planned(sql.DRAINED, (LONG,), "a2_events_unprocessed"),
    "OPEN_LANE": Planned(sql.OPEN_LANE, (LONG, "L"), "a2_events_lane_pending"),
    "INSERT": Planned(
        sql.INSERT,
        (LONG, 1, "ordered", "{}", "x", NOW, None, "L", *([None] * 11)),
        "a2_events_lane_pending",
    ),
    "KEYED": Planned(sql.KEYED, (LONG, NOW), "a2_events_dispatch_ready"),
    "CANDIDATES": Planned(sql.CANDIDATES, (LONG, NOW), "a2_events_dispatch_ready"),
    # A key's live slots: through the index of keyed live rows, by key.
    "SLOTS": Planned(sql.SLOTS, ("k", NOW), None),
    "DEBOUNCE_CANDIDATES": Planned(
        sql.DEBOUNCE_CANDIDATES, (LONG, "ordered", "k"), "a2_events_unprocessed"
    ),
    "READY_LANE": Planned(sql.READY_LANE, (LONG, "L"), "a2_events_lane_pending"),
}


def _plan(conn: sqlite3.Connection, statement: str, parameters: tuple[Any, ...]) -> list[str]:
    return [row[3] for row in conn.execute(f"explain query plan {statement}", parameters)]


@pytest.mark.parametrize("name", list(PLANNED))
def test_no_write_path_statement_scans_the_events(populated: sqlite3.Connection, name: str) -> None:
    planned = PLANNED[name]
    plan = _plan(populated, planned.statement, planned.parameters)
    reads = [line for line in plan if "a2_events" in line]
    assert reads, plan
    assert all(line.startswith("SEARCH a2_events USING ") for line in reads), plan
    if planned.live_index is not None:
        assert any(f"INDEX {planned.live_index} (session_id=?" in line for line in reads), plan


def test_a_bounded_read_stops_at_its_bound(populated: sqlite3.Connection) -> None:
    """``read(through_index=...)`` bounds the key range on both sides."""
    plan = _plan(populated, sql.READ, (LONG, 10, 20))
    assert plan == ["SEARCH a2_events USING PRIMARY KEY (session_id=? AND idx>? AND idx<?)"]
