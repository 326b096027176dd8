"""The SQLite store's rules in SQL (``a2trio.stores.sqlite.sql``): each
fragment decides as its ``rules`` function does on the table's states, the
statements that stay SQL (lane readiness, the lane hand-off, ``drained``)
decide as theirs do on a few sessions, the backoff carries the rules'
numbers, and no statement spells a rule outside its fragment. Every other
verdict the store reaches is the rules function's own, called in Python.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator

import pytest

from a2trio.stores import rules
from a2trio.stores.sqlite import sql
from a2trio.stores.sqlite.schema import migrate

#: Every statement of ``sql``, by name.
STATEMENTS = {
    name: text for name, text in vars(sql).items() if name.isupper() and isinstance(text, str)
}

NOW = "?1"

FRAGMENTS: dict[str, tuple[str, Callable[[rules.Facts, int], bool]]] = {
    "alive": (sql._ALIVE, lambda row, now: rules.alive(row)),
    "claim_free": (
        sql._claim_free(NOW),
        lambda row, now: rules.claim_free(row.claim_expires_at_ms, now),
    ),
    "ripe": (sql._ripe(NOW), lambda row, now: rules.ripe(row.not_before_ms, now)),
    "claimable": (sql._claimable(NOW), rules.claimable),
    "held": (sql._held(NOW), rules.held),
    "due": (sql._due(NOW), rules.due),
    "sweepable": (sql._sweepable(NOW), rules.sweepable),
}


def _table(rows: dict[str, rules.Facts]) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "create table a2_events (name text, lane_ready integer, processed_at integer,"
        " failed_at integer, claim_expires_at integer, failure_count integer,"
        " last_failed_at integer, not_before integer)"
    )
    conn.executemany(
        "insert into a2_events values (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                name,
                row.lane_ready,
                row.processed_at_ms,
                row.failed_at_ms,
                row.claim_expires_at_ms,
                row.failure_count,
                row.last_failed_at_ms,
                row.not_before_ms,
            )
            for name, row in rows.items()
        ],
    )
    return conn


def _backoff_states() -> dict[str, rules.Facts]:
    """Rows whose backoff ends one ms either side of the table's now, at
    every failure count up to past the cap."""
    return {
        f"{n} failures, {side}": rules.Facts(
            failure_count=n,
            last_failed_at_ms=rules.NOW - rules.retry_backoff_ms(n) + offset,
        )
        for n in range(1, 12)
        for side, offset in (("due", 0), ("waiting", 1))
    }


@pytest.mark.parametrize("rule", FRAGMENTS)
def test_each_fragment_decides_as_its_rule_on_the_tables_states(rule: str) -> None:
    states = {name: row for name, row in rules.STATES.items() if row is not None}
    states |= _backoff_states()
    fragment, decide = FRAGMENTS[rule]
    conn = _table(states)
    try:
        # `?1` selected too, so a fragment that reads no clock binds it.
        query = f"select name, ?1 from a2_events where {fragment}"
        found = {name for name, _ in conn.execute(query, (rules.NOW,))}
    finally:
        conn.close()
    assert found == {name for name, row in states.items() if decide(row, rules.NOW)}


#: Session rows ``(lane, processed, dead)``, by index, for the rules over a
#: session's unprocessed rows.
SESSIONS: dict[str, list[tuple[str | None, bool, bool]]] = {
    "live": [
        ("a", True, False),
        ("b", False, False),
        (None, False, True),
        ("c", False, True),
        ("b", False, False),
    ],
    "dead letters only": [("a", True, False), (None, False, True), ("c", False, True)],
    "handled": [("a", True, False), (None, True, False)],
    "empty": [],
}
LANES = (None, "a", "b", "c", "d")
_ROW = (
    "insert into a2_events (session_id, idx, event_type, payload, event_id, created_at, lane,"
    " processed_at, failed_at) values (?1, ?2, 't', '{}', ?1 || ?2, 0, ?3, ?4, ?5)"
)


@pytest.fixture
def sessions() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    for session_id, rows in SESSIONS.items():
        for index, (lane, processed, dead) in enumerate(rows, 1):
            conn.execute(_ROW, (session_id, index, lane, processed or None, dead or None))
    yield conn
    conn.close()


def _open(session_id: str) -> dict[int, rules.Facts]:
    """The session's unprocessed rows as the rules read them, by index."""
    return {
        index: rules.Facts(lane=lane, failed_at_ms=1 if dead else None)
        for index, (lane, processed, dead) in enumerate(SESSIONS[session_id], 1)
        if not processed
    }


def _readied(conn: sqlite3.Connection, session_id: str, lane: str) -> list[int]:
    """The rows ``READY_LANE`` readies in ``lane``, rolled back after."""
    conn.execute("begin")
    try:
        conn.execute("update a2_events set lane_ready = 0 where session_id = ?", (session_id,))
        conn.execute(sql.READY_LANE, (session_id, lane))
        query = "select idx from a2_events where session_id = ? and lane_ready"
        return [index for (index,) in conn.execute(query, (session_id,))]
    finally:
        conn.execute("rollback")


@pytest.mark.parametrize("session_id", SESSIONS)
def test_the_session_statements_decide_as_their_rules(
    sessions: sqlite3.Connection, session_id: str
) -> None:
    open_rows = _open(session_id)
    open_lanes = [row.lane for row in open_rows.values()]
    for lane in LANES:
        expected = rules.ready_at_insert(lane, open_lanes)
        query = f"select {sql._ready_at_insert('?1', '?2')}"
        assert bool(sessions.execute(query, (session_id, lane)).fetchone()[0]) == expected, lane
        assert rules.ready_at_insert(lane, sql.open_lanes(sessions, session_id, lane)) == expected
        if lane is not None:
            successor = rules.next_in_lane(lane, open_rows.values())
            heads = [index for index, row in open_rows.items() if row is successor]
            assert _readied(sessions, session_id, lane) == heads, lane
    (drained,) = sessions.execute(sql.DRAINED, (session_id,)).fetchone()
    assert bool(drained) == rules.drained(open_rows.values())


def test_the_backoff_carries_the_rules_numbers() -> None:
    due = sql._due(NOW)
    for number in (rules.RETRY_FIRST_MS, rules.RETRY_MAX_DOUBLINGS, rules.RETRY_CAP_MS):
        assert re.search(rf"\b{number}\b", due), (number, due)


#: What only a fragment spells, and the statements that use it.
SIGNATURES = {
    r"claim_expires_at is null": {
        "CLAIMABLE",
        "CLAIM",
        "CLAIMABLE_SESSIONS",
        "RETRY_AT",
        "KEYED",
        "CANDIDATES",
    },
    r"<<": {"CLAIMABLE_SESSIONS"},
    r"last_failed_at \+": {"CLAIMABLE_SESSIONS"},
    r"not_before is null": {"CLAIMABLE", "CLAIM", "CLAIMABLE_SESSIONS", "KEYED", "CANDIDATES"},
}


@pytest.mark.parametrize("signature", SIGNATURES)
def test_no_statement_spells_a_rule_outside_its_fragment(signature: str) -> None:
    users = {name for name, text in STATEMENTS.items() if re.search(signature, text)}
    assert users == SIGNATURES[signature]
    for name in users:
        # Each use is the fragment's own text.
        text = STATEMENTS[name]
        for parameter in set(re.findall(r"\?\d", text)):
            for fragment in (
                sql._sweepable(parameter),
                sql._claimable(parameter),
                sql._held(parameter),
            ):
                text = text.replace(fragment, "")
        assert not re.search(signature, text), (name, text)
