"""``a2trio inspect wake`` and ``cancel`` (issue 34): an operator wakes or
cancels a handler suspended in a durable ``wait_for``, and anything else is
refused ``not_waiting``."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import msgspec
import pytest
import trio

import a2trio
from a2trio.inspect import main

APP = """
import msgspec, a2trio

class Order(msgspec.Struct, frozen=True):
    item: str

orders = a2trio.contract("orders", events={"ordered": Order, "shipped": Order})

async def ship(ctx):
    raise RuntimeError("the CLI never runs handlers")

server = a2trio.Server(orders, handlers={"ordered": ship})
"""


class Order(msgspec.Struct, frozen=True):
    item: str


ORDERS = a2trio.contract("orders", events={"ordered": Order, "shipped": Order})


def _worker(db: Path, runs: list[str], ran: trio.Event | None = None) -> a2trio.Server:
    async def ship(ctx: a2trio.HandlerContext[Order]) -> None:
        runs.append(ctx.session.id)
        if ran is not None:
            ran.set()
        await ctx.wait_for("shipped")

    return a2trio.Server(ORDERS, store=a2trio.stores.sqlite(str(db)), handlers={"ordered": ship})


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    """Sessions w1 and w2 whose handlers are suspended in a wait without a
    timeout, and p1 whose only event needs no handler (a shipment)."""
    name = f"inspect_waits_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "orders.db"
    runs: list[str] = []

    async def write() -> None:
        async with _worker(db, runs) as server:
            for session_id in ("w1", "w2"):
                await server.session(session_id).append(ORDERS.event("ordered", Order("a")))
            await server.session("p1").append(ORDERS.event("shipped", Order("a")))
            await server.settle()

    trio.run(write)
    assert sorted(runs) == ["w1", "w2"]
    return name, f"sqlite:///{db}", db


def test_wake_and_cancel_a_suspended_wait(
    app: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, db = app
    base = ["--app", name, "--store", url]
    assert main([*base, "events", "w1"]) == 0
    assert "waiting" in capsys.readouterr().out
    assert main([*base, "wake", "w1", "1", "--by", "ann", "--reason", "by hand"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["wake", "w1", "1", "ann", "by", "hand"]
    assert main([*base, "wake", "w1", "1"]) == 1
    assert capsys.readouterr().err.strip() == (
        "a2trio.inspect: event 1 of session 'w1' is not held back by a wake time: nothing to wake"
    )
    assert main([*base, "wake", "p1", "1"]) == 1
    assert "is not waiting in a durable sleep or wait_for" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main([*base, "cancel", "w2", "1"])
    assert usage.value.code == 2
    capsys.readouterr()
    assert main([*base, "--json", "cancel", "w2", "1", "--reason", "gave up"]) == 0
    [action] = json.loads(capsys.readouterr().out)
    assert (action["action"], action["sessionId"], action["reason"]) == ("skip", "w2", "gave up")

    runs: list[str] = []

    async def serve() -> None:
        ran = trio.Event()
        async with _worker(db, runs, ran) as server:
            with trio.fail_after(10):
                await ran.wait()
            await server.settle()
            [w1] = await server.store.read(server.key("w1"))
            [w2] = await server.store.read(server.key("w2"))
            assert (w1.attempt_count, w1.processed_at_ms, w1.claim_holder) == (2, None, None)
            assert w2.processed_at_ms is not None, "cancelled: settled"

    trio.run(serve)
    assert runs == ["w1"], "the woken wait reran (and suspended again); the cancelled did not"
