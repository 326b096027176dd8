"""A PgBouncer of a test's own, in transaction mode, in front of a Postgres server.

Debian's ``pgbouncer`` (``scripts/services`` installs it) is started on a free
loopback port with ``pool_mode = transaction`` and trust auth, in front of
any server (the shared test server, or a throwaway one a test restarts), and
stopped on exit. Without the binary the caller skips with the reason, or
fails under ``A2_TEST_POSTGRES_REQUIRED=1`` (CI).

As root (CI), PgBouncer runs as ``postgres`` (it refuses to run as root), so
its files live in a world-readable temporary directory, not under pytest's
``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.backends.postgres import REQUIRED

__all__ = ["admin_rows", "pgbouncer"]

#: A hang guard on pgbouncer's start: it answers once it has started.
_STARTUP_S = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer; scripts/services)"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@contextmanager
def pgbouncer(server_host: str, server_port: int, user: str) -> Iterator[tuple[str, int]]:
    """Run PgBouncer in transaction mode in front of ``server_host:server_port``;
    yields its (host, port). Every database name is passed through."""
    binary = _binary()
    port = _free_port()
    root = Path(tempfile.mkdtemp(prefix="a2trio-pgbouncer-"))
    root.chmod(0o755)
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server_host} port={server_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        f"admin_users = {user}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 500\n"
        "default_pool_size = 8\n"
        # After a server restart, log in again at once (default: 15 s).
        "server_login_retry = 1\n"
    )
    for name in ("users.txt", "pgbouncer.ini"):
        (root / name).chmod(0o644)
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = (root / "pgbouncer.log").open("wb")
    process = subprocess.Popen(
        [binary, *as_user, str(root / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + _STARTUP_S
        while True:
            try:
                admin_rows("127.0.0.1", port, user, "show version")
                break
            except psycopg.OperationalError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = (root / "pgbouncer.log").read_text(errors="replace")
                    pytest.fail(f"pgbouncer did not start ({exc}):\n{output}")
                time.sleep(0.05)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def admin_rows(host: str, port: int, user: str, command: str) -> list[dict[str, Any]]:
    """A PgBouncer admin command's rows (``show clients``, ``show stats``, ...)."""
    with psycopg.connect(
        host=host, port=port, user=user, dbname="pgbouncer", autocommit=True
    ) as admin:
        cursor = admin.execute(command)
        if cursor.description is None:
            return []
        names = [d.name for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
