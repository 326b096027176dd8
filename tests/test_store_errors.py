"""Store failures are classified once per store, and say nothing internal (issue 17).

An outage is ``STORE_UNAVAILABLE`` (503, retryable) whose message names the
operation only; data the store refuses for what it is is ``INVALID_PAYLOAD``
(400), so a client that retries on 503 does not retry it forever. The cause
stays in ``__cause__``.
"""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Awaitable, Callable
from typing import NoReturn

import httpx
import pytest
import trio

import a2trio
from a2trio.errors import store_unavailable
from a2trio.stores.base import AppendEvent
from tests.apps import Note, rooms
from tests.backends import postgres as pg_backend
from tests.test_transport import (
    collect_client_garbage,
    guarded,
    ordered,
    orders,
    push_body,
    pytestmark,
    serving,
)

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_postgres_refusing_the_data_is_invalid_payload_not_an_outage() -> None:
    async with pg_backend.open_store(a2trio.SYSTEM_CLOCK) as store:
        # Below the surface checks: jsonb cannot hold U+0000 (SQLSTATE 22P05).
        with pytest.raises(a2trio.A2Error) as info:
            await store.append("k", [AppendEvent("t", {"text": "a\x00b"})])
        assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
        assert info.value.message == "append failed: the store refused the data"
        assert "22P05" in str(info.value.__cause__)
        assert await store.read("k") == []


@guarded(30)
async def test_an_outage_answers_503_without_hosts_ports_or_driver_text() -> None:
    port = closed_port()
    dsn = f"postgresql://root@127.0.0.1:{port}/nowhere?connect_timeout=1"
    store = a2trio.stores.postgres(dsn)
    server = a2trio.Server(orders, store=store)
    async with serving(a2trio.transport.asgi(server)) as base:
        async with httpx.AsyncClient(base_url=base) as c:
            for response in (
                await c.post("/orders/s1", json=push_body(ordered("x"))),
                await c.get("/orders/s1"),
            ):
                assert response.status_code == 503
                error = response.json()["error"]
                assert error["code"] == "STORE_UNAVAILABLE"
                for leak in (str(port), "127.0.0.1", "nowhere", "root", "connect", "SQL"):
                    assert leak not in error["message"], error
    with pytest.raises(a2trio.A2Error) as info:
        async with a2trio.Server(orders, store=a2trio.stores.postgres(dsn)) as direct:
            await direct.session("s1").history()
    assert info.value.message == "read failed: the store is unavailable"
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("failure", "code", "message"),
    [
        (
            sqlite3.DataError("string or blob too big"),
            "INVALID_PAYLOAD",
            "the store refused the data",
        ),
        (
            sqlite3.OperationalError("disk I/O error"),
            "STORE_UNAVAILABLE",
            "the store is unavailable",
        ),
    ],
)
def test_sqlite_classifies_its_failures_in_one_place(
    failure: Exception, code: str, message: str
) -> None:
    from a2trio.stores.sqlite.conn import errors

    with pytest.raises(a2trio.A2Error) as info, errors("append"):
        raise failure
    assert (info.value.code, info.value.message) == (code, f"sqlite append failed: {message}")
    assert info.value.__cause__ is failure


async def test_a_statement_that_fails_leaves_the_postgres_connection_usable() -> None:
    """A failed pipeline used to forget the statements it prepared while the
    server kept them, so the next use re-prepared them and failed (42P05): one
    bad input made its pooled connection answer 503 for good."""
    async with pg_backend.open_store(a2trio.SYSTEM_CLOCK, max_connections=1) as store:
        presence = store.presence
        assert presence is not None
        with pytest.raises(a2trio.A2Error) as info:
            # Below the surface checks: seen overflows bigint (SQLSTATE 22003).
            await presence.set("k", "ann", {"f": 1}, seen=2**63, at_ms=1, ttl_ms=60_000)
        assert info.value.code == a2trio.ErrorCode.INVALID_PAYLOAD
        for at in (2, 3):
            await presence.set("k", "ann", {"f": at}, seen=1, at_ms=at, ttl_ms=60_000)
        [row] = await presence.read("k")
        assert row.value == 3
        await store.append("k", [AppendEvent("t", {"n": 1})])
        assert len(await store.read("k")) == 1


@guarded(30)
async def test_health_answers_the_round_trip_or_a_bare_503() -> None:
    up = a2trio.Server(orders, store=a2trio.stores.memory())
    async with serving(a2trio.transport.asgi(up)) as base, httpx.AsyncClient(base_url=base) as c:
        healthy = await c.get("/_a2/health")
        assert healthy.status_code == 200
        body = healthy.json()
        assert body["status"] == "ok"
        assert set(body["stores"]) == {"orders"}
        assert body["stores"]["orders"]["roundTripMs"] >= 0
        assert (await c.post("/_a2/health")).status_code == 405
    port = closed_port()
    dsn = f"postgresql://root@127.0.0.1:{port}/nowhere?connect_timeout=1"
    down = a2trio.Server(orders, store=a2trio.stores.postgres(dsn))
    async with serving(a2trio.transport.asgi(down)) as base, httpx.AsyncClient(base_url=base) as c:
        sick = await c.get("/_a2/health")
        assert sick.status_code == 503
        assert sick.json() == {
            "error": {
                "code": "STORE_UNAVAILABLE",
                "message": "the store for 'orders' is unavailable",
            }
        }


# -- exception groups (issue 29) ---------------------------------------------


def _group_in_store_call(*errors: BaseException) -> BaseException:
    """What ``store_unavailable`` makes of a group of ``errors`` raised by a
    driver's (or the store's own) task group inside a store call."""
    try:
        with store_unavailable("list sessions"):
            raise BaseExceptionGroup("a driver's task group", list(errors))
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


def _cancelled() -> BaseException:
    """A real ``trio.Cancelled`` (it has no public constructor)."""
    caught: list[BaseException] = []

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                caught.append(exc)
                raise

    trio.run(main)
    return caught[0]


def test_a_driver_error_beside_a_cancellation_is_one_store_unavailable() -> None:
    # The shape coredis let out of inspect.list_sessions: its pool's tasks
    # cancelled with the caller, the call's ConnectionError beside them.
    driver = ConnectionError("Connection lost!")
    raised = _group_in_store_call(driver, _cancelled())
    assert isinstance(raised, a2trio.A2Error)
    assert raised.code is a2trio.ErrorCode.STORE_UNAVAILABLE
    assert isinstance(raised.__cause__, BaseExceptionGroup)
    assert raised.__cause__.exceptions[0] is driver


def test_a_group_of_driver_errors_is_one_store_unavailable_with_the_group_as_cause() -> None:
    raised = _group_in_store_call(OSError("one"), OSError("two"))
    assert isinstance(raised, a2trio.A2Error)
    assert raised.code is a2trio.ErrorCode.STORE_UNAVAILABLE
    assert isinstance(raised.__cause__, ExceptionGroup)


def test_a_group_of_one_verdict_raises_the_verdict_and_cancellations_pass() -> None:
    verdict = a2trio.A2Error(a2trio.ErrorCode.INDEX_CONFLICT, "moved")
    assert _group_in_store_call(verdict, _cancelled()) is verdict
    only_cancelled = _group_in_store_call(_cancelled(), _cancelled())
    assert isinstance(only_cancelled, BaseExceptionGroup)
    assert not isinstance(only_cancelled, a2trio.A2Error)


# -- the engine passes a store's errors on (issue 31) -------------------------


@pytest.mark.parametrize(
    "error",
    [
        a2trio.A2Error(a2trio.ErrorCode.STORE_UNAVAILABLE, "the store's own words"),
        # A store that breaks its contract: the conformance suite's to catch.
        ConnectionError("a driver's error the store let out"),
    ],
    ids=["translated", "untranslated"],
)
async def test_the_engine_raises_a_stores_error_as_the_store_raised_it(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each store translates its backend's failures at its one error point;
    the engine translates none again: what a caller catches from a session,
    presence or inspection is the store's own error object."""

    async def ship(ctx: a2trio.HandlerContext[Note]) -> None:
        pass

    store = a2trio.stores.memory()

    async def failing(*args: object, **kwargs: object) -> NoReturn:
        await trio.lowlevel.checkpoint()
        raise error

    async def stream_presence() -> None:
        async with plain.session("s").stream(presence=True):
            pass

    handled = a2trio.Server(rooms, store=store, handlers={"note": ship}, sweep=False)
    plain = a2trio.Server(rooms, store=store, run_handlers=False, sweep=False)
    session = plain.session("s")
    note = rooms.event("note", Note("x"))
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "history": session.history,
        "state (the snapshot read, then the log)": lambda: session.state(
            a2trio.Reducer("count", 0, lambda n, e: n + 1)
        ),
        "append": lambda: session.append(note),
        "append, claimed for the drain": lambda: handled.session("s").append(note),
        "presence": session.presence,
        "set_presence": lambda: session.set_presence("ann", {"typing": True}),
        "stream with presence": stream_presence,
        "inspect.list_sessions": plain.inspect.list_sessions,
        "inspect.read_session_page": lambda: plain.inspect.read_session_page("s"),
        "inspect.list_dead_letters": plain.inspect.list_dead_letters,
        "inspect.redrive": lambda: plain.inspect.redrive("s", 1, by="op"),
        "inspect.skip": lambda: plain.inspect.skip("s", 1, by="op", reason="r"),
        "inspect.retry_now": lambda: plain.inspect.retry_now("s", by="op"),
    }
    async with handled, plain:
        for name in ("read", "append", "read_states"):
            monkeypatch.setattr(store, name, failing)
        for name in ("dead_letters", "redrive", "skip", "retry_now"):
            monkeypatch.setattr(store.operator, name, failing)
        for name in ("read", "set"):
            monkeypatch.setattr(store.presence, name, failing)
        for name in ("list_sessions", "read_events", "list_snapshots"):
            monkeypatch.setattr(store.inspect, name, failing)
        for what, call in calls.items():
            with pytest.raises(type(error)) as caught:
                await call()
            assert caught.value is error, what
