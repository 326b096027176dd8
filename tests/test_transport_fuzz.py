"""Property: no input to any lane produces a 5xx or a write (issue 17).

Hypothesis throws hostile input at every lane of a real hypercorn, once on
SQLite and once on Postgres:

=================== =====================================================================
lane                input classes
=================== =====================================================================
push (POST)         session ids with control characters (U+0000-U+001F, U+007F-U+009F),
                    lone surrogates or more than 1,024 characters; path segments whose
                    percent-escapes are not UTF-8 (``%FF``, ``%C3`` alone) or decode to a
                    control character (``%00``); event ids of the same three kinds
                    (surrogates as JSON ``"\\ud800"``); payload strings and keys holding
                    NUL; payloads nested past ``MAX_DEPTH`` and ~5,000 levels deep (past
                    msgspec's decoder); presence values likewise; pushes whose presence
                    half ``validate_push`` refuses (it fails closed: only ``True``
                    allows); oversized bodies; malformed bodies
history, SSE (GET)  the session and path classes; malformed queries and ``Last-Event-ID``
session socket      the session and path classes at the handshake; push and presence frames
                    of every payload, id and presence class; malformed and oversized frames
multiplexed socket  the same frames tagged with hostile ``sessionId`` s; subscribe frames
                    with many duplicate sessions, hostile ids and indexes, or more distinct
                    sessions than ``max_frame_sessions``; unsubscribe frames
outage              the store wrapped in :class:`a2trio.testing.FaultyStore`, ``append``
                    and ``read`` failing (before or after committing)
=================== =====================================================================

Asserted on every answer: no 5xx (outside injected outages, where a 503 carries
``STORE_UNAVAILABLE`` and a message that names the operation only); every 4xx,
error ack and refused subscription carries the error envelope with a status
that matches its code; nothing escapes the ASGI app and nothing is logged as an
unexpected failure; an input built to be refused is refused; and after every
refused request or frame the store is unchanged, compared as a dump of every
table of its SQLite file or Postgres schema (so a write under a truncated key,
or a presence row of any session, would show).

One server per backend runs in a thread of its own with its own Trio run
(pytest-trio runs each example in a fresh Trio run), on a fresh SQLite file or
Postgres schema, so two runs of this file never share a store. Examples that
may rightly write (a valid push, generic input the oracle cannot rule out)
leave the store changed for the next example, which takes its own baseline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import re
import secrets
import shutil
import sqlite3
import tempfile
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, cast
from urllib.parse import quote, urlencode

import httpx
import msgspec
import psycopg
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg import sql

import a2trio
from a2trio.clock import SYSTEM_CLOCK
from a2trio.contract import MAX_DEPTH
from a2trio.identifiers import MAX_ID_LENGTH
from a2trio.push import MAX_DATE_MS
from a2trio.stores.base import Store
from a2trio.stores.postgres import postgres
from a2trio.stores.sqlite import sqlite
from a2trio.testing import FaultyStore
from a2trio.transport import Limits, asgi, wire
from tests.backends import postgres as pg_backend
from tests.test_transport import chunks_of, collect_client_garbage, pytestmark, serving, ws_url

__all__ = ["collect_client_garbage", "pytestmark"]  # the transport tests' client hygiene

T = TypeVar("T")


def either(*strategies: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """One of ``strategies``, each equally likely (``one_of`` flattens nested
    ``one_of`` s, so a class with many variants would crowd out the rest)."""
    return st.sampled_from(strategies).flatmap(lambda strategy: strategy)


FUZZ = settings(
    max_examples=40,
    deadline=None,
    print_blob=True,  # a failure prints @reproduce_failure(...) to replay it exactly
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMITS = Limits(
    max_body_bytes=32_000,
    max_push_events=4,
    max_frame_bytes=32_000,
    max_frame_sessions=8,
    max_socket_sessions=16,
)
#: Presence outlives the run, so no row expires between an example's two dumps.
PRESENCE_TTL_MS = 10 * 24 * 3600 * 1000
GUARD_S = 30


class Blob(msgspec.Struct, frozen=True):
    data: Any
    label: str = ""


fuzz = a2trio.contract("fuzz", events={"blob": Blob}, presence={"note": Any})

#: What ``validate_push`` answers about a presence half, by participant: only
#: ``True`` allows; the other answers must refuse (it fails closed).
VERDICTS: dict[str, object] = {
    "ann": True,
    "bob": True,
    "mallory": False,
    "nobody": None,
    "zero": 0,
    "blank": "",
    "one": 1,
    "yes": "yes",
    "listed": [True],
}
ALLOWED = frozenset(p for p, verdict in VERDICTS.items() if verdict is True)
REFUSED_PARTICIPANTS = sorted({*VERDICTS} - ALLOWED | {"raiser", "stranger"})


def validate_push(validation: a2trio.PushValidation) -> bool:
    presence = validation.presence
    if presence is None:
        return True
    if presence.participant == "raiser":
        raise a2trio.A2Error(a2trio.ErrorCode.FORBIDDEN, "raiser may not set presence")
    return cast("bool", VERDICTS.get(presence.participant, False))


# -- the store, dumped -------------------------------------------------------------

#: Every table's rows, sorted: equal dumps mean an unchanged store.
Dump = tuple[tuple[str, tuple[str, ...]], ...]


def sqlite_dump(path: Path) -> Dump:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        tables = [
            str(name)
            for (name,) in conn.execute(
                "select name from sqlite_master where type = 'table' order by name"
            )
        ]
        return tuple(
            (table, tuple(sorted(repr(row) for row in conn.execute(f'select * from "{table}"'))))
            for table in tables
        )


def postgres_dump(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Dump:
    tables = [
        str(name)
        for (name,) in conn.execute(
            "select table_name from information_schema.tables"
            " where table_schema = %s order by table_name",
            (schema,),
        ).fetchall()
    ]
    dump: list[tuple[str, tuple[str, ...]]] = []
    for table in tables:
        query = sql.SQL("select to_jsonb(t)::text from {}.{} t").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
        rows = conn.execute(query).fetchall()
        dump.append((table, tuple(sorted(str(row[0]) for row in rows))))
    return tuple(dump)


@asynccontextmanager
async def backend_store(backend: str) -> AsyncIterator[tuple[Store, Callable[[], Dump]]]:
    """A store on a fresh SQLite file or Postgres schema, and its dump."""
    if backend == "sqlite":
        folder = Path(await trio.to_thread.run_sync(tempfile.mkdtemp, None, "a2trio-fuzz-"))
        path = folder / "fuzz.db"
        store: Store = sqlite(str(path), clock=SYSTEM_CLOCK)
        try:
            yield store, functools.partial(sqlite_dump, path)
        finally:
            await store.aclose()
            await trio.to_thread.run_sync(shutil.rmtree, folder)
        return
    dsn = await pg_backend.database_dsn()
    schema = f"fuzz_{secrets.token_hex(6)}"
    store = postgres(dsn, clock=SYSTEM_CLOCK, schema=schema)
    conn = await trio.to_thread.run_sync(functools.partial(psycopg.connect, dsn, autocommit=True))
    try:
        yield store, functools.partial(postgres_dump, conn, schema)
    finally:
        await store.aclose()
        await trio.to_thread.run_sync(conn.close)
        await pg_backend.run_sql(dsn, f'drop schema if exists "{schema}" cascade')


# -- one server per backend, in a thread ----------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Watched:
    """The app, watched: an exception that escapes it (hypercorn would log it
    and answer 500 or drop the socket) is recorded."""

    def __init__(self, app: a2trio.transport.App) -> None:
        self.app = app
        self.escaped: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            self.escaped.append(f"{scope['type']} {scope.get('raw_path')!r}: {exc!r}")
            raise


class Recorder(logging.Handler):
    """Errors a2trio logs: ``report`` logs every failure that is not a verdict."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()} {record.exc_info!r}")


class Rig:
    """A running server: its URL, its store (wrapped for faults) and the dump."""

    def __init__(
        self,
        backend: str,
        base: str,
        faulty: FaultyStore,
        dump: Callable[[], Dump],
        token: trio.lowlevel.TrioToken,
        stop: trio.Event,
        watched: Watched,
        recorder: Recorder,
    ) -> None:
        self.backend = backend
        self.base = base
        self.faulty = faulty
        self.dump = dump
        self.token = token
        self.stop = stop
        self.watched = watched
        self.recorder = recorder

    async def snapshot(self) -> Dump:
        return await trio.to_thread.run_sync(self.dump)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the server's Trio run (the FaultyStore is not thread-safe)."""
        return await trio.to_thread.run_sync(
            functools.partial(trio.from_thread.run_sync, fn, trio_token=self.token)
        )

    def problems(self) -> list[str]:
        return [*self.watched.escaped, *self.recorder.records]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    backend = str(request.param)
    started: queue.Queue[Rig | BaseException] = queue.Queue()
    ended: list[BaseException] = []

    async def serve() -> None:
        async with backend_store(backend) as (store, dump):
            faulty = FaultyStore(store)
            server = a2trio.Server(
                fuzz, store=faulty, validate_push=validate_push, presence_ttl_ms=PRESENCE_TTL_MS
            )
            watched = Watched(asgi(server, limits=LIMITS))
            recorder = Recorder()
            stop = trio.Event()
            async with serving(cast("a2trio.transport.App", watched)) as url:
                await server.session("s1").history()  # creates the schema before any dump
                logging.getLogger("a2trio").addHandler(recorder)
                try:
                    token = trio.lowlevel.current_trio_token()
                    started.put(Rig(backend, url, faulty, dump, token, stop, watched, recorder))
                    await stop.wait()
                finally:
                    logging.getLogger("a2trio").removeHandler(recorder)

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # a skip (Postgres unreachable) or a failure
            if started.empty():
                started.put(exc)
            else:
                ended.append(exc)

    thread = threading.Thread(target=run, name=f"fuzz-{backend}", daemon=True)
    thread.start()
    got = started.get(timeout=60)
    if isinstance(got, BaseException):
        thread.join(timeout=30)
        raise got
    yield got
    trio.from_thread.run_sync(got.stop.set, trio_token=got.token)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the fuzz server did not stop"
    if ended:
        raise ended[0]


# -- checking answers -----------------------------------------------------------------

#: A 503 outside ``internal error`` names the operation and nothing else.
CLEAN_503 = re.compile(
    r"internal error|[a-z][a-z ]{0,40} failed: (the store is unavailable|injected fault)"
)
#: What no error message may show: tracebacks, driver names, exception reprs, SQL.
LEAK = re.compile(
    r"Traceback|psycopg|sqlite3|\w+Error\(|\w+Exception\(|\bat 0x[0-9a-f]{4,}"
    r"|\b(select|insert|update|delete) .* (from|into|set|where)\b",
    re.IGNORECASE,
)
#: Transport refusals answer INVALID_PAYLOAD with their own status.
TRANSPORT_STATUSES = frozenset({404, 405, 408, 413})


def check_error(status: int, error: a2trio.A2Error | None, what: str, *, outage: bool) -> None:
    """An error answer: the envelope, a status matching its code, no internals."""
    assert error is not None, f"{what}: {status} without the error envelope"
    assert not LEAK.search(error.message), f"{what}: the message leaks internals: {error!r}"
    if status >= 500:
        assert outage, f"{what}: {status} outside an outage: {error!r}"
        assert (status, error.code) == (503, a2trio.ErrorCode.STORE_UNAVAILABLE), (what, error)
        assert CLEAN_503.fullmatch(error.message), f"{what}: {error.message!r}"
        return
    assert 400 <= status < 500, (what, status, error)
    if status in TRANSPORT_STATUSES:
        assert error.code is a2trio.ErrorCode.INVALID_PAYLOAD, (what, status, error)
    else:
        assert wire.error_status(error.code) == status, (what, status, error)


def check_response(status: int, body: bytes, what: str, *, outage: bool) -> None:
    check_error(status, wire.error_from_wire(body), f"{what} -> {body[:300]!r}", outage=outage)


def check_wire_error(raw: Any, what: str, *, outage: bool) -> a2trio.A2Error:
    """The error of an ack or an ``unsubscribed`` notice."""
    body = msgspec.convert(raw, wire.WireErrorBody)
    error = wire.error_from_wire(body)
    assert error is not None, f"{what}: unknown error {raw!r}"
    check_error(wire.error_status(error.code), error, what, outage=outage)
    return error


Expect = Literal["ok", "refuse", "any"]


class Outcome(NamedTuple):
    status: int
    changed: bool


async def post(
    rig: Rig, c: httpx.AsyncClient, path: str, body: bytes, what: str, *, outage: bool = False
) -> Outcome:
    """POST and check the answer; the store must be unchanged unless it is a 200."""
    before = await rig.snapshot()
    response = await c.post(path, content=body)
    after = await rig.snapshot()
    if response.status_code != 200:
        check_response(response.status_code, response.content, what, outage=outage)
    return Outcome(response.status_code, after != before)


# -- input classes ---------------------------------------------------------------------

ID_CHARS = st.characters(exclude_categories=("Cs", "Cc"))
CONTROLS = tuple(chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)))

valid_ids = st.one_of(
    st.sampled_from(["s1", "s2", "x" * MAX_ID_LENGTH, "🙂" * 300]),
    st.text(ID_CHARS, min_size=1, max_size=12),
)


def spliced(middle: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda a, b, c: a + b + c,
        st.text(ID_CHARS, max_size=6),
        middle,
        st.text(ID_CHARS, max_size=6),
    )


control_ids = spliced(st.sampled_from(CONTROLS))
surrogate_ids = spliced(st.integers(0xD800, 0xDFFF).map(chr))
long_ids = st.builds(
    lambda unit, n: (unit * n)[:n],
    st.text("ab-é", min_size=1, max_size=3),
    st.integers(MAX_ID_LENGTH + 1, MAX_ID_LENGTH + 64),
)
bad_ids = st.one_of(control_ids, surrogate_ids, long_ids)


def segment_of(value: str) -> str:
    """A path segment for an id: every byte but unreserved ones escaped (dots
    too, so ``..`` stays a session), surrogates as their would-be UTF-8."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="").replace(".", "%2E")


#: Escapes that are not UTF-8 (a lone lead or continuation byte, overlong, a
#: surrogate, past U+10FFFF) or decode to a control character.
BAD_ESCAPES = (
    "%FF %fe %C3 %C3%28 %80 %C0%AF %E2%82 %ED%A0%80 %F4%90%80%80 %F8%88%80%80%80"
    " %00 %1F %7F %C2%85 %C2%9F"
).split()


def short(value: str | bytes | None, keep: int = 100) -> str:
    """A failure report's view of a long input: its head, its length."""
    if value is None or len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}...({len(value)} long)"


class Segment(NamedTuple):
    """A session's path segment; ``session`` is the id it names if it is valid."""

    raw: str
    session: str | None

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints this
        p.text(f"Segment({short(self.raw)}, valid={self.session is not None})")


segments = st.one_of(
    valid_ids.map(lambda s: Segment(segment_of(s), s)),
    bad_ids.map(lambda s: Segment(segment_of(s), None)),
    st.builds(
        lambda a, escape, b: Segment(segment_of(a) + escape + segment_of(b), None),
        st.text(ID_CHARS, max_size=4),
        st.sampled_from(BAD_ESCAPES),
        st.text(ID_CHARS, max_size=4),
    ),
)
valid_segments = valid_ids.map(lambda s: Segment(segment_of(s), s))

clean_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
clean_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(clean_text, children, max_size=3)
    ),
    max_leaves=8,
)
nul_text = st.builds(lambda a, b: a + "\x00" + b, clean_text, clean_text)
nul_leaf = st.one_of(
    nul_text,
    st.builds(lambda key, value: {key: value}, nul_text, clean_json),
)
poisoned = st.recursive(
    nul_leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda value, before, after: [*before, value, *after],
            inner,
            st.lists(clean_json, max_size=2),
            st.lists(clean_json, max_size=2),
        ),
        st.builds(
            lambda value, key, others: {**others, key: value},
            inner,
            clean_text,
            st.dictionaries(clean_text, clean_json, max_size=2),
        ),
    ),
    max_leaves=4,
)


def deep_json(depth: int) -> str:
    """``depth`` nested containers, as text: ``json.dumps`` would recurse."""
    opens = "".join('{"k":' if n % 2 else "[" for n in range(depth))
    closes = "".join("}" if n % 2 else "]" for n in reversed(range(depth)))
    return opens + '"leaf"' + closes


#: Past MAX_DEPTH (decoded, then refused by the contract), and past msgspec's
#: decoder recursion (refused while decoding).
deep_depths = st.one_of(st.integers(MAX_DEPTH + 1, MAX_DEPTH + 64), st.integers(2_000, 6_000))


def dumps(value: Any) -> str:
    """ASCII JSON: a lone surrogate travels as ``"\\ud800"``."""
    return json.dumps(value, ensure_ascii=True)


class Piece(NamedTuple):
    """A JSON fragment (an event, a presence half) and what it is."""

    text: str
    label: str  # "ok", or the input class that must be refused

    @property
    def bad(self) -> bool:
        return self.label != "ok"


def blob(data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "blob", "payload": {"data": data, **extra}}


good_events = st.builds(
    lambda data, label: Piece(dumps(blob(data, **label)), "ok"),
    clean_json,
    st.one_of(st.just({}), clean_text.map(lambda text: {"label": text})),
)
bad_events = st.one_of(
    poisoned.map(lambda data: Piece(dumps(blob(data)), "nul-in-payload")),
    nul_text.map(lambda text: Piece(dumps(blob(1, label=text)), "nul-in-label")),
    deep_depths.map(
        lambda depth: Piece(
            '{"type": "blob", "payload": {"data": ' + deep_json(depth) + "}}", "deep-payload"
        )
    ),
    bad_ids.map(lambda id_: Piece(dumps({**blob(1), "id": id_}), "bad-event-id")),
    st.sampled_from(
        [
            Piece(dumps({"type": "zap"}), "unknown-type"),
            Piece(dumps({"type": "blob", "payload": {"nodata": 1}}), "bad-shape"),
            Piece(dumps({**blob(1), "id": ""}), "empty-event-id"),
        ]
    ),
)
events = either(good_events, good_events, bad_events)

# A `seen` is a log index a client names: at most 2**53 - 1. Larger ones (up to
# past bigint) are refused before anything is written; they once passed
# validation, failed in the store after the push's events were appended, and
# left a Postgres connection answering 503 for good.
seens = st.one_of(st.none(), st.integers(0, 2**53 - 1), st.sampled_from([0, 2**31, 2**53 - 1]))
big_seens = st.one_of(st.integers(2**53, 2**70), st.sampled_from([2**53, 2**63 - 1, 2**63]))
ats = st.one_of(st.none(), st.integers(0, MAX_DATE_MS))


def presence_half(
    participant: str, values: dict[str, Any] | str, seen: Any, at: Any, **extra: Any
) -> str:
    """The presence JSON; ``values`` as text when it holds a deep value."""
    head: dict[str, Any] = {"participant": participant, **extra}
    if seen is not None:
        head["seen"] = seen
    if at is not None:
        head["at"] = at
    values_text = values if isinstance(values, str) else dumps(values)
    return dumps(head)[:-1] + ', "values": ' + values_text + "}"


good_presence = st.builds(
    lambda participant, value, seen, at: Piece(
        presence_half(participant, {"note": value}, seen, at), "ok"
    ),
    st.sampled_from(sorted(ALLOWED)),
    clean_json,
    seens,
    ats,
)
bad_presence = st.one_of(
    st.builds(
        lambda participant, value: Piece(
            presence_half(participant, {"note": value}, None, None), "presence-refused"
        ),
        st.sampled_from(REFUSED_PARTICIPANTS),
        clean_json,
    ),
    bad_ids.map(
        lambda participant: Piece(
            presence_half(participant, {"note": 1}, None, None), "bad-participant"
        )
    ),
    poisoned.map(
        lambda value: Piece(presence_half("ann", {"note": value}, None, None), "nul-in-presence")
    ),
    deep_depths.map(
        lambda depth: Piece(
            presence_half("ann", '{"note": ' + deep_json(depth) + "}", None, None),
            "deep-presence",
        )
    ),
    big_seens.map(
        lambda seen: Piece(presence_half("ann", {"note": 1}, seen, None), "seen-out-of-range")
    ),
    st.sampled_from(
        [
            Piece(presence_half("ann", {"other": 1}, None, None), "unknown-presence-field"),
            Piece(presence_half("ann", {"note": 1}, -1, None), "negative-seen"),
            Piece(presence_half("ann", {"note": 1}, None, MAX_DATE_MS + 1), "at-out-of-range"),
            Piece(presence_half("__proto__", {"note": 1}, None, None), "reserved-participant"),
        ]
    ),
)


class Body(NamedTuple):
    """A push body and what the push lane must answer on a valid session."""

    data: bytes
    expect: Expect
    label: str
    status: int | None = None  # the exact status a refusal must have

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"Body({self.label}, {self.expect}, {self.status}, {short(self.data, 300)})")


@st.composite
def crafted_bodies(draw: st.DrawFn) -> Body:
    pieces = draw(st.lists(events, max_size=LIMITS.max_push_events + 1))
    presence = draw(either(st.none(), good_presence, bad_presence))
    if not pieces and presence is None:
        pieces = [draw(events)]
    parts = ['"events": [' + ", ".join(p.text for p in pieces) + "]"] if pieces else []
    if presence is not None:
        parts.append('"presence": ' + presence.text)
    data = ("{" + ", ".join(parts) + "}").encode()
    labels = [p.label for p in (*pieces, presence) if p is not None and p.bad]
    if len(data) > LIMITS.max_body_bytes:
        return Body(data, "refuse", "oversized", 413)
    if len(pieces) > LIMITS.max_push_events:
        # 413 once the body decodes; a piece it cannot decode answers 400 first.
        return Body(data, "refuse", "+".join(["too-many-events", *labels]), None if labels else 413)
    if labels:
        return Body(data, "refuse", "+".join(labels))
    return Body(data, "ok", "valid")


valid_bodies = st.builds(
    lambda pieces, presence: Body(
        dumps(
            {
                "events": [json.loads(p.text) for p in pieces],
                **({"presence": json.loads(presence.text)} if presence else {}),
            }
        ).encode(),
        "ok",
        "valid",
    ),
    st.lists(good_events, min_size=1, max_size=LIMITS.max_push_events),
    st.none() | good_presence,
)
#: Valid events with a presence half ``validate_push`` refuses: 403, nothing written.
half_refused_bodies = st.builds(
    lambda pieces, participant, value: Body(
        dumps(
            {
                "events": [json.loads(p.text) for p in pieces],
                "presence": {"participant": participant, "values": {"note": value}},
            }
        ).encode(),
        "refuse",
        "presence-half-refused",
        403,
    ),
    st.lists(good_events, min_size=1, max_size=LIMITS.max_push_events),
    st.sampled_from(REFUSED_PARTICIPANTS),
    clean_json,
)
oversized_bodies = st.integers(LIMITS.max_body_bytes + 1, LIMITS.max_body_bytes + 4_000).map(
    lambda n: Body(dumps({"events": [blob("x" * n)]}).encode(), "refuse", "oversized", 413)
)

# The generic campaign: arbitrary JSON in roughly the right shape, and junk.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
event_like = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["blob", "zap", ""]), json_values)},
    optional={
        "payload": st.one_of(json_values, st.fixed_dictionaries({"data": json_values})),
        "id": st.one_of(json_values, st.just("")),
    },
)
presence_like = st.fixed_dictionaries(
    {"participant": st.one_of(st.sampled_from([*VERDICTS, "raiser"]), json_values)},
    optional={"values": json_values, "seen": json_values, "at": json_values},
)
shaped = st.fixed_dictionaries(
    {},
    optional={
        "events": st.one_of(json_values, st.lists(event_like, max_size=5)),
        "presence": st.one_of(json_values, presence_like),
    },
)


def might_write_events(value: Any) -> bool:
    """Not ruled out as a valid list of events (the oracle errs towards yes)."""
    return (
        isinstance(value, list)
        and 0 < len(value) <= LIMITS.max_push_events
        and all(isinstance(e, dict) and e.get("type") == "blob" for e in value)
    )


def might_write_presence(value: Any) -> bool:
    return isinstance(value, dict) and str(value.get("participant")) in ALLOWED


def generic_body(data: bytes) -> Body:
    """A generic body, refused unless the oracle cannot rule a write out."""
    try:
        decoded = json.loads(data)
    except ValueError:
        return Body(data, "refuse", "generic")
    if len(data) > LIMITS.max_body_bytes or not isinstance(decoded, dict):
        return Body(data, "refuse", "generic")
    events_, presence = decoded.get("events"), decoded.get("presence")
    if events_ in (None, []) and presence is None:
        return Body(data, "refuse", "generic")
    if events_ not in (None, []) and not might_write_events(events_):
        return Body(data, "refuse", "generic")
    if presence is not None and not might_write_presence(presence):
        return Body(data, "refuse", "generic")
    return Body(data, "any", "generic")


generic_bodies = st.one_of(
    st.binary(max_size=120),
    json_values.map(msgspec.json.encode),
    shaped.map(msgspec.json.encode),
).map(generic_body)
push_bodies = either(
    crafted_bodies(), valid_bodies, half_refused_bodies, oversized_bodies, generic_bodies
)


# -- the push and read lanes ------------------------------------------------------


@given(segment=either(valid_segments, valid_segments, segments), body=push_bodies)
@FUZZ
async def test_push_lane(rig: Rig, segment: Segment, body: Body) -> None:
    await push_once(rig, segment, body)


async def push_once(rig: Rig, segment: Segment, body: Body) -> None:
    """Push ``body`` to ``segment``; check the answer and the store."""
    expect: Expect = body.expect if segment.session is not None else "refuse"
    with trio.fail_after(GUARD_S):
        async with httpx.AsyncClient(base_url=rig.base) as c:
            outcome = await post(rig, c, f"/fuzz/{segment.raw}", body.data, body.label)
    what = f"{body.label} on {segment.raw[:60]!r}: {outcome}"
    event(f"{body.label.split('+')[0]}, {'valid' if segment.session else 'bad'} session")
    event(f"status {outcome.status}")
    if outcome.status == 200:
        assert expect != "refuse", f"{what}: a push built to be refused was accepted"
    else:
        assert not outcome.changed, f"{what}: refused, but the store changed"
        assert expect != "ok", f"{what}: a valid push was refused"
        if segment.session is not None and body.status is not None:
            assert outcome.status == body.status, what
    assert rig.problems() == []


queries = st.dictionaries(
    st.sampled_from(["startAfter", "gte", "lte", "presence"]),
    st.one_of(
        st.text(max_size=12),
        st.integers(-5, 2**60).map(str),
        st.sampled_from(["1", "true", "0", str(2**53 - 1), str(2**53), "01", " 1", "1e3"]),
    ),
    max_size=3,
)
resume_headers = st.one_of(
    st.none(), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8)
)


@given(
    segment=either(valid_segments, segments),
    query=queries,
    last_event_id=resume_headers,
    lane=st.sampled_from(["history", "stream"]),
)
@FUZZ
async def test_read_lanes(
    rig: Rig, segment: Segment, query: dict[str, str], last_event_id: str | None, lane: str
) -> None:
    headers = {"accept": "text/event-stream"} if lane == "stream" else {}
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    path = f"/fuzz/{segment.raw}"
    what = f"{lane} {path[:60]!r} {query} {last_event_id!r}"
    with trio.fail_after(GUARD_S):
        before = await rig.snapshot()
        async with (
            httpx.AsyncClient(base_url=rig.base) as c,
            c.stream("GET", path, params=query, headers=headers) as r,
        ):
            if r.status_code == 200:
                assert segment.session is not None, f"{what}: a bad session was read"
                if lane == "stream":
                    await expect_stream_opens(r)
            else:
                await r.aread()
                check_response(r.status_code, r.content, what, outage=False)
        assert await rig.snapshot() == before, f"{what}: a read changed the store"
    assert rig.problems() == []


async def expect_stream_opens(response: httpx.Response) -> None:
    """An SSE stream opens with a comment at once; read it, then leave."""
    received = b""
    async with chunks_of(response) as chunks:
        async for chunk in chunks:
            received += chunk
            if b"\n\n" in received:
                break
    assert received.startswith(b": ok"), received[:200]


# -- the socket lanes ----------------------------------------------------------------


class Up(NamedTuple):
    """One client frame and what the socket must do with it."""

    label: str
    message: str | bytes
    req: int | None = None  # the ack it gets (push frames with an integer req)
    refuse: bool = False  # its ack must be an error (or the socket closes)
    may_write: bool = False  # it may rightly change the store
    closes: frozenset[int] = frozenset()  # close codes it may cause
    must_close: bool = False
    refused_subs: frozenset[str] = frozenset()  # subscriptions that must be refused

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(
            f"Up({self.label}, req={self.req}, refuse={self.refuse}, may_write={self.may_write},"
            f" closes={sorted(self.closes)}, must_close={self.must_close},"
            f" refused_subs={[short(s, 40) for s in self.refused_subs]},"
            f" message={short(self.message, 300)})"
        )


NOTHING: Any = object()  # no sessionId in the frame
SAME: Any = object()  # the socket's own session (single-session sockets)
SENTINEL_REQ = 1_000_000


#: A lone surrogate escape: msgspec cannot read the frame at all, not even its
#: ``req``, so the socket closes with 1007 (an unreadable frame).
LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def finish(up: Up) -> Up:
    """Where the frame's size or encoding decides the outcome first."""
    size = len(up.message.encode() if isinstance(up.message, str) else up.message)
    if size > LIMITS.max_frame_bytes:
        return up._replace(closes=frozenset({1009}), must_close=True, label=up.label + "+oversized")
    if isinstance(up.message, str) and LONE_SURROGATE.search(up.message):
        return up._replace(
            closes=up.closes | {1007}, must_close=up.req is None, label=up.label + "+surrogate"
        )
    return up


def tag(frame_head: dict[str, Any], session: Any, bound: str | None) -> dict[str, Any]:
    if session is SAME:
        session = bound
    if session is not NOTHING:
        frame_head["sessionId"] = session
    return frame_head


def targets_badly(session: Any, bound: str | None, valid: bool) -> bool:
    """Whether a push or presence frame's ``sessionId`` must be refused."""
    if bound is None:  # multiplexed: a valid sessionId is required
        return session is NOTHING or not valid
    return session is not NOTHING and session is not SAME and session != bound


@st.composite
def frame_target(draw: st.DrawFn, bound: str | None) -> tuple[Any, bool]:
    """A frame's sessionId (or none), and whether it is a valid id."""
    usual = st.just((SAME, True)) if bound is not None else st.just(("s1", True))
    result: tuple[Any, bool] = draw(
        st.one_of(
            usual,
            usual,
            valid_ids.map(lambda s: (s, True)),
            st.just((NOTHING, False)),
            bad_ids.map(lambda s: (s, False)),
        )
    )
    return result


@st.composite
def push_frames(draw: st.DrawFn, bound: str | None) -> Up:
    req = draw(st.integers(0, 999))
    pieces = draw(
        st.one_of(
            st.lists(events, min_size=1, max_size=LIMITS.max_push_events),
            st.lists(events, max_size=LIMITS.max_push_events + 1),
        )
    )
    session, valid = draw(frame_target(bound))
    head = json.dumps(tag({"kind": "push", "req": req}, session, bound))
    message = head[:-1] + ', "events": [' + ", ".join(p.text for p in pieces) + "]}"
    labels = [p.label for p in pieces if p.bad]
    if not pieces:
        labels.append("no-events")
    if len(pieces) > LIMITS.max_push_events:
        labels.append("too-many-events")
    if targets_badly(session, bound, valid):
        labels.append("bad-target")
    label = "+".join(labels) or "valid-push"
    # A push deeper than msgspec decodes may close the socket (1007: unreadable
    # frame) or be answered by an error ack (its req was read first).
    deep = any(p.label.startswith("deep") for p in pieces)
    closes = frozenset({1007}) if deep else frozenset()
    return finish(Up(label, message, req, bool(labels), not labels, closes))


@st.composite
def presence_frames(draw: st.DrawFn, bound: str | None) -> Up:
    piece = draw(either(good_presence, bad_presence))
    session, valid = draw(frame_target(bound))
    head = json.dumps(tag({"kind": "presence"}, session, bound))
    message = head[:-1] + ", " + piece.text.removeprefix("{")
    bad_target = targets_badly(session, bound, valid)
    label = piece.label + ("+bad-target" if bad_target else "")
    refuse = piece.bad or bad_target
    closes = frozenset({1007}) if piece.label == "deep-presence" else frozenset()
    return finish(Up(f"presence:{label}", message, None, refuse, not refuse, closes))


class Entry(NamedTuple):
    session: str
    valid: bool
    start_after: int


subscribe_indexes = st.one_of(
    st.integers(0, 5), st.sampled_from([-1, -(2**40), 2**53 - 1, 2**53, 2**62])
)


@st.composite
def subscribe_frames(draw: st.DrawFn, bound: str | None) -> Up:
    """Distinct sessions, each named once or many times, shuffled: duplicates
    collapse (the last entry wins), and too many distinct sessions close the socket."""
    distinct = draw(
        st.lists(
            st.one_of(valid_ids.map(lambda s: (s, True)), bad_ids.map(lambda s: (s, False))),
            min_size=1,
            max_size=LIMITS.max_frame_sessions + 2,
            unique_by=lambda pair: pair[0],
        )
    )
    entries: list[Entry] = []
    for session, valid in distinct:
        many = st.integers(50, 400) if len(session) <= 40 else st.integers(1, 3)
        copies = draw(st.one_of(st.integers(1, 3), many))
        indexes = draw(st.lists(subscribe_indexes, min_size=1, max_size=2))
        entries += [Entry(session, valid, indexes[n % len(indexes)]) for n in range(copies)]
    draw(st.randoms(use_true_random=False)).shuffle(entries)
    last = {entry.session: entry for entry in entries}
    message = json.dumps(
        {
            "kind": "subscribe",
            "sessions": [{"id": e.session, "index": e.start_after} for e in entries],
        }
    )
    label = f"subscribe:{len(last)} distinct of {len(entries)}"
    if bound is not None:  # a single-session socket skips subscribe frames
        return finish(Up(label, message))
    if len(last) > LIMITS.max_frame_sessions:
        return finish(Up(label, message, closes=frozenset({1008}), must_close=True))
    refused = frozenset(
        e.session for e in last.values() if not e.valid or not 0 <= e.start_after <= 2**53 - 1
    )
    return finish(Up(label, message, refused_subs=refused))


@st.composite
def unsubscribe_frames(draw: st.DrawFn, bound: str | None) -> Up:
    sessions = draw(st.lists(st.one_of(valid_ids, bad_ids), max_size=6))
    return finish(Up("unsubscribe", json.dumps({"kind": "unsubscribe", "sessions": sessions})))


def generic_frame(message: str | bytes) -> Up:
    """Junk: refused unless the oracle cannot rule a write out; may close 1007."""
    data = message.encode() if isinstance(message, str) else message
    try:
        decoded = json.loads(data)
    except ValueError:
        decoded = None
    req = None
    may_write = False
    if isinstance(decoded, dict):
        if type(decoded.get("req")) is int and decoded.get("kind") == "push":
            req = decoded["req"]
        may_write = (
            decoded.get("kind") == "push" and might_write_events(decoded.get("events"))
        ) or (decoded.get("kind") == "presence" and might_write_presence(decoded))
    return finish(Up("generic", message, req, False, may_write, frozenset({1007})))


generic_frames = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=80),
    st.fixed_dictionaries(
        {"kind": st.one_of(st.sampled_from(["push", "presence", "subscribe", "zz"]), json_values)},
        optional={
            "req": st.one_of(st.integers(-5, 5), json_values),
            "events": st.one_of(json_values, st.lists(event_like, max_size=5)),
            "sessions": st.one_of(json_values, st.lists(json_values, max_size=3)),
            "sessionId": st.one_of(st.just("s1"), json_values),
            "participant": st.one_of(st.sampled_from([*VERDICTS]), json_values),
            "values": json_values,
        },
    ).map(lambda frame: msgspec.json.encode(frame).decode()),
).map(generic_frame)
oversized_frames = st.integers(LIMITS.max_frame_bytes + 1, LIMITS.max_frame_bytes + 2_000).map(
    lambda n: finish(Up("oversized", dumps({"kind": "push", "req": 1, "events": [blob("x" * n)]})))
)
deep_frames = st.integers(2_000, 6_000).map(
    lambda depth: Up(
        "deep-frame",
        '{"kind": "push", "events": ' + deep_json(depth) + "}",
        closes=frozenset({1007}),
        must_close=True,
    )
)


def up_frames(bound: str | None) -> st.SearchStrategy[Up]:
    return either(
        push_frames(bound),
        push_frames(bound),
        push_frames(bound),
        presence_frames(bound),
        presence_frames(bound),
        subscribe_frames(bound),
        subscribe_frames(bound),
        unsubscribe_frames(bound),
        generic_frames,
        oversized_frames,
        deep_frames,
    )


def sentinel(req: int, multiplexed: bool) -> str:
    """A push every socket refuses (unknown type) and answers in order: once
    its ack arrives, every frame sent before it has been handled."""
    frame: dict[str, Any] = {"kind": "push", "req": req, "events": [{"type": "zap"}]}
    if multiplexed:
        frame["sessionId"] = "s1"
    return json.dumps(frame)


class Heard(NamedTuple):
    acks: dict[int, dict[str, Any]]
    refused: Counter[str]
    subscribed: Counter[str]


async def hear_until(ws: trio_websocket.WebSocketConnection, req: int, *, outage: bool) -> Heard:
    """Read down frames until the ack of ``req``, checking each."""
    heard = Heard({}, Counter(), Counter())
    while True:
        frame = json.loads(await ws.get_message())
        kind = frame["kind"]
        assert kind in {
            "event",
            "presence",
            "presence-snapshot",
            "ack",
            "subscribed",
            "unsubscribed",
            "ping",
        }, frame
        if "error" in frame:
            error = check_wire_error(frame["error"], f"{kind} {frame}", outage=outage)
            if outage:
                event(f"{kind}: {error.code}")
        if kind == "ack":
            assert ("events" in frame) != ("error" in frame), frame
            heard.acks[frame["req"]] = frame
            if frame["req"] == req:
                assert frame["error"]["code"] == "UNKNOWN_EVENT_TYPE", frame
                return heard
        elif kind == "unsubscribed" and "reason" in frame:
            assert frame["reason"] in ("refused", "forbidden", "stream failed"), frame
            if frame["reason"] == "stream failed":
                assert outage, frame
            else:
                heard.refused[frame["sessionId"]] += 1
        elif kind == "subscribed":
            heard.subscribed[frame["sessionId"]] += 1


async def exchange(
    rig: Rig,
    ws: trio_websocket.WebSocketConnection,
    ups: list[Up],
    *,
    multiplexed: bool,
    outage: bool = False,
    lossy: bool = False,
) -> None:
    """Send each frame, then a sentinel; check what came back and the store."""
    before = await rig.snapshot()
    subscribes: Counter[str] = Counter()
    subscribed: Counter[str] = Counter()
    for n, up in enumerate(ups):
        req = SENTINEL_REQ + n
        what = f"frame {n} ({up.label})"
        for entry in json_sessions(up):
            subscribes[entry] += 1
        try:
            await ws.send_message(up.message)
            await ws.send_message(sentinel(req, multiplexed))
            heard = await hear_until(ws, req, outage=outage)
        except trio_websocket.ConnectionClosed as closed:
            reason = closed.reason
            assert reason is not None
            allowed = up.closes | ({1011} if outage and not multiplexed else set())
            assert reason.code in allowed, f"{what}: closed {reason}"
            if not up.may_write and not lossy:
                assert await rig.snapshot() == before, f"{what}: closed, but the store changed"
            return
        assert not up.must_close, f"{what}: the socket should have closed ({up.closes})"
        subscribed.update(heard.subscribed)
        ack = heard.acks.get(up.req) if up.req is not None else None
        if up.refuse and up.req is not None:
            assert ack is not None, f"{what}: no ack"
            assert "error" in ack, f"{what}: not refused: {ack}"
        for session in up.refused_subs:
            assert heard.refused[session] == 1, f"{what}: {session[:40]!r} {heard.refused}"
        after = await rig.snapshot()
        wrote = up.may_write and (ack is None or "events" in ack)
        if not wrote and not (outage and lossy):
            assert after == before, f"{what}: refused ({ack}), but the store changed"
        before = after
    for session, count in subscribed.items():
        assert count <= subscribes[session], f"duplicates did not collapse: {session[:40]!r}"


def json_sessions(up: Up) -> set[str]:
    """The distinct sessions a subscribe frame names (generic ones too)."""
    try:
        frame = json.loads(up.message)
    except (ValueError, RecursionError):
        return set()
    if not isinstance(frame, dict) or frame.get("kind") != "subscribe":
        return set()
    entries = frame.get("sessions")
    if not isinstance(entries, list):
        return set()
    return {e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)}


socket_queries = st.fixed_dictionaries(
    {},
    optional={
        "startAfter": st.one_of(
            st.integers(0, 3).map(str), st.sampled_from(["-1", "x", str(2**53), "01"])
        ),
        "presence": st.sampled_from(["1", "true", "0"]),
    },
)


def index_ok(query: dict[str, str]) -> bool:
    raw = query.get("startAfter")
    return raw is None or (raw.isdigit() and raw == str(int(raw)) and int(raw) <= 2**53 - 1)


@st.composite
def session_socket_cases(draw: st.DrawFn) -> tuple[Segment, dict[str, str], list[Up]]:
    segment = draw(either(valid_segments, valid_segments, segments))
    query = draw(socket_queries)
    ups = draw(st.lists(up_frames(segment.session or "s1"), min_size=1, max_size=4))
    return segment, query, ups


@given(case=session_socket_cases())
@FUZZ
async def test_session_socket_lane(
    rig: Rig, case: tuple[Segment, dict[str, str], list[Up]]
) -> None:
    segment, query, ups = case
    for up in ups:
        event(up.label.split("+")[0].split(":")[0])
    url = ws_url(rig.base, f"/fuzz/{segment.raw}/ws") + (f"?{urlencode(query)}" if query else "")
    refuse = segment.session is None or not index_ok(query)
    with trio.fail_after(GUARD_S):
        before = await rig.snapshot()
        try:
            async with trio_websocket.open_websocket_url(url) as ws:
                assert not refuse, f"{url[:120]}: a bad handshake was accepted"
                await exchange(rig, ws, ups, multiplexed=False)
        except trio_websocket.ConnectionRejected as rejected:
            check_response(rejected.status_code, rejected.body or b"", url[:120], outage=False)
            assert refuse, f"{url[:120]}: a valid handshake was refused"
            assert await rig.snapshot() == before
    assert rig.problems() == []


@given(presence=st.booleans(), ups=st.lists(up_frames(None), min_size=1, max_size=5))
@FUZZ
async def test_multiplexed_socket_lane(rig: Rig, presence: bool, ups: list[Up]) -> None:
    url = ws_url(rig.base, "/fuzz/ws" + ("?presence=1" if presence else ""))
    for up in ups:
        event(up.label.split("+")[0].split(":")[0])
    with trio.fail_after(GUARD_S):
        async with trio_websocket.open_websocket_url(url) as ws:
            await exchange(rig, ws, ups, multiplexed=True)
    assert rig.problems() == []


# -- outages ---------------------------------------------------------------------------


class Fault(NamedTuple):
    operation: Literal["append", "read"]
    times: int
    after: bool  # fail after committing: the write stands, its answer is lost


class Call(NamedTuple):
    lane: Literal["push", "history", "stream", "socket", "subscribe"]
    session: str
    body: Body | None = None


outage_calls = st.one_of(
    st.builds(Call, st.just("push"), st.sampled_from(["s1", "s2"]), valid_bodies | push_bodies),
    st.builds(Call, st.sampled_from(["history", "stream", "socket", "subscribe"]), valid_ids),
)


@given(
    faults=st.lists(
        st.builds(Fault, st.sampled_from(["append", "read"]), st.integers(1, 3), st.booleans()),
        min_size=1,
        max_size=2,
    ),
    calls=st.lists(outage_calls, min_size=1, max_size=4),
)
@FUZZ
async def test_outages_answer_store_unavailable(
    rig: Rig, faults: list[Fault], calls: list[Call]
) -> None:
    lossy = any(f.after for f in faults)

    def install() -> None:
        for f in faults:
            rig.faulty.fail(f.operation, times=f.times, after=f.after)

    await rig.call(install)
    try:
        with trio.fail_after(GUARD_S):
            async with httpx.AsyncClient(base_url=rig.base) as c:
                for call in calls:
                    await outage_call(rig, c, call, lossy=lossy)
    finally:
        await rig.call(rig.faulty.clear)
    assert rig.problems() == []


async def outage_call(rig: Rig, c: httpx.AsyncClient, call: Call, *, lossy: bool) -> None:
    path = f"/fuzz/{segment_of(call.session)}"
    what = f"{call.lane} {call.session[:40]!r} in an outage"
    event(call.lane)
    if call.lane == "push":
        assert call.body is not None
        outcome = await post(rig, c, path, call.body.data, what, outage=True)
        event(f"push: status {outcome.status}")
        if outcome.status != 200:
            assert not outcome.changed or (lossy and outcome.status == 503), (what, outcome)
        else:
            assert call.body.expect != "refuse", (what, call.body)
        return
    before = await rig.snapshot()
    if call.lane in ("history", "stream"):
        headers = {"accept": "text/event-stream"} if call.lane == "stream" else {}
        async with c.stream("GET", path, headers=headers) as r:
            if r.status_code == 200:
                if call.lane == "stream":
                    await expect_stream_opens(r)
            else:
                await r.aread()
                check_response(r.status_code, r.content, what, outage=True)
            event(f"{call.lane}: status {r.status_code}")
    else:
        multiplexed = call.lane == "subscribe"
        url = ws_url(rig.base, "/fuzz/ws" if multiplexed else path + "/ws")
        push = Up(
            "valid-push",
            json.dumps(
                tag({"kind": "push", "req": 7, "events": [blob(1)]}, call.session, None)
                if multiplexed
                else {"kind": "push", "req": 7, "events": [blob(1)]}
            ),
            req=7,
            may_write=True,
        )
        subscribe = Up(
            "subscribe:1", json.dumps({"kind": "subscribe", "sessions": [{"id": call.session}]})
        )
        try:
            async with trio_websocket.open_websocket_url(url) as ws:
                await exchange(
                    rig,
                    ws,
                    [subscribe, push] if multiplexed else [push],
                    multiplexed=multiplexed,
                    outage=True,
                    lossy=lossy,
                )
        except trio_websocket.ConnectionRejected as rejected:
            check_response(rejected.status_code, rejected.body or b"", what, outage=True)
        return
    assert await rig.snapshot() == before, f"{what}: a read changed the store"
