"""The Redis store beyond the conformance suite, on a real Redis (never mocked).

Two stores on one key prefix stand for two processes: what one writes, the
other's shared subscriber hears (feeds, presence, pending work), and each
skips its own echoes. Waits for pub/sub deliveries use a later write as the
sentinel (a channel delivers in order), never wall-clock sleeps. The fault
tests kill and restart a redis-server of their own (``throwaway_redis``).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from a2trio.errors import A2Error, ErrorCode
from a2trio.stores import RedisStore, from_url, redis
from a2trio.stores.base import AppendEvent, Claimed, Settled, StoredEvent, StoredPresencePatch
from a2trio.stores.conformance import ManualClock, raises
from a2trio.stores.redis.scripts import FAIL_WRITE
from a2trio.timings import Timings
from tests.backends.redis import (
    REDIS_URL,
    delete_prefix,
    new_prefix,
    reachable,
    throwaway_redis,
)

#: Feeds never re-read on their own during a test: deliveries are wake-ups.
QUIET = Timings(notify_safety_s=600.0)
#: The bound on waits for a delivery: a hang guard. What arrives late on a
#: loaded machine still arrives, and with QUIET timings no re-read hides a
#: lost wake-up inside it.
GUARD_S = 30


def _ev(type: str = "note", payload: Any = None, **kw: Any) -> AppendEvent:
    return AppendEvent(type, payload, **kw)


@asynccontextmanager
async def _prefix() -> AsyncIterator[str]:
    await reachable()
    prefix = new_prefix()
    try:
        yield prefix
    finally:
        await delete_prefix(prefix)


@asynccontextmanager
async def _two_stores(**options: Any) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two entered stores on one prefix: two processes, as Redis sees them."""
    async with _prefix() as prefix:
        a = redis(REDIS_URL, key_prefix=prefix, **options)
        b = redis(REDIS_URL, key_prefix=prefix, **options)
        async with a, b:
            await a.wait_listening()
            await b.wait_listening()
            yield a, b
        await a.aclose()
        await b.aclose()


async def _until(check: Callable[[], bool]) -> None:
    """Wait (checkpointing) until ``check()``: for deliveries that another
    task makes, under a deadline so a lost one fails instead of hanging."""
    with trio.fail_after(GUARD_S):
        while not check():  # noqa: ASYNC110 - set by another task's callback
            await trio.sleep(0.001)


def test_urls_and_arguments() -> None:
    store = from_url("redis://127.0.0.1:6379/0")
    assert isinstance(store, RedisStore)
    assert store.key_prefix == "a2"
    assert repr(store) == "RedisStore(key_prefix='a2')"
    assert isinstance(from_url("rediss://h:6380"), RedisStore)
    with pytest.raises(ValueError, match="must start with redis://"):
        redis("http://h")
    with pytest.raises(ValueError, match="without ':'"):
        redis(REDIS_URL, key_prefix="a:b")
    with pytest.raises(ValueError, match="non-empty"):
        redis(REDIS_URL, key_prefix="")


async def test_operations_outside_async_with_open_their_own_client() -> None:
    """Without ``async with store`` every call opens a client of its own, and
    feeds poll: correct, without push."""
    async with _prefix() as prefix:
        issued = iter(f"id-{n}" for n in range(10))
        store = redis(REDIS_URL, key_prefix=prefix, ids=lambda: next(issued))
        appended = await store.append("s", [_ev(), _ev()])
        assert [e.id for e in appended.events] == ["id-0", "id-1"]
        assert isinstance(await store.claim_available("s", holder="h", ttl_ms=1000), Claimed)
        async with store.stream("s") as feed:
            assert [(await feed.receive()).index for _ in range(2)] == [1, 2]
            writer = redis(REDIS_URL, key_prefix=prefix)
            await writer.append("s", [_ev("later")])
            with trio.fail_after(GUARD_S):
                assert (await feed.receive()).type == "later"
        assert not store.listening
        await store.aclose()
        with raises(ErrorCode.STORE_UNAVAILABLE):
            await store.read("s")
        with pytest.raises(trio.ClosedResourceError):
            await store.__aenter__()


async def test_a_cancelled_call_outside_async_with_lets_no_driver_error_out() -> None:
    """A call on its own client, cancelled at any point, is cancelled (or
    done): the client's connection tasks live in its pool's task group, so a
    cancellation that reached them cut the call's connection, and the driver's
    ``ConnectionError`` came out in an ``ExceptionGroup`` (issue 29)."""
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        await store.append("s", [_ev()])
        calls: list[Callable[[], Any]] = [
            lambda: store.inspect.list_sessions(prefix="", limit=10),
            lambda: store.read("s"),
            lambda: store.append("s", [_ev(id="once")]),
        ]
        for call in calls:
            for step in range(12):
                with trio.move_on_after(step * 2.5e-4):
                    await call()
        await store.aclose()


async def test_feeds_follow_another_store_and_skip_their_own_echoes() -> None:
    async with _two_stores(timings=QUIET) as (a, b):
        await b.append("s", [_ev("zero")])
        async with a.stream("s") as feed:
            # Once the feed's first read is in, the session is marked watched.
            assert (await feed.receive()).type == "zero"
            first = await a.append("s", [_ev("own")])
            assert await feed.receive() == first.events[0]
            await b.append("s", [_ev("theirs")])
            with trio.fail_after(GUARD_S):
                row = await feed.receive()
            assert (row.index, row.type) == (3, "theirs")
            # Completion's returned events wake the other store's feed too.
            claimed = await b.claim_available("s", holder="h", ttl_ms=60_000)
            assert isinstance(claimed, Claimed)
            await b.complete_attempt("s", index=1, attempt=1, events=[_ev("out", id="r1")])
            with trio.fail_after(GUARD_S):
                assert (await feed.receive()).id == "r1"
            # A wake-up may come after the read it caused: wait for all three.
            await _until(lambda: a.subscriber_statistics().notifications == 3)
            stats = a.subscriber_statistics()
            assert stats.own == 1, "the own echo of `first`, skipped"
            assert stats.notifications == 3
            assert stats.connections == 1
            assert stats.channels >= 1
        await _until(lambda: a.subscriber_statistics().channels == 0)
        assert a.feed_statistics().listeners == 0


async def test_unwatched_sessions_publish_nothing() -> None:
    """Writes publish a wake-up only while a feed's marker exists."""
    async with _two_stores(timings=QUIET) as (a, b):
        await b.append("quiet", [_ev()])
        await b.append("loud", [_ev()])
        async with a.stream("loud") as feed:
            await feed.receive()
            await b.append("loud", [_ev()])
            with trio.fail_after(GUARD_S):
                await feed.receive()
        assert a.subscriber_statistics().notifications == 1


async def test_presence_is_pushed_across_stores_once() -> None:
    async with _two_stores() as (a, b):
        got_a: list[StoredPresencePatch] = []
        got_b: list[StoredPresencePatch] = []
        stop_a = a.presence.subscribe("room", got_a.append)
        stop_b = b.presence.subscribe("room", got_b.append)
        await _until(lambda: a.subscriber_statistics().channels == 1)
        await _until(lambda: b.subscriber_statistics().channels == 1)
        mine = await a.presence.set(
            "room", "ann", {"cursor": [1, 2]}, seen=1, at_ms=10, ttl_ms=60_000
        )
        assert got_a == [mine], "delivered locally as the write returns"
        # b's subscriber and b's own write are two connections: let it hear
        # `mine` first, so the order below is the writes' order.
        await _until(lambda: len(got_b) == 1)
        theirs = await b.presence.set("room", "bob", {"x": None}, seen=2, at_ms=20, ttl_ms=60_000)
        await _until(lambda: len(got_a) == 2)
        await _until(lambda: len(got_b) == 2)
        assert got_a == [mine, theirs], "own echo skipped"
        assert got_b == [mine, theirs]
        # A message this version does not write is ignored.
        async with b._conn.new_client() as raw:
            await raw.publish(b._keys.channel("room", "presence"), "not json")
        stop_a()
        stop_a()
        stop_b()
        await _until(lambda: a.subscriber_statistics().channels == 0)
        assert a.feed_statistics().listeners == 0


async def test_watch_pending_hears_other_stores_unsettled_appends() -> None:
    async with _two_stores() as (a, b):
        heard: list[str] = []
        stop = a.pending.watch_pending(heard.append)
        await _until(lambda: a.subscriber_statistics().channels == 1)
        # The marker is set by a task of its own; wait until writes see it.
        async with a._conn.new_client() as raw:
            await _until_async(lambda: raw.exists([a._keys.global_key("pending:watched")]))
        await a.append("mine", [_ev()])
        await b.append("settled-only", [_ev(settled=True)])
        await b.append("theirs", [_ev()])
        await _until(lambda: bool(heard))
        assert heard == ["theirs"]
        stop()
        stop()
        await _until(lambda: a.subscriber_statistics().channels == 0)


async def _until_async(check: Callable[[], Any]) -> None:
    with trio.fail_after(GUARD_S):
        while not await check():  # noqa: ASYNC110 - state held by Redis
            await trio.sleep(0.005)


async def test_concurrent_calls_share_pipelines_each_with_its_own_verdict() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            await store.append("s0", [_ev()])
            before = store.pipeline_statistics()
            refused: list[A2Error] = []

            async def one(n: int) -> None:
                if n % 10 == 0:
                    with pytest.raises(A2Error) as caught:
                        await store.append("s0", [_ev()], expected_index=0)
                    refused.append(caught.value)
                else:
                    await store.append(f"s{n}", [_ev(id=f"e{n}")])

            async with trio.open_nursery() as nursery:
                for n in range(1, 41):
                    nursery.start_soon(one, n)
            after = store.pipeline_statistics()
            assert after.members - before.members == 40
            assert after.groups - before.groups < 40
            assert after.largest > 1
            assert [e.code for e in refused] == [ErrorCode.INDEX_CONFLICT] * 4
            assert [e.index for e in await store.read("s0")] == [1]
            for n in range(1, 41):
                if n % 10:
                    assert [e.id for e in await store.read(f"s{n}")] == [f"e{n}"]
        await store.aclose()


async def test_a_script_error_in_a_batch_fails_only_its_own_call() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            async with store._conn.new_client() as raw:
                # The session's head is a string: HGET on it raises WRONGTYPE.
                await raw.set(f"{prefix}:bad:head", "x")
            failed: list[A2Error] = []

            async def bad() -> None:
                with pytest.raises(A2Error) as caught:
                    await store.append("bad", [_ev()])
                failed.append(caught.value)

            async with trio.open_nursery() as nursery:
                for n in range(30):
                    nursery.start_soon(store.append, f"s{n}", [_ev(id=f"e{n}")])
                    if n % 10 == 5:
                        nursery.start_soon(bad)
            assert store.pipeline_statistics().largest > 1
            assert [e.code for e in failed] == [ErrorCode.STORE_UNAVAILABLE] * 3
            for n in range(30):
                assert [e.id for e in await store.read(f"s{n}")] == [f"e{n}"]
        await store.aclose()


async def test_cancelled_batched_calls_run_whole_or_not_at_all() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            for delay in (0, 1, 2, 5):
                async with trio.open_nursery() as nursery:
                    for n in range(20):
                        nursery.start_soon(store.append, f"s{n}", [_ev(id=f"e{delay}-{n}")])
                    for _ in range(delay):
                        await trio.lowlevel.checkpoint()
                    nursery.cancel_scope.cancel()
            for n in range(20):
                rows = await store.read(f"s{n}")
                # Each cancelled call ran whole (once) or never started.
                assert len({e.id for e in rows}) == len(rows) <= 4
            # No caller was left waiting for a batch: the store still answers.
            with trio.fail_after(GUARD_S):
                await store.append("after", [_ev()])
        await store.aclose()


async def test_a_pipeline_on_a_fresh_server_loads_its_scripts() -> None:
    """A server that has none of the scripts (new, or restarted) answers a
    whole pipeline NOSCRIPT: each call loads its script and runs again."""
    async with throwaway_redis() as server:
        store = redis(server.url, key_prefix=new_prefix())
        async with store:
            async with trio.open_nursery() as nursery:
                for n in range(20):
                    nursery.start_soon(store.append, f"s{n}", [_ev(id=f"e{n}")])
            assert store.pipeline_statistics().largest > 1
            for n in range(20):
                assert [e.id for e in await store.read(f"s{n}")] == [f"e{n}"]
        await store.aclose()


async def test_aclose_severs_feeds_with_store_unavailable() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix, timings=QUIET)
        async with store:
            await store.append("s", [_ev()])
            async with store.stream("s") as feed:
                assert (await feed.receive()).index == 1
                await store.aclose()
                with trio.fail_after(GUARD_S), raises(ErrorCode.STORE_UNAVAILABLE):
                    await feed.receive()
            with raises(ErrorCode.STORE_UNAVAILABLE):
                await store.append("s", [_ev()])
        await store.aclose()


async def test_nested_entries_share_one_client() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            client = store._conn.client
            async with store:
                assert store._conn.client is client
            assert store._conn.client is client
            await store.append("s", [_ev()])
        assert store._conn.client is None
        await store.aclose()


async def test_a_failure_retries_when_its_row_moves() -> None:
    """The failure verdict is written by compare-and-set: a row changed
    between the read and the write is read again."""
    async with _prefix() as prefix:
        clock = ManualClock()
        store = redis(REDIS_URL, key_prefix=prefix, clock=clock)
        async with store:
            await store.append("s", [_ev()])
            await store.claim_available("s", holder="h", ttl_ms=60_000)
            real = store._conn.run
            moves = {"left": 1, "attempt": 1}

            async def racing(source: str, keys: Any, args: Any) -> Any:
                if source == FAIL_WRITE and moves["left"]:
                    moves["left"] -= 1
                    clock.advance(1)
                    renewed = await store.renew_claims(
                        "s", holder="h", claims=[_ref(1, moves["attempt"])], ttl_ms=60_000
                    )
                    assert renewed.renewed == [1]
                return await real(source, keys, args)

            store._conn.run = racing  # type: ignore[method-assign]
            failed = await store.fail_attempt("s", index=1, attempt=1, error="e", max_failures=3)
            assert (failed.outcome, failed.failure_count) == ("failed", 1)
            assert moves["left"] == 0
            moves["left"], moves["attempt"] = 10_000, 2
            await store.claim_available("s", holder="h", ttl_ms=60_000)
            with raises(ErrorCode.STORE_UNAVAILABLE):
                await store.fail_attempt("s", index=1, attempt=2, error="e", max_failures=3)
        await store.aclose()


def _ref(index: int, attempt: int) -> Any:
    from a2trio.stores.base import ClaimRef

    return ClaimRef(index, attempt)


async def test_inspection_edges() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            await store.append("p/a", [_ev(), _ev()])
            page = await store.inspect.read_events("p/a", after_index=0, limit=0)
            assert (page.events, page.through_index) == ([], 2)
            low = await store.inspect.read_events("p/a", after_index=0, limit=5, through_index=-1)
            assert (low.events, low.through_index) == ([], 0)
            before = await store.inspect.list_sessions(prefix="p/", limit=5, cursor="a")
            assert [s.session_id for s in before.sessions] == ["p/a"]
            assert (await store.inspect.list_sessions(prefix="q/", limit=5)).sessions == []
            assert await store.read("p/a", through_index=-3) == []
        await store.aclose()


async def test_dispatch_ignores_a_released_channel() -> None:
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        store._subscriber.dispatch(b"gone", b"x")
        assert store.subscriber_statistics().notifications == 0


# -- faults -------------------------------------------------------------------


# coredis 6.9 makes a connection's memory streams in its constructor and
# closes them once it has connected; the store closes them when connecting
# fails too, but a connection cancelled before it started (a store closing
# during an outage) still leaves them to the collector, with a
# ResourceWarning. Harmless; the fault tests collect them before they end,
# under these filters.
_UNSTARTED_CONNECTIONS = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@_UNSTARTED_CONNECTIONS[0]
@_UNSTARTED_CONNECTIONS[1]
async def test_a_redis_restart_is_store_unavailable_then_feeds_catch_up() -> None:
    """SIGKILL Redis mid-run (AOF always: nothing acknowledged is lost):
    callers get STORE_UNAVAILABLE, the subscriber reconnects by itself, and
    parked feeds catch up from their cursors, nothing lost or duplicated;
    presence subscribers get a repaint."""
    async with throwaway_redis() as server:
        prefix = new_prefix()
        a = redis(server.url, key_prefix=prefix, timings=QUIET, connect_timeout_s=0.5)
        b = redis(server.url, key_prefix=prefix, timings=QUIET, connect_timeout_s=0.5)
        painted: list[StoredPresencePatch] = []
        async with a, b, a.stream("s") as feed:
            stop = a.presence.subscribe("room", painted.append)
            await a.wait_listening()
            await b.presence.set("room", "bob", {"f": 1}, seen=1, at_ms=1, ttl_ms=600_000)
            await _until(lambda: len(painted) == 1)
            await b.append("s", [_ev(id="before")])
            with trio.fail_after(GUARD_S):
                assert (await feed.receive()).id == "before"

            await server.kill()
            with raises(ErrorCode.STORE_UNAVAILABLE):
                await b.append("s", [_ev(id="during")])
            await _until(lambda: not a.listening)
            await server.start()

            await a.wait_listening()
            assert a.subscriber_statistics().connections == 2
            await _until(lambda: len(painted) == 2)
            assert painted[1] == StoredPresencePatch("bob", {"f": 1}, 1, 1), "a repaint"
            # b's command connection is gone too: its next call reconnects.
            await _retrying(lambda: b.append("s", [_ev(id="during")]))
            await b.append("s", [_ev(id="after")])
            got: list[StoredEvent] = []
            with trio.fail_after(GUARD_S):
                while len(got) < 2:
                    got.append(await feed.receive())
            assert [(e.index, e.id) for e in got] == [(2, "during"), (3, "after")]
            assert [e.id for e in await a.read("s")] == ["before", "during", "after"]
            stop()
        await a.aclose()
        await b.aclose()
    gc.collect()  # unstarted connections, while their warnings are ignored


async def _retrying(call: Callable[[], Any]) -> Any:
    with trio.fail_after(GUARD_S):
        while True:
            try:
                return await call()
            except A2Error as exc:
                if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                    raise
                await trio.sleep(0.05)


@_UNSTARTED_CONNECTIONS[0]
@_UNSTARTED_CONNECTIONS[1]
async def test_a_down_redis_is_store_unavailable_with_the_cause() -> None:
    async with throwaway_redis() as server:
        await server.kill()
        store = redis(server.url, key_prefix=new_prefix(), connect_timeout_s=0.5)
        for call in (
            lambda: store.append("s", [_ev()]),
            lambda: store.read("s"),
            lambda: store.presence.read("s"),
        ):
            with pytest.raises(A2Error) as caught:
                await call()
            assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
            assert caught.value.__cause__ is not None
            assert "127.0.0.1" not in caught.value.message
        async with store:
            # The subscriber keeps trying; nothing fails while nobody asks.
            unwatch = store.pending.watch_pending(lambda key: None)
            await trio.sleep(0.1)
            assert not store.listening
            unwatch()
        await store.aclose()
    gc.collect()  # unstarted connections, while their warnings are ignored


async def _clients(url: str) -> int:
    """How many clients the server has connected (CLIENT LIST)."""
    import coredis

    async with coredis.Redis.from_url(url) as admin:
        listing = await admin.client_list()
    return len(listing) - 1  # less the one asking


@_UNSTARTED_CONNECTIONS[0]
@_UNSTARTED_CONNECTIONS[1]
async def test_aclose_closes_both_connections() -> None:
    """A store holds its subscriber and its command connections (coredis
    multiplexes; it opens another only for calls that send at the same
    instant), not one per feed; ``aclose()`` closes them all."""
    async with throwaway_redis() as server:
        store = redis(server.url, key_prefix=new_prefix(), timings=QUIET)
        async with store:
            await store.wait_listening()
            async with store.stream("a") as first, store.stream("b") as second:
                await store.append("a", [_ev()])
                await store.append("b", [_ev()])
                with trio.fail_after(GUARD_S):
                    await first.receive()
                    await second.receive()
                assert 2 <= await _clients(server.url) <= 4
                await store.aclose()
                with trio.fail_after(GUARD_S):
                    while await _clients(server.url) != 0:  # noqa: ASYNC110 - Redis' view
                        await trio.sleep(0.01)
    gc.collect()  # unstarted connections, while their warnings are ignored


# httpx's streaming response, as in test_serve.py.
@pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)\..*:ResourceWarning")
async def test_serve_store_flag_takes_a_redis_url(tmp_path: Any) -> None:
    """``python -m a2trio.serve --store redis://...``: the documented push and
    SSE read, end to end on Redis (a server of the test's own: the URL's
    default key prefix ``a2`` is the server's alone)."""
    from tests.test_serve import push_and_follow, serve_command

    async with (
        throwaway_redis() as server,
        serve_command(tmp_path, "--store", server.url) as (url, lines),
    ):
        assert any("board: RedisStore(key_prefix='a2')" in line for line in lines), lines
        assert len(await push_and_follow(url)) == 1


async def test_a_claim_limited_to_nothing_claims_nothing() -> None:
    """``limit=0`` as on the memory store: nothing claimed, the session's
    state reported."""
    async with _prefix() as prefix:
        store = redis(REDIS_URL, key_prefix=prefix)
        async with store:
            await store.append("s", [_ev(), _ev()])
            assert isinstance(
                await store.claim_available("s", holder="h", ttl_ms=1000, limit=0), Settled
            )
            claimed = await store.claim_available("s", holder="h", ttl_ms=1000, limit=1)
            assert isinstance(claimed, Claimed)
            assert [e.index for e in claimed.events] == [1]
        await store.aclose()
