""":data:`~a2trio.stores.conformance.UNREACHABLE_CHECKS`: a backend that cannot
be reached fails every call with ``A2Error(STORE_UNAVAILABLE)``, its cause
attached, translated inside the store at one point (the engine translates
none again, so a store that lets a driver error out, or wraps its own
``A2Error`` again, fails here)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio
import trio.testing

from ...errors import A2Error, ErrorCode
from ..base import (
    ClaimRef,
    ClaimRequest,
    Inspection,
    Journal,
    OperatorActions,
    PresenceStore,
    Retention,
    Store,
    SweepsClaimable,
    WatchesPending,
)
from .kit import CANCEL_DELAYS_S, FEED_DEADLINE_S, ManualClock, StoreFactory, ev, new_sid, new_uid

__all__ = [
    "UNREACHABLE_DEADLINE_S",
    "check_every_call_fails_unavailable_when_unreachable",
    "check_every_protocol_method_fails_unavailable_translated_once",
]


#: How long one call to an unreachable backend may take to fail (a refused
#: connection fails at once; this covers a loaded machine).
UNREACHABLE_DEADLINE_S = 20.0


@contextmanager
def _unavailable(what: str, *, once: bool = False) -> Iterator[None]:
    """Assert that the block raises ``A2Error(STORE_UNAVAILABLE)`` with the
    driver's failure as ``__cause__``: never the bare driver error, nor an
    exception group holding it. With ``once``, also that it was translated
    once (see :func:`_translated_once`)."""
    try:
        with trio.fail_after(UNREACHABLE_DEADLINE_S):
            yield
    except A2Error as exc:
        if exc.code is not ErrorCode.STORE_UNAVAILABLE:
            raise AssertionError(f"{what}: expected STORE_UNAVAILABLE, got {exc!r}") from exc
        if exc.__cause__ is None:
            raise AssertionError(f"{what}: STORE_UNAVAILABLE without its cause") from exc
        if once:
            _translated_once(what, exc)
    except trio.TooSlowError:
        raise AssertionError(f"{what}: still waiting after {UNREACHABLE_DEADLINE_S} s") from None
    except Exception as exc:
        raise AssertionError(f"{what}: raised {exc!r}, not A2Error(STORE_UNAVAILABLE)") from exc
    else:
        raise AssertionError(f"{what}: worked against an unreachable backend")


async def check_every_call_fails_unavailable_when_unreachable(
    open_unreachable_store: StoreFactory,
) -> None:
    """Every public call on a store whose backend cannot be reached (the
    factory's stores point where nothing answers) raises
    ``A2Error(STORE_UNAVAILABLE)`` with the cause, cancelled or not: outside
    ``async with store`` (each call on a connection of its own), then inside,
    where the store's own tasks fail too and none of their failures escapes,
    the block's exit and ``aclose`` included.

    The factory is not the one of :data:`CHECKS`: it yields a store it has
    not entered (see :data:`UNREACHABLE_CHECKS`).
    """
    async with open_unreachable_store(ManualClock()) as store:
        await _every_call_unavailable(store)
        async with store:
            await _every_call_unavailable(store)
            # Let the store's own tasks (listeners, subscribers) meet the outage.
            await trio.testing.wait_all_tasks_blocked()
        await store.aclose()


async def check_every_protocol_method_fails_unavailable_translated_once(
    open_unreachable_store: StoreFactory,
) -> None:
    """Every async method of the :class:`~a2trio.stores.base.Store` protocol
    and of each capability the store has (:class:`PresenceStore`,
    :class:`Inspection`, :class:`SweepsClaimable`, :class:`WatchesPending`,
    :class:`OperatorActions`, :class:`Retention`, :class:`Journal`),
    as ``base.py`` declares them (read from the protocols, not listed here),
    raises ``A2Error(STORE_UNAVAILABLE)`` against an unreachable backend,
    translated once, inside the store: no other ``A2Error`` below it in the
    ``__cause__`` chain, and a message that does not repeat the backend's
    failure (hosts, paths and driver text stay in ``__cause__``). What the
    engine relies on when it passes a store's errors on untouched.

    ``aclose`` and the context manager are the lifecycle, which
    :func:`check_every_call_fails_unavailable_when_unreachable` covers with
    ``stream``. A method a protocol gains without a call here fails this
    check by name, on every backend.
    """
    async with open_unreachable_store(ManualClock()) as store:
        calls = dict(_every_call(store))
        for protocol, prefix in _surfaces(store):
            for name in _async_methods(protocol):
                call = calls.get(prefix + name)
                if call is None:
                    raise AssertionError(
                        f"{protocol.__name__}.{name} has no call in the conformance suite "
                        "(a2trio/stores/conformance/failures.py, _every_call): add one"
                    )
                with _unavailable(prefix + name, once=True):
                    await call()


def _surfaces(store: Store) -> list[tuple[type, str]]:
    """The protocols ``store`` implements (the store's, and each capability
    it has), each with the prefix its calls are named with in
    :func:`_every_call`: the capability's attribute."""
    surfaces: list[tuple[type, str]] = [(Store, "")]
    if store.presence is not None:
        surfaces.append((PresenceStore, "presence."))
    if store.inspect is not None:
        surfaces.append((Inspection, "inspect."))
    if store.sweep is not None:
        surfaces.append((SweepsClaimable, "sweep."))
    if store.pending is not None:
        surfaces.append((WatchesPending, "pending."))
    if store.operator is not None:
        surfaces.append((OperatorActions, "operator."))
    if store.retention is not None:
        surfaces.append((Retention, "retention."))
    if store.journal is not None:
        surfaces.append((Journal, "journal."))
    return surfaces


def _async_methods(protocol: type) -> list[str]:
    """The public async methods ``protocol`` declares, the lifecycle aside."""
    return sorted(
        name
        for name, value in vars(protocol).items()
        if inspect.iscoroutinefunction(value) and not name.startswith("_") and name != "aclose"
    )


def _translated_once(what: str, error: A2Error) -> None:
    """No ``A2Error`` under ``error``, and its message without the failure's text."""
    below = error.__cause__
    while below is not None:
        if isinstance(below, A2Error):
            raise AssertionError(f"{what}: translated twice: {error!r} over {below!r}") from error
        below = below.__cause__
    failure = str(error.__cause__)
    if failure and failure in error.message:
        raise AssertionError(
            f"{what}: the message {error.message!r} repeats the backend's failure: "
            "it belongs in __cause__ only"
        ) from error


async def _every_call_unavailable(store: Store) -> None:
    """Each public call: plainly (``STORE_UNAVAILABLE``), then cancelled at
    a few points (cancelled, or ``STORE_UNAVAILABLE``)."""
    for what, call in _every_call(store):
        with _unavailable(what):
            await call()
        for delay in CANCEL_DELAYS_S[:6]:
            with _unavailable_or_waiting(f"{what}, cancelled after {delay} s"):
                with trio.move_on_after(delay):
                    await call()
    # A feed may ride out an outage (it retries its reads), but whatever it
    # raises, at its first read or when left, is STORE_UNAVAILABLE.
    with _unavailable_or_waiting("stream"):
        async with store.stream(new_sid("unreachable")) as feed:
            with trio.move_on_after(FEED_DEADLINE_S / 5):
                await feed.receive()


def _every_call(store: Store) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    """The store's public calls (its optional capabilities' included), each
    on a new session, named by method (a capability's attribute, such as
    ``presence.``, before its methods): the protocol check looks them up so."""
    sid = new_sid("unreachable")
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("append", lambda: store.append(sid, [ev()])),
        ("append with a claim", lambda: store.append(sid, [ev()], claim=ClaimRequest("h", 1))),
        ("find_event", lambda: store.find_event(sid, "e")),
        ("read", lambda: store.read(sid)),
        ("claim_available", lambda: store.claim_available(sid, holder="h", ttl_ms=1_000)),
        (
            "renew_claims",
            lambda: store.renew_claims(sid, holder="h", claims=[ClaimRef(1, 1)], ttl_ms=1_000),
        ),
        (
            "complete_attempt",
            lambda: store.complete_attempt(sid, index=1, attempt=1, events=[ev(id=new_uid("r"))]),
        ),
        (
            "fail_attempt",
            lambda: store.fail_attempt(sid, index=1, attempt=1, error="e", max_failures=3),
        ),
        (
            "release_attempt",
            lambda: store.release_attempt(sid, index=1, attempt=1, delay_ms=1_000),
        ),
        ("read_state", lambda: store.read_state(sid, "r")),
        ("read_states", lambda: store.read_states([sid, new_sid("unreachable")], "r")),
        ("put_snapshot", lambda: store.put_snapshot(sid, "r", 1, {"n": 1})),
    ]
    sweep = store.sweep
    if sweep is not None:
        calls.append(("sweep.claimable_sessions", lambda: sweep.claimable_sessions("c", limit=10)))
    operator = store.operator
    if operator is not None:
        calls += [
            ("operator.dead_letters", lambda: operator.dead_letters("c", limit=10)),
            ("operator.redrive", lambda: operator.redrive(sid, 1, by="op", reason="r")),
            ("operator.skip", lambda: operator.skip(sid, 1, by="op", reason="r")),
            ("operator.retry_now", lambda: operator.retry_now(sid, by="op", reason="r")),
            ("operator.wake", lambda: operator.wake(sid, 1, by="op", reason="r")),
            (
                "operator.read_actions",
                lambda: operator.read_actions(sid, after_index=0, through_index=9),
            ),
        ]
    journal = store.journal
    if journal is not None:
        calls += [
            ("journal.read_journal", lambda: journal.read_journal(sid, 1)),
            (
                "journal.write_step",
                lambda: journal.write_step(sid, index=1, attempt=1, name="s", result=b"1"),
            ),
        ]
    retention = store.retention
    if retention is not None:
        calls += [
            ("retention.export", lambda: retention.export(sid)),
            ("retention.erase", lambda: retention.erase(sid, expected_index=3)),
            ("retention.trim", lambda: retention.trim(sid, "r")),
        ]
    presence = store.presence
    if presence is not None:
        calls += [
            (
                "presence.set",
                lambda: presence.set(sid, "p", {"f": 1}, seen=1, at_ms=1, ttl_ms=1_000),
            ),
            ("presence.read", lambda: presence.read(sid)),
        ]
    inspection = store.inspect
    if inspection is not None:
        calls += [
            ("inspect.list_sessions", lambda: inspection.list_sessions(prefix="c", limit=10)),
            (
                "inspect.read_events",
                lambda: inspection.read_events(sid, after_index=0, limit=10),
            ),
            ("inspect.list_snapshots", lambda: inspection.list_snapshots(sid)),
            ("inspect.read_failures", lambda: inspection.read_failures(sid, [1])),
        ]
    return calls


@contextmanager
def _unavailable_or_waiting(what: str) -> Iterator[None]:
    """Like :func:`_unavailable`, but a block that ends without raising passes."""
    try:
        with trio.fail_after(UNREACHABLE_DEADLINE_S):
            yield
    except A2Error as exc:
        if exc.code is not ErrorCode.STORE_UNAVAILABLE or exc.__cause__ is None:
            raise AssertionError(f"{what}: expected STORE_UNAVAILABLE with a cause") from exc
    except trio.TooSlowError:
        raise AssertionError(f"{what}: still waiting after {UNREACHABLE_DEADLINE_S} s") from None
    except Exception as exc:
        raise AssertionError(f"{what}: raised {exc!r}, not A2Error(STORE_UNAVAILABLE)") from exc
