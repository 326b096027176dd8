"""The retention rules (``a2trio.stores.rules.retention``, issue 35) as pure
functions, and their spellings: the Postgres fragment and the Lua function of
``trim_point`` decide as the rule does (real servers)."""

from __future__ import annotations

import coredis
import msgspec
import psycopg
import pytest
import trio
from coredis.retry import NoRetryPolicy

from a2trio import A2Error, ErrorCode, RetentionError
from a2trio.stores import rules
from a2trio.stores.postgres import retention as pg
from a2trio.stores.redis import retention as lua
from tests.backends.postgres import database_dsn
from tests.backends.redis import REDIS_URL, reachable

#: (snapshot index, last index) pairs around every edge of the rule.
POINTS = [(s, n) for s in range(5) for n in range(5)]


@pytest.mark.parametrize(
    ("after", "through", "first", "refused"),
    [
        (0, None, None, False),  # no rows
        (0, None, 1, False),  # never trimmed
        (0, None, 5, True),  # from the start of a session trimmed through 4
        (3, None, 5, True),
        (4, None, 5, False),  # right after the point
        (9, None, 5, False),
        (0, 2, 5, True),  # a range wholly below the point
        (2, 2, 5, False),  # an empty range
        (3, 1, 5, False),
    ],
)
def test_check_read(after: int, through: int | None, first: int | None, refused: bool) -> None:
    if not refused:
        rules.check_read("s", after, through, first)
        return
    with pytest.raises(A2Error) as caught:
        rules.check_read("s", after, through, first)
    assert caught.value.code is ErrorCode.TRIMMED
    assert caught.value.details == {"trimmedThrough": 4}
    assert caught.value.message == (
        f"session 's' is trimmed through index 4: its events from {after + 1} to 4 "
        "were removed; read after 4"
    )


def test_a_read_looks_up_the_first_index_only_when_it_found_nothing_in_a_bounded_range() -> None:
    assert rules.needs_first_index(0, 5, found=False)
    assert not rules.needs_first_index(0, 5, found=True)
    assert not rules.needs_first_index(0, None, found=False), "the last event is never trimmed"
    assert not rules.needs_first_index(5, 5, found=False)


def test_trim_point_keeps_the_last_event() -> None:
    assert [rules.trim_point(s, n) for s, n in [(4, 6), (6, 6), (9, 6), (0, 6), (3, 0)]] == [
        4,
        5,
        5,
        0,
        0,
    ]


def test_check_trim_refuses_without_a_snapshot_or_over_work() -> None:
    assert rules.check_trim("s", "r", 4, 6, None) == 4
    assert rules.check_trim("s", "r", 4, 6, 5) == 4, "work above the point stays"
    with pytest.raises(RetentionError, match=r"no snapshot of reducer 'r'") as caught:
        rules.check_trim("s", "r", None, 6, None)
    assert caught.value.reason == "no_snapshot"
    with pytest.raises(RetentionError, match=r"has event 4 unprocessed") as caught:
        rules.check_trim("s", "r", 4, 6, 4)
    assert caught.value.reason == "unprocessed"


def test_a_live_claim_refuses_and_an_expired_one_does_not() -> None:
    live = rules.HeldClaim(3, "h1", 2, 1_001)
    lapsed = rules.HeldClaim(2, "h1", 1, 1_000)
    released = rules.HeldClaim(1, None, 1, 5_000)
    assert rules.live_claim([released, lapsed, live], 1_000) is live
    assert rules.live_claim([released, lapsed], 1_000) is None
    rules.check_unclaimed("s", None)
    with pytest.raises(RetentionError, match=r"^session 's' has event 3 claimed by 'h1'") as caught:
        rules.check_unclaimed("s", live)
    assert caught.value.reason == "claimed"
    rules.check_expected("s", None, 7)
    rules.check_expected("s", 7, 7)
    with pytest.raises(RetentionError, match=r"is at index 8, not the 7 expected") as caught:
        rules.check_expected("s", 7, 8)
    assert caught.value.reason == "changed"


def _fetch(dsn: str, query: str) -> list[tuple[int, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(query).fetchall()]


async def test_the_sql_trim_point_is_the_rules() -> None:
    dsn = await database_dsn()
    values = ", ".join(f"({s}, {n})" for s, n in POINTS)
    query = f"select {pg.trim_point('s', 'n')} from (values {values}) as t(s, n)"
    rows = await trio.to_thread.run_sync(_fetch, dsn, query)
    assert [row[0] for row in rows] == [rules.trim_point(s, n) for s, n in POINTS]


async def test_the_lua_trim_point_is_the_rules() -> None:
    await reachable()
    probe = (
        "local out = {} for _, p in ipairs(cjson.decode(ARGV[1])) do "
        "out[#out + 1] = trim_point(p[1], p[2]) end return out"
    )
    async with coredis.Redis.from_url(REDIS_URL, retry_policy=NoRetryPolicy()) as client:
        reply = await client.eval(lua.TRIM_RULES + probe, [], [msgspec.json.encode(POINTS)])
    assert isinstance(reply, list)
    assert reply == [rules.trim_point(s, n) for s, n in POINTS]
