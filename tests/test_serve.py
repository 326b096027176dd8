"""``python -m a2trio.serve``: target loading, and the real command on the example app."""

from __future__ import annotations

import datetime
import functools
import gc
import ipaddress
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import httpx
import hypercorn.config
import hypercorn.trio
import hypercorn.typing
import msgspec
import pytest
import trio

import a2trio
from a2trio.serve import AccessLog, guard_hypercorn, lanes, load_target
from a2trio.stores import memory
from a2trio.transport import App, asgi
from a2trio.transport.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[1]


class Note(msgspec.Struct, frozen=True):
    text: str


notes = a2trio.contract("notes", events={"note": Note})
other = a2trio.contract("other", events={"note": Note})


@pytest.fixture
def targets(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = ModuleType("serve_targets")
    module.server = a2trio.Server(notes, store=memory())  # type: ignore[attr-defined]
    module.pair = [module.server, a2trio.Server(other, store=memory())]  # type: ignore[attr-defined]
    module.app = asgi(module.server)  # type: ignore[attr-defined]
    module.number = 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "serve_targets", module)
    return module


def test_load_target_accepts_servers_lists_and_apps(targets: ModuleType) -> None:
    single = load_target("serve_targets")
    assert isinstance(single, App)
    assert list(single.servers) == ["notes"]
    pair = load_target("serve_targets:pair")
    assert isinstance(pair, App)
    assert list(pair.servers) == ["notes", "other"]
    assert load_target("serve_targets:app") is targets.app
    with pytest.raises(ValueError, match=r"^module 'serve_targets' has no attribute 'nope'$"):
        load_target("serve_targets:nope")
    with pytest.raises(ValueError, match=r"expected an a2trio.Server, a list of them"):
        load_target("serve_targets:number")


def test_lanes_name_every_route(targets: ModuleType) -> None:
    app = asgi(targets.server, scheduler_secret="k")
    text = "\n".join(lanes(app, "http://h:1"))
    for route in (
        "POST http://h:1/notes/{session}",
        "GET  http://h:1/notes/{session}",
        "ws://h:1/notes/{session}/ws",
        "ws://h:1/notes/ws",
        "POST http://h:1/_a2/scheduler",
        "GET  http://h:1/_a2/health",
    ):
        assert route in text
    assert "/_a2/inspect" not in text
    assert "GET  http://h:1/_a2/inspect" in "\n".join(
        lanes(asgi(targets.server, inspect=True), "http://h:1")
    )


def test_tune_gc_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        a2trio.tune_gc(5_000)
        assert gc.get_threshold() == (5_000, *before[1:])
        assert gc.get_freeze_count() > 0
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="threshold must be a positive int"):
                a2trio.tune_gc(bad)  # type: ignore[arg-type]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@asynccontextmanager
async def serve_command(cwd: Path, *args: str) -> AsyncIterator[tuple[str, list[str]]]:
    """Run the command; yield its URL and its output lines so far; Ctrl-C it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(ROOT)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "a2trio.serve", "examples.board:server", "--port", "0", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    lines: list[str] = []
    buffer = b""
    try:
        with trio.fail_after(30):
            while not any(line.startswith("Ctrl-C") for line in lines):
                chunk = await process.stdout.receive_some()
                assert chunk, b"".join(line.encode() for line in lines)
                buffer += chunk
                *done, rest = buffer.split(b"\n")
                buffer = rest
                lines += [line.decode() for line in done]
        url = next(line.split()[3] for line in lines if line.startswith("a2trio serving on"))
        yield url, lines
        process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            async for chunk in process.stdout:
                buffer += chunk
            assert await process.wait() == 0
        lines += buffer.decode().splitlines()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def push_and_follow(url: str) -> list[dict[str, Any]]:
    """The documented curl push, then the SSE read, through httpx."""
    task = {"type": "task_added", "payload": {"task_id": "t1", "title": "Ship it"}, "id": "c-1"}
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        pushed = await c.post("/board/team-1", content=json.dumps({"events": [task]}))
        assert pushed.status_code == 200
        frames: list[dict[str, Any]] = []
        decoder = SSEDecoder()
        headers = {"accept": "text/event-stream"}
        async with c.stream("GET", "/board/team-1?startAfter=0", headers=headers) as response:
            async for chunk in response.aiter_raw():
                frames += [json.loads(f.data) for f in decoder.feed(chunk)]
                if frames:
                    break
        return frames


@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
async def test_the_readme_command_serves_the_example_on_sqlite(tmp_path: Path) -> None:
    async with serve_command(tmp_path) as (url, lines):
        assert any("board: SqliteStore(" in line and ".a2/dev.db')" in line for line in lines), (
            lines
        )
        frames = await push_and_follow(url)
        assert [(f["id"], f["type"], f["sessionId"]) for f in frames] == [
            ("c-1", "task_added", "team-1")
        ]
    # (The SSE stream's access line may come as the server closes it.)
    assert lines[-1] == "stopped"
    assert "shutting down" in lines[-3:]
    assert (tmp_path / ".a2" / "dev.db").exists()
    # The happy path shows in the terminal: a line per request, no query string.
    access = [line.split("a2trio.access: ", 1)[1] for line in lines if "a2trio.access: " in line]
    assert [a.rsplit(" ", 2)[0] for a in access] == [
        "POST /board/team-1 200",
        "GET /board/team-1 200 (stream)",
    ]
    # The collector's settings are a detail (DEBUG), not the banner's.
    assert not any("gc thresholds" in line for line in lines)


@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
async def test_store_flag_selects_the_store(tmp_path: Path) -> None:
    flags = ("--store", "memory:", "--gc-threshold", "0", "--log-level", "debug")
    async with serve_command(tmp_path, *flags, "--no-access-log") as (url, lines):
        assert any("board: MemoryStore()" in line for line in lines), lines
        assert len(await push_and_follow(url)) == 1
    assert not (tmp_path / ".a2").exists()
    # Python's own collector settings, untouched.
    assert any(
        line.endswith(f"gc thresholds {gc.get_threshold()}, 0 startup objects frozen")
        for line in lines
    )
    assert not any("a2trio.access" in line for line in lines)


async def test_the_access_log_names_method_path_status_and_duration_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        raise AssertionError("not read")

    scope = {"type": "http", "method": "POST", "path": "/notes/s1", "query_string": b"token=x"}
    with caplog.at_level(logging.INFO, logger="a2trio.access"):
        await AccessLog(app)(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    [record] = caplog.records
    assert record.getMessage().startswith("POST /notes/s1 201 ")
    assert record.getMessage().endswith(" ms")
    assert "token" not in record.getMessage()
    caplog.clear()
    # Disabled: not a record, not a clock read.
    with caplog.at_level(logging.WARNING, logger="a2trio.access"):
        await AccessLog(app)(scope, receive, send)
    assert caplog.records == []


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certfile, keyfile


@asynccontextmanager
async def hypercorn_serving(app: App, tls: tuple[Path, Path] | None = None) -> AsyncIterator[str]:
    """``app`` on hypercorn's trio worker, guarded as ``serve`` guards it: its URL."""
    guard_hypercorn()
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.2
    config.loglevel = "WARNING"
    if tls is not None:
        config.certfile, config.keyfile = (str(path) for path in tls)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            hypercorn.trio.serve,
            cast("hypercorn.typing.ASGIFramework", app),
            config,
            shutdown_trigger=stop.wait,
        )
        binds: list[str] = await nursery.start(serve)
        try:
            yield binds[0]
        finally:
            stop.set()


async def test_a_keep_alive_connection_outlives_pushes_refused_from_their_first_read() -> None:
    # A push body read to its declared length is answered without waiting for
    # hypercorn's last empty message, and a refused one without a yield; the
    # guard's send, which takes a free lock without one, must not then finish
    # the answer before hypercorn has read the request's end (hypercorn would
    # close the connection rather than keep it alive, and the client's next
    # request on it would find it gone).
    server = a2trio.Server(notes, store=memory())
    limits = httpx.Limits(max_connections=1)
    async with (
        hypercorn_serving(asgi(server)) as url,
        httpx.AsyncClient(base_url=url, limits=limits, timeout=5) as c,
    ):
        for _ in range(50):
            refused = await c.post("/notes/s1", content=b"[]")
            assert refused.json()["error"]["code"] == "INVALID_PAYLOAD"
            assert (await c.get("/notes/s1")).json()["events"] == []


@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_streams_and_bodies_larger_than_a_socket_buffer_arrive_whole(
    tls: bool, tmp_path: Path
) -> None:
    # The guard writes a plain socket's bytes by os.write and goes on with
    # send_all only for what the buffer did not take; TLS always by send_all.
    server = a2trio.Server(notes, store=memory())
    text = "x" * 1000
    pair = self_signed(tmp_path) if tls else None
    context = ssl.create_default_context(cafile=pair[0]) if pair is not None else True
    async with (
        hypercorn_serving(asgi(server), pair) as url,
        httpx.AsyncClient(base_url=url, verify=context, timeout=10) as c,
    ):
        assert url.startswith("https://" if tls else "http://")
        events = [{"type": "note", "payload": {"text": text}}] * 100
        for _ in range(5):
            (await c.post("/notes/s1", json={"events": events})).raise_for_status()
        history = (await c.get("/notes/s1")).json()["events"]
        assert [e["index"] for e in history] == list(range(1, 501))
        decoder = SSEDecoder()
        frames: list[dict[str, Any]] = []
        headers = {"accept": "text/event-stream"}
        async with c.stream("GET", "/notes/s1?startAfter=0", headers=headers) as response:
            async for chunk in response.aiter_raw():
                frames += [json.loads(f.data) for f in decoder.feed(chunk) if f.event == "event"]
                if len(frames) == 500:
                    break
        assert [f["index"] for f in frames] == list(range(1, 501))
        assert {f["payload"]["text"] for f in frames} == {text}
