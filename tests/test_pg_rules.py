"""The Postgres store's rule fragments (``a2trio.stores.postgres.sql``): each
rule of ``a2trio.stores.rules`` is one SQL fragment, its numbers taken from
``rules``, decides as the rule does on the table's states (real server), and
every statement that needs the rule spells it through the fragment, never
inline."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import msgspec
import psycopg
import pytest
import trio

from a2trio.stores import rules
from a2trio.stores.postgres import sql
from a2trio.stores.postgres.conn import Statement
from tests.backends.postgres import database_dsn

pytestmark = pytest.mark.filterwarnings("error")

#: Every statement of ``sql``, by name.
STATEMENTS = {name: s.sql.decode() for name, s in vars(sql).items() if isinstance(s, Statement)}

Arg = Literal["row", "sql"]


def _pattern(fragment: Callable[..., str], *args: Arg) -> tuple[re.Pattern[str]]:
    """``fragment``'s text for any arguments: a table alias (``row``) or any
    SQL expression (``sql``); an argument used twice is the same text twice."""
    text = fragment(*(f"\0{i}\0" for i in range(len(args))))
    seen: set[str] = set()
    parts: list[str] = []
    for piece in re.split(r"(\0\d+\0)", text):
        if not re.fullmatch(r"\0\d+\0", piece):
            parts.append(re.escape(piece))
        elif piece in seen:
            parts.append(f"(?P=a{piece[1:-1]})")
        else:
            seen.add(piece)
            kind = r"\w+" if args[int(piece[1:-1])] == "row" else ".+?"
            parts.append(f"(?P<a{piece[1:-1]}>{kind})")
    return (re.compile("".join(parts), re.DOTALL),)


class Spelling(msgspec.Struct, frozen=True):
    """A fragment (its ``forms``), the statements that use it, and what only
    its text spells (``signature``: nowhere else in any statement)."""

    forms: tuple[re.Pattern[str], ...]
    users: frozenset[str]
    signature: str | None = None

    def used_in(self, text: str) -> bool:
        return any(form.search(text) for form in self.forms)

    def without(self, text: str) -> str:
        for form in self.forms:
            text = form.sub("", text)
        return text


def _users(*names: str) -> frozenset[str]:
    return frozenset(names)


CLAIMING = ("APPEND", "APPEND_FRESH", "CLAIMABLE_SESSIONS", "CLAIM", "CLAIM_KEYED", "LOCK_KEYS")

SPELLINGS: dict[str, Spelling] = {
    "alive": Spelling(
        _pattern(sql.alive, "row"),
        _users(
            *CLAIMING,
            "RENEW",
            "COMPLETE",
            "FINISH",
            "FAIL",
            "RELEASE",
            "DEBOUNCE",
            "LIST_SESSIONS",
            "RETRY_CANDIDATES",
            "JOURNAL_WRITE",
        ),
        signature=r"failed_at is null",
    ),
    "claim_free": Spelling(
        _pattern(sql.claim_free, "row", "sql"),
        _users(*CLAIMING, "DEBOUNCE"),
        signature=r"claim_expires_at (is null|<=)",
    ),
    "claim_live": Spelling(
        _pattern(sql.claim_live, "row", "sql"),
        _users("CLAIM", "RENEW", "CLAIM_KEYED", "CLAIMABLE_SESSIONS"),
        signature=r"claim_expires_at >",
    ),
    "dispatch_ready": Spelling(
        _pattern(sql.dispatch_ready, "row"), _users(*CLAIMING, "RETRY_CANDIDATES")
    ),
    "ripe": Spelling(
        _pattern(sql.ripe, "row", "sql"),
        _users(*CLAIMING),
        signature=r"not_before (is null|<=)",
    ),
    "claimable": Spelling(_pattern(sql.claimable, "row", "sql"), _users(*CLAIMING)),
    "held": Spelling(_pattern(sql.held, "row", "sql"), _users("CLAIM", "CLAIM_KEYED")),
    "live_slot": Spelling(
        _pattern(sql.live_slot, "row", "sql"), _users("CLAIM", "CLAIM_KEYED", "CLAIMABLE_SESSIONS")
    ),
    "has_room": Spelling(_pattern(sql.has_room, "row", "sql"), _users("CLAIMABLE_SESSIONS")),
    "claims_at_insert": Spelling(
        _pattern(sql.claims_at_insert, "row", "sql"), _users("APPEND", "APPEND_FRESH")
    ),
    "retry_backoff_ms": Spelling(
        _pattern(sql.retry_backoff_ms, "sql"), _users("CLAIMABLE_SESSIONS"), signature=r"<<"
    ),
    "due": Spelling(
        _pattern(sql.due, "row", "sql"),
        _users("CLAIMABLE_SESSIONS"),
        signature=r"last_failed_at \+",
    ),
    "sweepable": Spelling(_pattern(sql.sweepable, "row", "sql"), _users("CLAIMABLE_SESSIONS")),
    "holds_claim": Spelling(
        _pattern(sql.holds_claim, "row", "sql"),
        _users("COMPLETE", "FINISH", "FAIL", "RELEASE", "JOURNAL_WRITE"),
    ),
    "renews": Spelling(_pattern(sql.renews, "row", "sql", "sql", "sql"), _users("RENEW")),
    "cause_fenced": Spelling(_pattern(sql.cause_fenced, "row", "sql"), _users("APPEND")),
    "has_pending": Spelling(
        _pattern(sql.has_pending, "sql"), _users("HAS_PENDING", "APPEND", "APPEND_FRESH")
    ),
    "hands_on": Spelling(_pattern(sql.hands_on, "row"), _users("SKIP", "DEBOUNCE")),
    "debounces": Spelling(
        _pattern(sql.debounces, "row", "sql", "sql", "sql"),
        _users("DEBOUNCE"),
        signature=r"debounce_key = ",
    ),
    "ready_at_insert": Spelling(
        (
            *_pattern(lambda new, session: sql.ready_at_insert(new, session), "row", "sql"),
            *_pattern(sql.ready_at_insert, "row", "sql", "sql"),
        ),
        _users("APPEND", "APPEND_FRESH", "COMPLETE"),
        signature=r"lane is null",
    ),
    "next_in_lane": Spelling(
        _pattern(sql.next_in_lane, "sql", "sql", "sql"),
        _users("COMPLETE", "FINISH", "SKIP", "DEBOUNCE"),
        signature=r"min\(\w+\.idx\)",
    ),
    "drained": Spelling(_pattern(sql.drained, "sql", "sql"), _users("COMPLETE", "FINISH")),
}


@pytest.mark.parametrize("rule", SPELLINGS)
def test_the_statements_that_need_a_rule_spell_it_through_its_fragment(rule: str) -> None:
    spelling = SPELLINGS[rule]
    users = {name for name, text in STATEMENTS.items() if spelling.used_in(text)}
    assert users == spelling.users, sorted(users ^ spelling.users)
    if spelling.signature is None:
        return
    # The rule's text is nowhere but in its fragment: a statement that spells
    # it inline (or a new one) leaves it behind here.
    inline = {
        name: found
        for name, text in STATEMENTS.items()
        if (found := re.findall(spelling.signature, spelling.without(text)))
    }
    assert inline == {}


def test_the_backoff_fragment_carries_the_rules_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = sql.retry_backoff_ms("f")
    for number in (rules.RETRY_FIRST_MS, rules.RETRY_MAX_DOUBLINGS, rules.RETRY_CAP_MS):
        assert re.search(rf"\b{number}\b", backoff), (number, backoff)
    assert backoff in STATEMENTS["CLAIMABLE_SESSIONS"].replace("e.failure_count", "f")
    # Read from `rules` when the statement is built, not copied.
    monkeypatch.setattr(rules, "RETRY_CAP_MS", 12_345)
    assert "12345" in sql.retry_backoff_ms("f")


def _fetch(dsn: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


async def test_sql_backoff_is_the_rules_backoff() -> None:
    dsn = await database_dsn()
    query = f"select n, {sql.retry_backoff_ms('n')} from generate_series(1, 12) as n"
    rows = await trio.to_thread.run_sync(_fetch, dsn, query)
    assert rows == [(n, rules.retry_backoff_ms(n)) for n in range(1, 13)]


#: A state's row as the table's columns (the fragments' alias ``e``).
_ROW = (
    "name text, lane text, lane_ready boolean, processed_at bigint, failed_at bigint,"
    " attempt_count int, claim_holder text, claim_expires_at bigint, failure_count int,"
    " last_failed_at bigint, not_before bigint, event_type text, debounce_key text"
)


def _columns(name: str, facts: rules.Facts) -> dict[str, object]:
    return {
        "name": name,
        "lane": facts.lane,
        "lane_ready": facts.lane_ready,
        "processed_at": facts.processed_at_ms,
        "failed_at": facts.failed_at_ms,
        "attempt_count": facts.attempt_count,
        "claim_holder": facts.claim_holder,
        "claim_expires_at": facts.claim_expires_at_ms,
        "failure_count": facts.failure_count,
        "last_failed_at": facts.last_failed_at_ms,
        "not_before": facts.not_before_ms,
        "event_type": facts.type,
        "debounce_key": facts.debounce_key,
    }


@pytest.mark.parametrize(("attempt", "holder"), [(1, "h1"), (2, "h2"), (1, "h9")])
async def test_each_fragment_decides_as_its_rule_on_the_tables_states(
    attempt: int, holder: str
) -> None:
    now = str(rules.NOW)
    decided: dict[str, tuple[str, Callable[[rules.Facts], bool]]] = {
        "alive": (sql.alive("e"), rules.alive),
        "claim_free": (
            sql.claim_free("e", now),
            lambda r: rules.claim_free(r.claim_expires_at_ms, rules.NOW),
        ),
        "claim_live": (
            sql.claim_live("e", now),
            lambda r: not rules.claim_free(r.claim_expires_at_ms, rules.NOW),
        ),
        "dispatch_ready": (sql.dispatch_ready("e"), lambda r: rules.alive(r) and r.lane_ready),
        "ripe": (sql.ripe("e", now), lambda r: rules.ripe(r.not_before_ms, rules.NOW)),
        "debounces": (
            sql.debounces("e", "'note'", "'k'", now),
            lambda r: rules.debounces(r, "note", "k", rules.NOW),
        ),
        "claimable": (sql.claimable("e", now), lambda r: rules.claimable(r, rules.NOW)),
        "held": (sql.held("e", now), lambda r: rules.held(r, rules.NOW)),
        "due": (sql.due("e", now), lambda r: rules.due(r, rules.NOW)),
        "sweepable": (sql.sweepable("e", now), lambda r: rules.sweepable(r, rules.NOW)),
        "holds_claim": (
            sql.holds_claim("e", str(attempt)),
            lambda r: rules.holds_claim(r, attempt),
        ),
        "renews": (
            sql.renews("e", str(attempt), f"'{holder}'", now),
            lambda r: rules.renew_verdict(r, attempt, holder, rules.NOW) == "renewed",
        ),
        "hands_on": (sql.hands_on("e"), rules.hands_on),
    }
    states = {name: facts for name, facts in rules.STATES.items() if facts is not None}
    tests = ", ".join(f"({fragment}) is true" for fragment, _ in decided.values())
    query = f"select name, {tests} from jsonb_to_recordset(%s::jsonb) as e({_ROW})"
    table = msgspec.json.encode([_columns(name, facts) for name, facts in states.items()])
    dsn = await database_dsn()
    rows = await trio.to_thread.run_sync(_fetch, dsn, query, table.decode())
    answers = {row[0]: dict(zip(decided, row[1:], strict=True)) for row in rows}
    expected = {
        name: {rule: decide(facts) for rule, (_, decide) in decided.items()}
        for name, facts in states.items()
    }
    assert answers == expected
