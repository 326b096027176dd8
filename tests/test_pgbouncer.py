"""The conformance suite through PgBouncer in transaction mode (issue 23).

The test starts its own ``pgbouncer`` (Debian's package; ``scripts/services``
installs it) on a free loopback port in front of the test server, with
``pool_mode = transaction``, and runs every conformance check on stores built
as a deployment behind such a pooler would build them::

    postgres(pooled, listen_dsn=direct, pooler="transaction")

Queries go through the pooler (no prepared statements, no startup
``options``: the schema's ``search_path`` is set per transaction), and only
the listener connects directly. PgBouncer's ``SHOW CLIENTS`` proves the
queries went through it. Without ``pgbouncer`` installed the tests skip, and
fail under ``A2_TEST_POSTGRES_REQUIRED=1`` (CI).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from a2trio.clock import Clock
from a2trio.errors import A2Error, ErrorCode
from a2trio.stores.base import AppendEvent, Store
from a2trio.stores.conformance import CHECKS, REQUIRES, StoreFactory, capabilities
from a2trio.stores.postgres import PostgresStore, postgres

from .backends.postgres import REQUIRED, SERVER_DSN, database_dsn, run_sql

Check = Callable[[StoreFactory], Awaitable[None]]

_STARTUP_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[str, int]]:
    """(host, port) of a PgBouncer in transaction mode in front of the test server."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        _unavailable("pgbouncer is not installed (apt-get install pgbouncer; scripts/services)")
    assert binary is not None
    server = conninfo_to_dict(SERVER_DSN)
    user = str(server.get("user") or "root")
    port = _free_port()
    # Not under pytest's tmp_path: as root, PgBouncer runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="a2trio-pgbouncer-"))
    root.chmod(0o755)
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.get('host') or '127.0.0.1'} port={server.get('port') or 5432}\n"
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
                with psycopg.connect(
                    host="127.0.0.1", port=port, user=user, dbname="pgbouncer", autocommit=True
                ) as admin:
                    admin.execute("show version")
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


async def _pooled_dsn(bouncer: tuple[str, int]) -> str:
    host, port = bouncer
    return make_conninfo(await database_dsn(), host=host, port=port)


def _factory(bouncer: tuple[str, int]) -> StoreFactory:
    @asynccontextmanager
    async def open_store(clock: Clock, **options: Any) -> AsyncIterator[Store]:
        direct = await database_dsn()
        schema = f"b_{secrets.token_hex(6)}"
        store: PostgresStore = postgres(
            await _pooled_dsn(bouncer),
            listen_dsn=direct,
            pooler="transaction",
            clock=clock,
            schema=schema,
            **options,
        )
        try:
            async with store:
                yield store
        finally:
            await store.aclose()
            await run_sql(direct, f'drop schema if exists "{schema}" cascade')

    return open_store


_capabilities: list[frozenset[str]] = []


@pytest.fixture
def open_store(bouncer: tuple[str, int], check: Check) -> StoreFactory:
    factory = _factory(bouncer)
    if not _capabilities:
        _capabilities.append(trio.run(capabilities, factory))
    missing = REQUIRES.get(check.__name__, frozenset()) - _capabilities[0]
    if missing:
        pytest.skip(f"the store has no {' / '.join(sorted(missing))} capability")
    return factory


@pytest.mark.parametrize(
    "check", [pytest.param(c, id=c.__name__.removeprefix("check_")) for c in CHECKS]
)
async def test_conformance_through_pgbouncer(check: Check, open_store: StoreFactory) -> None:
    await check(open_store)


async def test_queries_go_through_the_pooler_and_the_listener_does_not(
    bouncer: tuple[str, int],
) -> None:
    host, port = bouncer
    direct = await database_dsn()
    schema = f"b_{secrets.token_hex(6)}"
    listener_app = f"a2l_{secrets.token_hex(4)}"
    store = postgres(
        await _pooled_dsn(bouncer),
        listen_dsn=make_conninfo(direct, application_name=listener_app),
        pooler="transaction",
        schema=schema,
    )
    try:
        async with store, store.stream("s") as feed:
            await store.wait_listening()
            await store.append("s", [AppendEvent("note", {}, id="e1")])
            assert (await feed.receive()).id == "e1"
            user = str(conninfo_to_dict(SERVER_DSN).get("user") or "root")
            clients = await trio.to_thread.run_sync(_admin_rows, host, port, user, "show clients")
            listeners = await run_sql(
                direct,
                f"select query from pg_stat_activity where application_name = '{listener_app}'",
            )
    finally:
        await store.aclose()
        await run_sql(direct, f'drop schema if exists "{schema}" cascade')
    database = conninfo_to_dict(direct)["dbname"]
    # The pool's connections are PgBouncer's clients; the listener is the
    # server's own, straight from `listen_dsn`.
    assert [c for c in clients if c["database"] == database]
    assert [str(q).split()[0] for (q,) in listeners] == ["listen"]


def _admin_rows(host: str, port: int, user: str, command: str) -> list[dict[str, Any]]:
    with psycopg.connect(
        host=host, port=port, user=user, dbname="pgbouncer", autocommit=True
    ) as admin:
        cursor = admin.execute(command)
        assert cursor.description is not None
        names = [d.name for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


async def test_without_pooler_the_startup_options_are_refused(bouncer: tuple[str, int]) -> None:
    # Why `pooler="transaction"` moves the schema's search_path and the plan
    # mode into each transaction: PgBouncer refuses the startup `options`.
    store = postgres(await _pooled_dsn(bouncer), listen=False, schema="never_created")
    try:
        with pytest.raises(A2Error) as caught:
            await store.read("s")
    finally:
        await store.aclose()
    assert caught.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "unsupported startup parameter: options" in str(caught.value.__cause__)
