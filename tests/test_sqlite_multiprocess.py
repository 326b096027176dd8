"""Several OS processes sharing one SQLite file (issue 4's acceptance test).

Three worker processes, each with its own ``a2trio.Server`` on the same file,
drain what a writer process appends: 1,000 jobs across 20 sessions. Then one
worker is SIGKILLed in the middle of a handler, and its event still completes
exactly once after the lease lapses, on another worker.

The processes are real (``subprocess``), the file is real, and the checks read
the database directly with ``sqlite3``: what is asserted is what is stored.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.sqlite_workers.app import VICTIM_FILE

ROOT = Path(__file__).resolve().parent.parent
JOBS = 1_000
SESSIONS = 20
WORKERS = 3
#: Hang guard for each phase, generous for a loaded machine. Not an assertion
#: about speed: bench/ measures that.
PHASE_DEADLINE_S = 180.0
PREFIX = "jobs"


def _command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"tests.sqlite_workers.{module}", *args]


def _run_writer(*args: str) -> None:
    done = subprocess.run(
        _command("writer", *args),
        cwd=ROOT,
        capture_output=True,
        timeout=PHASE_DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


def _wait_for(what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + PHASE_DEADLINE_S
    while not ready():
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited {proc.returncode} (see its log)")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _query(path: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _unprocessed(path: str, event_type: str) -> int:
    [(count,)] = _query(
        path,
        "select count(*) from a2_events where event_type = ? and processed_at is null",
        event_type,
    )
    assert isinstance(count, int)
    return count


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three worker processes on ``tmp_path/shared.db``, logging to
    ``tmp_path/worker-N.log``; terminated at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(WORKERS):
            with (tmp_path / f"worker-{n}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        _command("worker", str(tmp_path / "shared.db"), str(tmp_path)),
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def _check_exactly_once(path: str) -> dict[int, int]:
    """Every job completed once, indexes gap-free, one `done` per job.

    Returns how many jobs each worker pid completed.
    """
    rows = _query(
        path,
        "select session_id, idx, event_type, event_id, cause, processed_by_attempt, "
        "returned_event_ids, failed_at from a2_events order by session_id, idx",
    )
    by_session: dict[object, list[tuple[object, ...]]] = {}
    for row in rows:
        by_session.setdefault(row[0], []).append(row)
    for session_rows in by_session.values():
        assert [row[1] for row in session_rows] == list(range(1, len(session_rows) + 1))

    by_id = {row[3]: row for row in rows}
    triggers = [row for row in rows if row[2] in ("job", "slow")]
    done = [row for row in rows if row[2] == "done"]
    assert len(done) == len(triggers)
    completed_by: dict[int, int] = {}
    for session_id, idx, _, _, _, attempt, returned, failed_at in triggers:
        assert failed_at is None
        assert isinstance(attempt, int)
        assert attempt >= 1
        assert isinstance(returned, str)
        [returned_id] = json.loads(returned)
        child = by_id[returned_id]
        assert child[0] == session_id
        assert isinstance(child[4], str)
        cause = json.loads(child[4])
        assert (cause["index"], cause["attempt"]) == (idx, attempt)
    causes = [(row[0], json.loads(str(row[4]))["index"]) for row in done]
    assert len(set(causes)) == len(causes)
    payloads = _query(path, "select payload from a2_events where event_type = 'done'")
    for (payload,) in payloads:
        pid = json.loads(str(payload))["pid"]
        completed_by[pid] = completed_by.get(pid, 0) + 1
    return completed_by


def test_workers_share_a_file_and_survive_a_sigkill(
    tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    path = str(tmp_path / "shared.db")

    _run_writer(path, str(JOBS), str(SESSIONS))
    [(appended,)] = _query(path, "select count(*) from a2_events where event_type = 'job'")
    assert appended == JOBS
    _wait_for("every job to complete", lambda: _unprocessed(path, "job") == 0, workers)

    completed_by = _check_exactly_once(path)
    assert sum(completed_by.values()) == JOBS
    assert set(completed_by) <= {proc.pid for proc in workers}

    # Phase 2: a worker dies with SIGKILL in the middle of a handler.
    _run_writer(path, "slow")
    victim_file = tmp_path / VICTIM_FILE
    _wait_for("a worker to start the slow job", victim_file.exists, workers)
    _wait_for("the pid to be written", lambda: victim_file.read_text() != "", workers)
    victim = int(victim_file.read_text())
    assert victim in {proc.pid for proc in workers}
    os.kill(victim, signal.SIGKILL)
    survivors = [proc for proc in workers if proc.pid != victim]
    _wait_for("the slow job to complete", lambda: _unprocessed(path, "slow") == 0, survivors)

    [(attempts, by_attempt, holder)] = _query(
        path,
        "select attempt_count, processed_by_attempt, claim_holder from a2_events "
        "where event_id = 'slow-1'",
    )
    assert (attempts, by_attempt, holder) == (2, 2, None)
    [(done_payload,)] = _query(
        path,
        "select payload from a2_events where event_type = 'done' "
        "and json_extract(cause, '$.index') = 1 and session_id like '%slow'",
    )
    assert json.loads(str(done_payload))["pid"] in {proc.pid for proc in survivors}
    completed_by = _check_exactly_once(path)
    assert sum(completed_by.values()) == JOBS + 1
