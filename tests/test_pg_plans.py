"""Generic plans never scan a whole session (real server).

After five executions Postgres may switch a prepared statement to a
*generic* plan. On a table without statistics (a fresh schema, before autovacuum
has analyzed it) the planner guesses one row per session, and a lookup such as
``session_id = $1 and idx = any($2)`` may then read the whole session and
filter it: O(session length) per append, claim and completion. This file builds
a session of 2,000 mostly processed events, prepares the store's hot statements
with generic plans forced, runs each under ``EXPLAIN ANALYZE`` in a rolled-back
transaction, and checks that no plan node reads more than a few dozen rows.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import trio
from psycopg import sql as pgsql

from a2trio.stores.base import AppendEvent, Claimed
from a2trio.stores.postgres import PostgresStore, postgres, sql
from a2trio.stores.postgres.conn import Param, Statement, _encode_param

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backends.postgres import database_dsn, run_sql

pytestmark = pytest.mark.filterwarnings("error")

SESSION = "long"
#: Plain events appended first: far above the bound, so a whole-session read shows.
SESSION_EVENTS = 2_000
#: Of those, the last ones stay claimed and unprocessed.
LEFT_PENDING = 10
FIRST_PENDING = SESSION_EVENTS - LEFT_PENDING + 1
#: Lane ``a``: this one is claimed, the next one waits on it.
LANED = SESSION_EVENTS + 1
#: Three plain events after the lane pair, eligible and unclaimed.
UNCLAIMED = [SESSION_EVENTS + 3, SESSION_EVENTS + 4, SESSION_EVENTS + 5]
#: The most rows any plan node may read. About 16 events are pending, so this
#: admits the pending set and every index probe, never the processed history
#: (a whole-session read is ~2,000 rows, more with dead row versions).
BOUND = 50
# EXPLAIN reports these (and Actual Rows) per loop.
_REMOVED = (
    "Rows Removed by Filter",
    "Rows Removed by Join Filter",
    "Rows Removed by Index Recheck",
)

Plan = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One statement execution, and how many rows it should return."""

    statement: Statement
    params: tuple[Param, ...]
    rows: int


@dataclass(frozen=True)
class Case:
    """Steps run in order in one transaction, each explained, then rolled back."""

    name: str
    steps: tuple[Step, ...]


def _literal(value: Param) -> pgsql.Composable:
    """A parameter exactly as the store sends it: text, cast by the statement."""
    raw = _encode_param(value)
    return pgsql.SQL("null") if raw is None else pgsql.Literal(raw.decode())


def _explain(dsn: str, cases: Sequence[Case]) -> dict[str, list[Plan]]:
    """Each step's ``EXPLAIN ANALYZE`` plan under forced generic plans (blocking)."""
    prepared: dict[bytes, str] = {}
    out: dict[str, list[Plan]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        # After five custom plans Postgres keeps the generic one if it looks no
        # costlier, which it does without statistics; force it from the start.
        conn.execute("set plan_cache_mode = force_generic_plan")
        for case in cases:
            plans: list[Plan] = []
            with conn.transaction(force_rollback=True):
                for step in case.steps:
                    name = prepared.get(step.statement.sql)
                    if name is None:
                        name = prepared[step.statement.sql] = f"plan_{len(prepared)}"
                        conn.execute(
                            pgsql.SQL("prepare {} as {}").format(
                                pgsql.Identifier(name), pgsql.SQL(step.statement.sql.decode())
                            )
                        )
                    query = pgsql.SQL("explain (analyze, format json) execute {}({})").format(
                        pgsql.Identifier(name),
                        pgsql.SQL(", ").join(_literal(p) for p in step.params),
                    )
                    row = conn.execute(query).fetchone()
                    assert row is not None
                    [explained] = cast(list[Plan], row[0])
                    plans.append(explained["Plan"])
            out[case.name] = plans
        # Proof the plans were generic: no statement was ever planned custom.
        modes = conn.execute(
            "select generic_plans, custom_plans from pg_prepared_statements"
        ).fetchall()
        assert len(modes) == len(prepared)
        assert all(generic > 0 and custom == 0 for generic, custom in modes)
    return out


def _nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _reads(node: Plan) -> float:
    """Rows a node produced or discarded, over all its loops."""
    per_loop = node.get("Actual Rows", 0) + sum(node.get(k, 0) for k in _REMOVED)
    return float(per_loop * node.get("Actual Loops", 0))


def _describe(node: Plan) -> str:
    keys = ("Subplan Name", "Relation Name", "Index Name", "Index Cond", "Filter")
    return " ".join([node["Node Type"], *(f"{k}: {node[k]}" for k in keys if k in node)])


async def _long_session(store: PostgresStore) -> int:
    """Fill the session (see the constants); return the store clock's ``now``."""
    # An append of nothing creates the schema; autovacuum stays off for the
    # table, so the plans are made without statistics, as on a fresh schema.
    await store.append(SESSION, [])
    await run_sql(store.dsn, "alter table a2_events set (autovacuum_enabled = false)")
    for start in range(0, SESSION_EVENTS, 200):
        await store.append(SESSION, [AppendEvent("t", {"n": n}) for n in range(start, start + 200)])
    claim = await store.claim_available(SESSION, holder="h", ttl_ms=60_000)
    assert isinstance(claim, Claimed)
    assert len(claim.events) == SESSION_EVENTS
    for index in range(1, FIRST_PENDING):
        done = await store.complete_attempt(SESSION, index=index, attempt=1, events=[])
        assert done.outcome == "completed"
    await store.append(SESSION, [AppendEvent("t", {}, lane="a") for _ in range(2)])
    claim = await store.claim_available(SESSION, holder="h", ttl_ms=60_000)
    assert isinstance(claim, Claimed)
    assert [e.index for e in claim.events] == [LANED]
    await store.append(SESSION, [AppendEvent("t", {}) for _ in UNCLAIMED])
    [(reltuples,)] = await run_sql(
        store.dsn,
        "select reltuples from pg_class where oid = 'a2_events'::regclass",
    )
    # Never analyzed nor vacuumed: the planner has no row count to go on.
    assert reltuples == -1
    return store.clock.now_ms()


def _cases(now: int) -> list[Case]:
    """Each statement with the parameters ``postgres.py`` gives it."""
    later = now + 60_000

    def append(event_id: str | None, cause: int | None, holder: str | None = None) -> Step:
        batch = [
            {
                "ord": 1,
                "id": event_id or "generated-1",
                "type": "t",
                "payload": {},
                "cause": None if cause is None else {"index": cause, "attempt": 1},
                "lane": None,
                "settled": False,
            }
        ]
        ids = [] if event_id is None else [event_id]
        causes = [] if cause is None else [cause]
        # One row: the verdict (no already-stored events to list).
        params = (SESSION, json.dumps(batch), ids, causes, now, holder, later, None)
        return Step(sql.APPEND, params, rows=1)

    def fresh(holder: str | None) -> Step:
        batch = [{"ord": 1, "id": f"fresh-{holder}", "type": "t", "payload": {}, "lane": None}]
        params = (SESSION, json.dumps(batch), now, holder, later)
        return Step(sql.APPEND_FRESH, params, rows=1)

    def claim(exclude: list[int], claimed: int) -> Step:
        return Step(sql.CLAIM, (SESSION, now, "h2", later, exclude, None), rows=claimed)

    def finish(indexes: list[int], laned: bool) -> tuple[Step, Step]:
        attempts = [1] * len(indexes)
        return (
            Step(sql.LOCK_IF_LANED, (SESSION, indexes), rows=1 if laned else 0),
            Step(sql.FINISH, (SESSION, indexes, attempts, now), rows=len(indexes)),
        )

    reply = [{"ord": 1, "id": "reply-1", "type": "t", "payload": {}, "lane": None}]
    complete = (
        *(SESSION, LANED, ["reply-1"], 1, json.dumps(reply), now),
        *(json.dumps({"index": LANED, "attempt": 1}), json.dumps(["reply-1"])),
    )
    renew = (later, SESSION, [FIRST_PENDING + 3, LANED], "h", now, [1, 1])
    return [
        Case("append", (append(None, None),)),
        # A handler's append: its own id, caused by a claimed event.
        Case("append with a cause", (append("fresh-1", FIRST_PENDING),)),
        # `Store.append(claim=...)`: written claimed, other claimable events checked.
        Case("append claimed", (append("fresh-2", None, holder="h3"),)),
        # No supplied ids and no causes: the lean statement, plain and claimed.
        Case("append fresh", (fresh(None),)),
        Case("append fresh claimed", (fresh("h3"),)),
        Case("claim", (claim([], len(UNCLAIMED)),)),
        Case("claim with exclusions", (claim(UNCLAIMED[:1], len(UNCLAIMED) - 1),)),
        Case("claim with a limit", (Step(sql.CLAIM, (SESSION, now, "h2", later, [], 2), rows=2),)),
        Case("finish a lane-less event", finish([FIRST_PENDING], laned=False)),
        Case("finish a lane event", finish([LANED], laned=True)),
        # Group commit finishes a session's events in one statement.
        Case("finish several", finish([FIRST_PENDING + 1, FIRST_PENDING + 2, LANED], laned=True)),
        Case("renew", (Step(sql.RENEW, renew, rows=2),)),
        Case("complete with a returned event", (Step(sql.COMPLETE, complete, rows=1),)),
        Case(
            "fail", (Step(sql.FAIL, (SESSION, FIRST_PENDING + 4, 1, "boom", 3, now, None), rows=1),)
        ),
        # The sweep for stranded work reads the pending set, never the history.
        Case("sweep", (Step(sql.CLAIMABLE_SESSIONS, (SESSION[:2], later, 1_000), rows=1),)),
    ]


async def test_generic_plans_read_a_bounded_number_of_rows_in_a_long_session() -> None:
    dsn = await database_dsn()
    schema = f"x_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema)
    cases: list[Case] = []
    try:
        cases = _cases(await _long_session(store))
        explained = await trio.to_thread.run_sync(_explain, store.dsn, cases)
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
    too_many: list[str] = []
    for case in cases:
        plans = explained[case.name]
        for step, plan in zip(case.steps, plans, strict=True):
            # The statement did its real work (claimed, finished, ...), so the
            # plan below is the one that matters.
            assert plan["Actual Rows"] == step.rows, (case.name, step.statement)
            too_many.extend(
                f"{case.name}: {_reads(node):.0f} rows at {_describe(node)}"
                for node in _nodes(plan)
                if _reads(node) > BOUND
            )
    assert too_many == [], "\n".join(too_many)


async def test_the_stores_connections_plan_generically_and_its_dsn_is_left_alone() -> None:
    dsn = await database_dsn()
    schema = f"x_{secrets.token_hex(6)}"
    store = postgres(dsn, schema=schema)
    try:
        async with store:
            await store.append(SESSION, [AppendEvent("t", {})])
            [[mode]] = await store._db.query(
                Statement("select current_setting('plan_cache_mode')"), ()
            )
        assert mode == "force_generic_plan"
        assert "plan_cache_mode" not in store.dsn
    finally:
        await store.aclose()
        await run_sql(dsn, f'drop schema if exists "{schema}" cascade')
