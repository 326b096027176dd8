"""The Durable Streams conformance suite against the lane, on each store (issue 37).

``@durable-streams/server-conformance-tests`` 0.3.6 (npm, pinned by
``conformance/durable-streams/package-lock.json``) runs under vitest against
``python -m a2trio.serve a2trio.transport.durable_streams:app --store URL`` in
a subprocess: SQLite in a temporary file, Postgres in this run's own
database, Redis under a key prefix of its own. The suite's result must be
exactly what ``docs/durable-streams.md`` says: every test passes but the ones
its "Not passed" table lists for that store (with the reason), and the
suite's own skips are the ones its "Not run" table lists. A missing npm fails
the test; it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg.conninfo import conninfo_to_dict

from tests.backends import postgres as pg_backend
from tests.backends import redis as redis_backend
from tests.serve_kit import ROOT, start_serve

SUITE = ROOT / "conformance" / "durable-streams"
DOCS = ROOT / "docs" / "durable-streams.md"
#: The suite takes about a minute on SQLite; the bound is a hang guard.
RUN_TIMEOUT_S = 900


def documented(section: str) -> dict[str, set[str]]:
    """Test name -> stores, from a table of ``docs/durable-streams.md``
    (rows ``| `full test name` | stores | why |`` under ``### section``)."""
    text = DOCS.read_text()
    start = text.index(f"### {section}\n")
    end = text.find("\n#", start + 1)
    rows: dict[str, set[str]] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        match = re.match(r"\| `(.+?)` \| ([a-z, ]+) \|", line)
        if match:
            rows[match.group(1)] = {s.strip() for s in match.group(2).split(",")}
    return rows


def expected(section: str, store: str) -> set[str]:
    return {
        name for name, stores in documented(section).items() if store in stores or "all" in stores
    }


async def npm_ready() -> str:
    """``npx``, with the suite's packages installed (``npm ci`` when missing)."""
    npx = shutil.which("npx")
    npm = shutil.which("npm")
    if npx is None or npm is None:
        pytest.fail(
            "npm is not installed: the Durable Streams conformance suite needs Node and npm"
        )
    if not (SUITE / "node_modules" / "@durable-streams" / "server-conformance-tests").is_dir():
        await trio.run_process(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=SUITE
        )
    return npx


async def run_suite(url: str, tmp_path: Path) -> dict[str, Any]:
    npx = await npm_ready()
    report = tmp_path / "report.json"
    env = {**os.environ, "CONFORMANCE_TEST_URL": url}
    with trio.fail_after(RUN_TIMEOUT_S):
        done = await trio.run_process(
            [npx, "vitest", "run", "--reporter=json", f"--outputFile={report}"],
            cwd=SUITE,
            env=env,
            check=False,
            capture_stdout=True,
            capture_stderr=True,
        )
    if not report.exists():
        raise AssertionError(f"vitest wrote no report:\n{done.stdout.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def outcomes(report: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"passed": set(), "failed": set(), "skipped": set()}
    for file in report["testResults"]:
        for test in file["assertionResults"]:
            status = test["status"]
            found["skipped" if status in ("pending", "skipped", "todo") else status].add(
                test["fullName"]
            )
    return found


async def check_store(
    store: str, target: str, args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    started = await start_serve(target, *args, "--port", "0", "--no-access-log", env=env)
    try:
        report = await run_suite(started.url, tmp_path)
    finally:
        started.process.terminate()
        with trio.move_on_after(10):
            await started.process.wait()
        started.process.kill()
    found = outcomes(report)
    assert found["failed"] == expected("Not passed", store), {
        "failed but not documented": sorted(found["failed"] - expected("Not passed", store)),
        "documented but passed": sorted(expected("Not passed", store) - found["failed"]),
    }
    assert found["skipped"] == expected("Not run", store)
    assert report["numTotalTests"] == 338


LANE = "a2trio.transport.durable_streams:app"


async def test_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "streams.db"
    await check_store("sqlite", LANE, ["--store", f"sqlite:///{db}"], {}, tmp_path)


async def test_postgres(tmp_path: Path) -> None:
    dsn = conninfo_to_dict(await pg_backend.database_dsn())
    url = (
        f"postgresql://{dsn.get('user', 'postgres')}@{dsn.get('host', '127.0.0.1')}:"
        f"{dsn.get('port', 5432)}/{dsn['dbname']}"
    )
    await check_store("postgres", LANE, ["--store", url], {}, tmp_path)


async def test_redis(tmp_path: Path) -> None:
    await redis_backend.reachable()
    prefix = redis_backend.new_prefix()
    env = {"DS_TEST_REDIS_URL": redis_backend.REDIS_URL, "DS_TEST_REDIS_PREFIX": prefix}
    try:
        await check_store("redis", "tests.durable_streams_apps:redis_lane", [], env, tmp_path)
    finally:
        await redis_backend.delete_prefix(prefix)
