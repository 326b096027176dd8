"""A PostgreSQL server of a test's own, for tests that need a server to die.

The machine's shared cluster is never restarted, stopped or reconfigured by a
test: a test that needs an outage ``initdb``s a cluster into a temporary
directory, serves it on a free loopback port, restarts or stops it at will,
and removes it on exit, so concurrent test runs never disturb each other. Its
superuser is ``root`` with trust auth, like the shared server's.

As root (CI), the cluster's commands run as the ``postgres`` user: PostgreSQL
refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.backends.postgres import REQUIRED

__all__ = ["Throwaway", "throwaway_postgres"]


def _bindir() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Throwaway:
    """A running throwaway server: its DSN, and ways to take it down."""

    def __init__(self, bindir: Path, data: Path, port: int) -> None:
        self.bindir = bindir
        self.data = data
        self.port = port
        self.dsn = f"postgresql://root@127.0.0.1:{port}/postgres"

    def _as_owner(self, *command: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *command]
        return list(command)

    async def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        # -w waits for the server itself (start, stop); -t lifts pg_ctl's
        # 60 s bound on that wait, which a loaded machine can exceed.
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "600"]
        command += ["-o", options]
        await trio.run_process(self._as_owner(*command, *args), capture_stdout=True)

    async def start(self) -> None:
        await self._ctl("-l", str(self.data / "server.log"), "start")

    async def restart(self) -> None:
        """Stop (fast: sessions are disconnected) and start again on the same port."""
        await self._ctl("-m", "fast", "-l", str(self.data / "server.log"), "restart")

    async def stop(self) -> None:
        await self._ctl("-m", "immediate", "stop")


@asynccontextmanager
async def throwaway_postgres() -> AsyncIterator[Throwaway]:
    """``initdb`` and start a server in a new temporary directory; stop and
    remove it on exit. (Not under pytest's ``tmp_path``: its parents are
    private to root, and the server runs as ``postgres``.)

    Skips with the reason when PostgreSQL's binaries are not installed (fails
    under ``A2_TEST_POSTGRES_REQUIRED=1``).
    """
    bindir = _bindir()
    if bindir is None:
        reason = "PostgreSQL's initdb is not installed: cannot run a throwaway server"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="a2trio-pg-"))
    data = root / "data"
    server = Throwaway(bindir, data, _free_port())
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "root", "-A", "trust", "--no-sync"]
    await trio.run_process(server._as_owner(*initdb), capture_stdout=True)
    try:
        await server.start()
        yield server
    finally:
        with trio.CancelScope(shield=True):
            try:
                await server.stop()
            except subprocess.CalledProcessError:
                pass  # already down
            shutil.rmtree(root, ignore_errors=True)
