"""The Redis scripts' rules: each seed rule one Lua function of ``RULES``.

The text checks fail when a script spells a rule inline again (issue 31:
each rule one named fragment per query language); the Lua checks run
the functions on the real Redis against ``a2trio.stores.rules`` over the
table's states and every boundary, with the seed's backoff numbers and with
others (so a number typed into the Lua instead of interpolated fails).
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType
from typing import Any

import coredis
import msgspec
import pytest
from coredis.retry import NoRetryPolicy

from a2trio.errors import A2Error
from a2trio.stores import rules
from a2trio.stores.base import EventCause
from a2trio.stores.redis import scripts
from tests.backends.redis import REDIS_URL, reachable

#: The Lua function of each rule, and the ``rules`` functions it spells.
FUNCTIONS = {
    "alive": {"alive"},
    "claim_free": {"claim_free"},
    "ripe": {"ripe"},
    "debounces": {"debounces"},
    "claimable": {"claimable"},
    "held": {"held"},
    "busy_until": {"busy_until"},
    "retry_backoff_ms": {"retry_backoff_ms"},
    "due": {"due"},
    "sweepable": {"sweepable"},
    "lane_ready": {"next_in_lane", "ready_at_insert"},
    "cause_current": {"check_cause"},
    "holds_claim": {"holds_claim"},
    "renew_verdict": {"renew_verdict"},
    "drained": {"drained"},
    "has_room": {"has_room"},
    "claims_at_insert": {"claims_at_insert"},
    "live_slots": {"live_slot"},
    "live_starts": {"live_start"},
    "wake_verdict": {"wake_verdict"},
}

#: What a rule looks like spelled out, and the functions of ``RULES`` that
#: may spell it: anywhere else it is a rule written a second time.
SPELLINGS = {
    "a claim's expiry compared": (r"\.x\s*[<>]", {"claim_free", "busy_until"}),
    "processed or dead, negated": (r"\bnot\s+[\w.\[\]]+\.[dp]\b", {"alive", "cause_current"}),
    "the backoff's doubling": (r"\b2\s*\^", {"retry_backoff_ms"}),
    "the backoff's numbers": (r"\bRETRY_", {"retry_backoff_ms"}),
    "the last failure's time": (r"\.lf\b", {"due"}),
    "the not-before compared": (r"\.nb\s*(?:[<>]|==|~=)", {"ripe"}),
    "a debounce key matched": (r"\.k\s*==", {"debounces"}),
    "an attempt compared": (
        r"[~=]=\s*attempt\b|\battempt\s*[~=]=",
        {"cause_current", "holds_claim", "renew_verdict"},
    ),
    "the holder tested": (r"\.h\s*[~=]=|\bnot\s+[\w.\[\]]+\.h\b", {"holds_claim", "renew_verdict"}),
    "a lane looked up": (r"\[\s*[\w.]+\.l\s*\]", {"lane_ready"}),
    "open events against dead ones": (r"==\s*dead\b|\bdead\s*==", {"drained"}),
}


def _functions(text: str) -> dict[str, str]:
    """The ``local function`` definitions of ``text`` by name, each with its
    comment line (a name defined twice fails)."""
    chunks = text.split("\n\n")
    found: dict[str, str] = {}
    for chunk in chunks:
        for name in re.findall(r"^local function (\w+)\(", chunk, re.MULTILINE):
            assert name not in found, f"{name} is defined twice in RULES"
            found[name] = chunk
    return found


def _scripts() -> dict[str, str]:
    """The scripts, without ``BATCH``: it is the batched ones, each whole."""
    return {
        name: value
        for name in scripts.__all__
        if name not in ("RULES", "BATCH") and isinstance(value := getattr(scripts, name), str)
    }


def test_the_batch_script_runs_each_batched_script_whole() -> None:
    for source, number in scripts.BATCHED.items():
        assert f"local function script{number}(KEYS, ARGV)\n{source}\nend\n" in scripts.BATCH


def test_each_rule_is_one_lua_function_naming_its_rule() -> None:
    functions = _functions(scripts.RULES)
    assert set(functions) == set(FUNCTIONS)
    for name, chunk in functions.items():
        named = set(re.findall(r"rules\.(\w+)", chunk.splitlines()[0]))
        assert named == FUNCTIONS[name], name
        assert named <= set(rules.__all__), name


def test_no_script_spells_a_rule_inline() -> None:
    functions = _functions(scripts.RULES)
    for what, (pattern, allowed) in SPELLINGS.items():
        for name, chunk in functions.items():
            if name not in allowed:
                assert not re.search(pattern, chunk), f"{name} spells {what}"
        assert any(re.search(pattern, functions[name]) for name in allowed), what
    calls = re.compile(r"\b(" + "|".join(FUNCTIONS) + r")\(")
    for script, text in _scripts().items():
        includes = text.startswith(scripts.RULES)
        body = text.removeprefix(scripts.RULES)
        assert scripts.RULES not in body, f"{script} includes RULES twice"
        assert includes or not calls.search(body), f"{script} calls a rule without RULES"
        assert not re.search(r"local function (" + "|".join(FUNCTIONS) + r")\(", body), script
        for what, (pattern, _) in SPELLINGS.items():
            assert not re.search(pattern, body), f"{script} spells {what} inline"


def test_the_rules_are_in_the_deciding_scripts() -> None:
    for script in ("APPEND", "CLAIM", "RENEW", "COMPLETE", "SWEEP", "RETRY_CANDIDATES"):
        assert getattr(scripts, script).startswith(scripts.RULES), script


def _scripts_with(monkeypatch: pytest.MonkeyPatch, **numbers: int) -> ModuleType:
    """``scripts`` built afresh with other backoff numbers in ``rules``."""
    for name, value in numbers.items():
        monkeypatch.setattr(rules, name, value)
    spec = importlib.util.spec_from_file_location(
        "a2trio.stores.redis.scripts_probe", scripts.__file__
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_backoff_numbers_come_from_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    numbers = (rules.RETRY_FIRST_MS, rules.RETRY_MAX_DOUBLINGS, rules.RETRY_CAP_MS)
    assert scripts.RULES.startswith(
        "local RETRY_FIRST_MS, RETRY_MAX_DOUBLINGS, RETRY_CAP_MS = {}, {}, {}\n".format(*numbers)
    )
    for script, text in _scripts().items():
        assert str(rules.RETRY_CAP_MS) not in text.removeprefix(scripts.RULES), script
    probe = _scripts_with(monkeypatch, RETRY_FIRST_MS=7, RETRY_MAX_DOUBLINGS=3, RETRY_CAP_MS=50)
    assert probe.RULES.startswith(
        "local RETRY_FIRST_MS, RETRY_MAX_DOUBLINGS, RETRY_CAP_MS = 7, 3, 50\n"
    )
    assert probe.SWEEP.startswith(probe.RULES)


# -- the Lua functions against rules, on the real Redis ------------------------

#: Runs every rule function of the prepended RULES over ARGV[1]'s cases.
_PROBE = r"""
local out = {}
for _, c in ipairs(cjson.decode(ARGV[1])) do
  local m, now, ready, attempt = c.m, c.now, c.ready, c.attempt
  out[#out + 1] = {
    alive(m), claim_free(m, now), ripe(m, now), debounces(m, 'note', 'k', now),
    claimable(m, ready, now), held(m, ready, now),
    busy_until(false, m, ready, now) or false, due(m, now), sweepable(m, ready, now),
    cause_current(m, attempt), holds_claim(m, attempt), renew_verdict(m, attempt, c.holder, now),
  }
end
local backoffs = {}
for f = -1, 12 do backoffs[#backoffs + 1] = retry_backoff_ms(f) end
local lanes, seen = {}, {}
for _, l in ipairs(cjson.decode(ARGV[2])) do
  lanes[#lanes + 1] = lane_ready(seen, l == '' and {} or {l = l})
end
local drains = {}
for _, d in ipairs(cjson.decode(ARGV[3])) do drains[#drains + 1] = drained(d[1], d[2]) end
return cjson.encode({out, backoffs, lanes, drains})
"""


def _meta(row: rules.Facts) -> dict[str, Any]:
    """``row`` as the scripts store it (``redis.codec.Meta``: defaults omitted)."""
    fields = {
        "a": row.attempt_count or None,
        "f": row.failure_count or None,
        "h": row.claim_holder,
        "x": row.claim_expires_at_ms,
        "lf": row.last_failed_at_ms,
        "la": row.last_failed_attempt,
        "d": row.failed_at_ms,
        "p": row.processed_at_ms,
        "pb": row.processed_by_attempt,
        "l": row.lane,
        "nb": row.not_before_ms,
        "t": row.type,
        "k": row.debounce_key,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _rows() -> list[tuple[rules.Facts, list[int]]]:
    """The table's states, and a failed row per failure count, each with the
    instants either side of its claim's and its backoff's boundaries."""
    rows: list[tuple[rules.Facts, list[int]]] = []
    claims = [
        rules.NOW + d for d in (-1, 0, 1, rules.LEASE_MS - 1, rules.LEASE_MS, rules.LEASE_MS + 1)
    ]
    for row in rules.STATES.values():
        if row is not None:
            instants = list(claims)
            if row.failure_count:
                at = (row.last_failed_at_ms or 0) + rules.retry_backoff_ms(row.failure_count)
                instants += [at - 1, at, at + 1]
            if row.not_before_ms is not None:
                at = row.not_before_ms
                instants += [at - 1, at, at + 1]
            rows.append((row, instants))
    for failures in range(1, 10):
        row = rules.Facts(
            attempt_count=failures, failure_count=failures, last_failed_at_ms=rules.NOW
        )
        at = rules.NOW + rules.retry_backoff_ms(failures)
        rows.append((row, [at - 1, at, at + 1]))
    return rows


#: What _PROBE answers per case, in order.
DECIDED = (
    "alive",
    "claim_free",
    "ripe",
    "debounces",
    "claimable",
    "held",
    "busy_until",
    "due",
    "sweepable",
    "check_cause",
    "holds_claim",
    "renew_verdict",
)


def _current(row: rules.Facts, attempt: int) -> bool:
    """Whether ``rules.check_cause`` lets a handler append of ``attempt`` through."""
    try:
        rules.check_cause("s", EventCause(1, attempt), row)
    except A2Error:
        return False
    return True


def _expected(row: rules.Facts, now: int, ready: bool, attempt: int, holder: str) -> list[Any]:
    laned = msgspec.structs.replace(row, lane_ready=ready)
    return [
        rules.alive(row),
        rules.claim_free(row.claim_expires_at_ms, now),
        rules.ripe(row.not_before_ms, now),
        rules.debounces(row, "note", "k", now),
        rules.claimable(laned, now),
        rules.held(laned, now),
        rules.busy_until([laned], now) or False,
        rules.due(row, now),
        rules.sweepable(laned, now),
        _current(row, attempt),
        rules.holds_claim(row, attempt),
        rules.renew_verdict(row, attempt, holder, now),
    ]


LANES = ["a", "", "a", "b", "", "b", "a", "c", "c"]
DRAINS = [[], [True], [False], [True, True], [True, False]]


async def _probe(rules_text: str, cases: list[dict[str, Any]]) -> list[Any]:
    """``_PROBE`` after ``rules_text``: the answers to ``cases``, the
    backoffs of -1 to 12 failures, LANES' readiness and DRAINS' verdicts."""
    await reachable()
    async with coredis.Redis.from_url(REDIS_URL, retry_policy=NoRetryPolicy()) as client:
        drains = [[len(d), sum(d)] for d in DRAINS]
        args = [msgspec.json.encode(cases), msgspec.json.encode(LANES), msgspec.json.encode(drains)]
        reply = await client.eval(rules_text + _PROBE, [], args)
    assert isinstance(reply, bytes)
    return msgspec.json.decode(reply, type=list[Any])


def _lanes_by_rules() -> list[bool]:
    """Lane readiness of LANES' events by ``rules``: the first half open
    rows in index order (``next_in_lane``), the rest inserted after them
    (``ready_at_insert``)."""
    rows = [rules.Facts(lane=lane or None) for lane in LANES]
    half = len(rows) // 2
    ready = [r.lane is None or rules.next_in_lane(r.lane, rows[:half]) is r for r in rows[:half]]
    for i in range(half, len(rows)):
        ready.append(rules.ready_at_insert(rows[i].lane, [r.lane for r in rows[:i]]))
    return ready


async def test_the_lua_rules_decide_as_rules() -> None:
    """Every row, instant, readiness, attempt and holder, by Lua and by rules."""
    cases: list[dict[str, Any]] = []
    expected: list[list[Any]] = []
    for row, instants in _rows():
        for now in instants:
            for ready in (True, False):
                for attempt in (0, 1, 2):
                    for holder in ("h1", "h2"):
                        cases.append(
                            {
                                "m": _meta(row),
                                "now": now,
                                "ready": ready,
                                "attempt": attempt,
                                "holder": holder,
                            }
                        )
                        expected.append(_expected(row, now, ready, attempt, holder))
    answers, backoffs, lanes, drains = await _probe(scripts.RULES, cases)
    assert len(answers) == len(expected)
    for case, want, have in zip(cases, expected, answers, strict=True):
        assert dict(zip(DECIDED, have, strict=True)) == dict(zip(DECIDED, want, strict=True)), case
    assert backoffs == [rules.retry_backoff_ms(f) for f in range(-1, 13)]
    assert lanes == _lanes_by_rules()
    assert drains == [
        rules.drained([rules.Facts(failed_at_ms=1 if dead else None) for dead in d]) for d in DRAINS
    ]


@pytest.mark.parametrize(
    ("first", "doublings", "cap", "backoffs"),
    [
        # The cap binds before the doublings run out.
        (7, 3, 50, [0, 0, 7, 14, 28, 50] + [50] * 8),
        # The doublings run out before the cap binds.
        (7, 2, 1000, [0, 0, 7, 14, 28] + [28] * 9),
    ],
)
async def test_the_lua_backoff_follows_other_numbers(
    monkeypatch: pytest.MonkeyPatch, first: int, doublings: int, cap: int, backoffs: list[int]
) -> None:
    probe = _scripts_with(
        monkeypatch, RETRY_FIRST_MS=first, RETRY_MAX_DOUBLINGS=doublings, RETRY_CAP_MS=cap
    )
    _, got, _, _ = await _probe(probe.RULES, [])
    assert got == backoffs
