"""``serve --workers N``: N hypercorn processes on one port, and their supervisor.

The supervisor (this process) binds the port first with hypercorn's own
sockets (``Config.create_sockets``: ``SO_REUSEADDR``, and ``SO_REUSEPORT``
for more than one worker), which resolves ``--port 0`` and keeps the port
held while workers come and go; it never listens on it. Each worker is a
fresh interpreter (multiprocessing's ``spawn``, as hypercorn's own workers)
that loads the app, checks its stores, and binds and listens on the same port
with ``SO_REUSEPORT``: the kernel spreads new connections over the workers'
listening sockets (Linux hashes them; a socket shared by every worker would
leave the spread to whichever process wakes first). Workers share nothing in
memory: what one worker appends reaches another's followers through the
store (Postgres LISTEN/NOTIFY, Redis pub/sub, SQLite's polling).

Each worker reports on a pipe once it listens (``("ready", binds)``) or why
it could not start (``("failed", line)``). The banner goes out when every
worker is listening. A worker that could not start stops them all (exit
status 1, its reason said once); a worker that dies while serving is logged
(``a2trio.serve`` ERROR: which, its pid, its exit status or signal) and
started again after ``RESTART_DELAY_S``. hypercorn's own supervisor, by
contrast, restarts only a worker that exited with status 0 and stops every
worker when one fails, and says neither.

Ctrl-C (SIGINT, which a terminal sends the whole process group: workers
ignore it) or SIGTERM to the supervisor sends SIGTERM to every worker, each of
which then shuts down as a single ``serve`` does; a worker still running after
``STOP_TIMEOUT_S``, or any when a second signal arrives, is killed. A worker
whose supervisor is gone (killed with SIGKILL) stops by itself
(:func:`orphaned`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final

import trio

from ..stores import MemoryStore, SqliteStore
from ..transport import App, Limits
from ..tuning import tune_gc
from . import serving

__all__ = [
    "ORPHAN_POLL_S",
    "RESTART_DELAY_S",
    "STOP_TIMEOUT_S",
    "Failed",
    "exit_status",
    "orphaned",
    "report",
    "serve_workers",
    "supervise",
]

#: How long a worker that died while serving waits before it is started again
#: (a worker that dies at once cannot spin the machine).
RESTART_DELAY_S: Final = 1.0
#: How long workers get to stop after SIGTERM (their own grace for open
#: requests, then their servers' close) before they are killed.
STOP_TIMEOUT_S: Final = 15.0
#: How often a worker checks that its supervisor is still there.
ORPHAN_POLL_S: Final = 1.0

logger = logging.getLogger("a2trio.serve")

#: A worker's entry point: its number (1..N) and the pipe it reports on.
Worker = Callable[[int, Connection], None]


class Failed(Exception):
    """A worker could not start: why, as one line for the operator."""


def exit_status(code: int | None) -> str:
    """A dead process's exit code in words: ``exited with status 1``,
    ``killed by SIGKILL``."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


async def orphaned(parent: int) -> None:
    """Return once this process's parent is no longer ``parent`` (it died and
    the process was handed to another), polling every ``ORPHAN_POLL_S``."""
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says a parent died
        await trio.sleep(ORPHAN_POLL_S)


async def _first_readable(*fds: int) -> None:
    """Wait until any of ``fds`` is readable."""
    async with trio.open_nursery() as nursery:

        async def wait(fd: int) -> None:
            await trio.lowlevel.wait_readable(fd)
            nursery.cancel_scope.cancel()

        for fd in fds:
            nursery.start_soon(wait, fd)


class _Supervisor:
    def __init__(self, worker: Worker, count: int, banner: Callable[[list[str]], None]) -> None:
        self.worker = worker
        self.count = count
        self.banner = banner
        self.context = multiprocessing.get_context("spawn")
        self.processes: dict[int, BaseProcess] = {}
        self.waiting = count  # workers not yet listening for the first time
        self.stopping = trio.Event()
        self.failure: str | None = None

    def start(self, index: int) -> tuple[BaseProcess, Connection]:
        reader, writer = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=self.worker, args=(index, writer), name=f"a2trio-worker-{index}"
        )
        # Started ignoring SIGINT, as hypercorn starts its workers: a terminal's
        # Ctrl-C reaches the whole group, and only the supervisor acts on it
        # (the disposition survives exec; a handler would not).
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, handler)
        writer.close()
        self.processes[index] = process
        return process, reader

    async def run_worker(self, index: int, stop: trio.CancelScope) -> None:
        """Start worker ``index``; restart it whenever it dies while serving."""
        first = True
        while not self.stopping.is_set():
            process, reader = self.start(index)
            assert process.pid is not None
            try:
                await _first_readable(reader.fileno(), process.sentinel)
                message: Any = reader.recv() if reader.poll() else None
            except EOFError:
                message = None
            finally:
                reader.close()
            if message is None or message[0] != "ready":
                await trio.lowlevel.wait_readable(process.sentinel)
                process.join()
                if self.stopping.is_set():
                    return
                why = message[1] if message else f"worker {index} {exit_status(process.exitcode)}"
                self.failure = self.failure or why
                stop.cancel()
                return
            if first:
                first = False
                self.waiting -= 1
                if self.waiting == 0:
                    self.banner(message[1])
            else:
                logger.info("worker %d started again (pid %d)", index, process.pid)
            await trio.lowlevel.wait_readable(process.sentinel)
            process.join()
            if self.stopping.is_set():
                return
            logger.error(
                "worker %d (pid %d) %s; starting it again",
                index,
                process.pid,
                exit_status(process.exitcode),
                extra={"a2_worker": index, "a2_exit_code": process.exitcode},
            )
            await trio.sleep(RESTART_DELAY_S)

    def signal_all(self, signum: int) -> None:
        for process in self.processes.values():
            if process.exitcode is None and process.pid is not None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    async def stop_all(self, signals: Any) -> None:
        """SIGTERM every worker; SIGKILL those left after the timeout or on a
        second signal."""
        self.stopping.set()
        self.signal_all(signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT_S):
            async with trio.open_nursery() as nursery:

                async def second_signal() -> None:
                    async for _ in signals:
                        return

                async def all_exited() -> None:
                    for process in list(self.processes.values()):
                        await trio.lowlevel.wait_readable(process.sentinel)
                        # Its pipe closes as it exits: reaped in a moment.
                        process.join()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(second_signal)
                nursery.start_soon(all_exited)
                await trio.sleep_forever()
        for index, process in self.processes.items():
            if process.exitcode is None:
                logger.warning("worker %d (pid %s) did not stop: killed", index, process.pid)
                process.kill()
            process.join()


async def _supervise(
    worker: Worker, count: int, banner: Callable[[list[str]], None], say: Callable[[str], None]
) -> int:
    supervisor = _Supervisor(worker, count, banner)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def until_signalled() -> None:
                async for _ in signals:
                    say(f"shutting down {count} workers")
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(until_signalled)
            for index in range(1, count + 1):
                nursery.start_soon(supervisor.run_worker, index, nursery.cancel_scope)
        await supervisor.stop_all(signals)
    if supervisor.failure is not None:
        raise Failed(supervisor.failure)
    say("stopped")
    return 0


def supervise(
    worker: Worker,
    count: int,
    *,
    banner: Callable[[list[str]], None],
    say: Callable[[str], None] = print,
) -> int:
    """Run ``count`` workers until SIGINT or SIGTERM; the exit status (0).

    Args:
      worker: a module-level function (spawned processes import it by name)
        run in each worker with its number and the pipe it reports on.
      count: how many workers.
      banner: called once every worker listens, with the first one's binds.
      say: where the lifecycle lines go (``shutting down``, ``stopped``).

    Raises:
      Failed: a worker could not start (the reason it sent, or how it ended);
        every other worker was stopped.
    """
    return trio.run(_supervise, worker, count, banner, say)


def report(pipe: Connection, message: Sequence[Any]) -> None:
    """Send the supervisor a worker's report; a supervisor already gone is
    no error (the worker is stopping anyway)."""
    try:
        pipe.send(tuple(message))
    except OSError:
        pass


# -- the command's side ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Options:
    """What a worker of ``--workers N`` is given (pickled into its process)."""

    target: str
    host: str
    port: int
    workers: int
    gc_threshold: int
    body_timeout_s: float
    keep_alive_s: float
    access_log: bool
    log_level: str
    log_format: str


def _worker(options: _Options, index: int, pipe: Connection) -> None:
    """One process of ``--workers N``: a single ``serve`` on the shared port
    that tells its supervisor when it listens (or why it cannot), and stops on
    the supervisor's SIGTERM or when the supervisor is gone."""
    serving.configure_logging(options.log_level, options.log_format, worker=index)
    parent = os.getppid()
    app = serving.load_target(options.target, limits=Limits(body_timeout_s=options.body_timeout_s))
    if options.gc_threshold:
        tune_gc(options.gc_threshold)
    config = serving.hypercorn_config(options.host, options.port, options.keep_alive_s)
    # More than one worker: hypercorn binds with SO_REUSEPORT. Its serve()
    # warns that it runs no workers of its own, which is what is meant here.
    config.workers = options.workers
    warnings.filterwarnings("ignore", "The config `workers` has no affect", Warning)
    run = functools.partial(
        serving.serve_process,
        app,
        config,
        options.access_log,
        started=lambda binds: report(pipe, ("ready", binds)),
        say=logger.info,
        signals=(signal.SIGTERM,),
        until=functools.partial(orphaned, parent),
    )
    try:
        trio.run(run)
    except serving.StartupError as exc:
        report(pipe, ("failed", str(exc)))
        sys.exit(1)
    except BaseExceptionGroup as group:
        leaf = serving.innermost(group)
        if not isinstance(leaf, OSError):
            raise
        report(pipe, ("failed", f"cannot listen on {options.host}:{options.port}: {leaf}"))
        sys.exit(1)


def _unshared(app: App | Any) -> str | None:
    """Why the app's stores cannot serve more than one worker, if they cannot:
    a store that lives in one process gives each worker a store of its own."""
    if not isinstance(app, App):
        return None
    for name, server in app.servers.items():
        store = server.store
        if isinstance(store, MemoryStore) or (
            isinstance(store, SqliteStore) and store.path == ":memory:"
        ):
            return (
                f"'{name}' uses {store!r}, which lives in one process, so each worker "
                "would have its own: use a store the workers share (sqlite:///path, "
                "postgresql://..., redis://...) or one worker"
            )
    return None


def serve_workers(app: App | Any, args: argparse.Namespace) -> int:
    """``--workers N``: hold the port, run the workers, say why they stopped."""
    why = _unshared(app)
    if why is not None:
        print(f"a2trio: --workers {args.workers}: {why}", file=sys.stderr)
        return 1
    config = serving.hypercorn_config(args.host, args.port, args.keep_alive_timeout)
    config.workers = args.workers
    try:
        # hypercorn's own bind (SO_REUSEPORT): resolves --port 0 and holds the
        # port for the workers, which bind it again and listen.
        sockets = config.create_sockets()
    except OSError as exc:
        print(f"a2trio: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        port = sockets.insecure_sockets[0].getsockname()[1]
        options = _Options(
            args.target,
            args.host,
            port,
            args.workers,
            args.gc_threshold,
            args.body_timeout,
            args.keep_alive_timeout,
            args.access_log,
            args.log_level,
            args.log_format,
        )
        worker = functools.partial(_worker, options)
        return supervise(
            worker,
            args.workers,
            banner=serving.banner_printer(app, args.workers),
            say=serving.print_line,
        )
    except Failed as exc:
        print(f"a2trio: {exc}", file=sys.stderr)
        return 1
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
