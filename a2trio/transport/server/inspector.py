"""``/_a2/inspect``: the operator's JSON API over ``server.inspect``, and the
inspector page that uses it (issue 18). Mounted by ``asgi(..., inspect=True)``.

=========================================================== =====================
request                                                     answer
=========================================================== =====================
``GET /_a2/inspect``                                        the inspector page
``GET /_a2/inspect/{contract}``                             sessions
``GET /_a2/inspect/{contract}?view=dead-letters``           dead letters
``GET /_a2/inspect/{contract}/{session}``                   events, status, actions
``POST /_a2/inspect/{contract}/{session}/{index}/redrive``  ``{"actions": [...]}``
``POST /_a2/inspect/{contract}/{session}/{index}/skip``     ``{"actions": [...]}``
``POST /_a2/inspect/{contract}/{session}/{index}/wake``     ``{"actions": [...]}``
``POST /_a2/inspect/{contract}/{session}/{index}/cancel``   ``{"actions": [...]}``
``POST /_a2/inspect/{contract}/{session}/retry-now``        ``{"actions": [...]}``
``POST /_a2/inspect/{contract}``                            a bulk action's result
``GET /_a2/inspect/{contract}/{session}?view=export``       the session, JSON lines
``POST /_a2/inspect/{contract}/{session}/erase``            ``{"erased": {...}}``
``POST /_a2/inspect/{contract}/{session}/trim``             ``{"trimmed": {...}}``
=========================================================== =====================

Reads take ``?limit=``, ``?cursor=`` (sessions, dead letters), ``?after=`` and
``?through=`` (events). Actions take a JSON body ``{"by": ..., "reason":
...}`` and must say ``content-type: application/json``, which a cross-site
form cannot send without the browser asking first (no CSRF through a
cookie). Each data request is authorized first: reads as an
:class:`~a2trio.transport.InspectOperation`, actions as a
:class:`~a2trio.transport.RedriveOperation`,
:class:`~a2trio.transport.SkipOperation`,
:class:`~a2trio.transport.WakeOperation`,
:class:`~a2trio.transport.CancelOperation` or
:class:`~a2trio.transport.RetryNowOperation`; without a policy that allows
them, refused. The page itself is a static file (``inspector.html``, shipped
in the package) holding no data but the mounted contracts' names: everything
it shows comes through those requests, with the browser's cookies.

Every answer is the wire's camelCase (:mod:`a2trio.transport.wire`'s
inspection records, as ``a2trio inspect --json`` prints them):
``{sessions, cursor}``, ``{deadLetters, cursor}``, ``{events, snapshots,
throughIndex, nextIndex}``.

A refused action answers 404 (``no_event``) or 409 (``not_dead_lettered``,
``settled``, ``claimed``, ``nothing_to_retry``, ``not_waiting``) with the error envelope, its
``details`` naming the reason.

Retention (issue 35): ``?view=export`` answers the session as
``server.retention.lines`` writes an archive (``application/x-ndjson``),
authorized as an :class:`~a2trio.transport.InspectOperation` of the session.
``erase`` takes ``{"by", "reason", "expectedIndex"?}`` (an export's
``index``: the erasure is then refused if the session moved, which is how an
archive is made over HTTP) and ``trim`` ``{"by", "reason", "reducer"}``;
they are authorized as :class:`~a2trio.transport.EraseOperation` and
:class:`~a2trio.transport.TrimOperation`, and a refusal
(:class:`~a2trio.RetentionError`: ``claimed``, ``changed``, ``no_snapshot``,
``unprocessed``) answers 409 with its reason in the envelope's ``details``.

A bulk action (issue 35) is POSTed to the contract with the wire's
:class:`~a2trio.transport.wire.WireBulkRequest` body (``{action, filter, by,
reason, dryRun, all, limit}``) and answers its ``{action, dryRun, matched,
acted, refused, items, limited}``; a malformed filter or body answers 400. It
is authorized as an :class:`~a2trio.transport.InspectOperation` of the
contract (it reads the dead letters), then each event it would act on as its
single :class:`~a2trio.transport.RedriveOperation` or
:class:`~a2trio.transport.SkipOperation`: a policy's refusal of one is
reported on that event (``forbidden``) and the others go on, so a policy that
scopes single actions scopes bulk ones too. A dry run asks only the first.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from functools import cache
from importlib import resources
from typing import Final

import msgspec

from ...engine.inspection import DEFAULT_BULK_LIMIT, InspectionUnsupportedError
from ...engine.inspection_records import BulkResult
from ...errors import A2Error, ErrorCode
from ...server import Server
from ...stores.base import OperatorAction, OperatorActionError, RetentionError
from .. import wire
from .auth import (
    Authorize,
    CancelOperation,
    EraseOperation,
    InspectOperation,
    RedriveOperation,
    Request,
    RetryNowOperation,
    SkipOperation,
    TrimOperation,
    WakeOperation,
    check_authorized,
)
from .http import Refusal, Send, bad_input, index_param, respond

__all__ = ["serve_inspector"]

_PAGE_HEADERS: Final = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
]
#: Where the page finds the mounted contracts (replaced once per app).
_CONTRACTS_SLOT: Final = "/*A2_CONTRACTS*/[]"


class _ActionBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    by: str
    reason: str = ""


_decode_action = msgspec.json.Decoder(_ActionBody).decode


class _EraseBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    by: str
    reason: str
    expected_index: int | None = None


class _TrimBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    by: str
    reason: str
    reducer: str


_decode_erase = msgspec.json.Decoder(_EraseBody).decode
_decode_trim = msgspec.json.Decoder(_TrimBody).decode
_NDJSON: Final = [
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
]


@cache
def _page_template() -> str:
    return resources.files(__package__).joinpath("inspector.html").read_text("utf-8")


def page(contracts: list[str]) -> bytes:
    """The inspector page, listing ``contracts`` (JSON inside a script: ``<``
    is escaped so no name can close the element)."""
    names = json.dumps(contracts).replace("<", "\\u003c")
    return _page_template().replace(_CONTRACTS_SLOT, names).encode()


async def serve_inspector(
    servers: Mapping[str, Server],
    authorize: Authorize | None,
    target: list[str],
    request: Request,
    body: Callable[[], Awaitable[bytes]],
    send: Send,
) -> None:
    """Answer one request under ``/_a2/inspect`` (``target``: the segments
    after it, percent-decoded).

    Raises:
      Refusal / A2Error: a bad path, method, body or bound, a refusal by
        ``authorize`` or by the store (the caller answers the envelope).
    """
    method = request.method
    reads = method in ("GET", "HEAD")
    if target in ([], [""]):
        if not reads:
            raise Refusal(405, "the inspector page takes GET")
        content = page(list(servers))
        await send({"type": "http.response.start", "status": 200, "headers": _PAGE_HEADERS})
        await send({"type": "http.response.body", "body": content})
        return
    if len(target) == 1 and method == "POST":
        _check_json(request, "a bulk action")
        raw = await body()
        with bad_input():
            asked = wire.decode_bulk_request(raw or b"{}")
        result = await _bulk(_server(servers, target[0]), authorize, request, asked)
        await respond(send, 200, wire.encode(wire.bulk_result_to_wire(result)))
        return
    if len(target) in (1, 2):
        if not reads:
            raise Refusal(405, "inspection reads take GET; actions are POSTed to their own routes")
        if len(target) == 2 and request.query.get("view") == "export":
            content = await _export(_server(servers, target[0]), authorize, target[1], request)
            await send({"type": "http.response.start", "status": 200, "headers": _NDJSON})
            await send({"type": "http.response.body", "body": content})
            return
        await respond(send, 200, await _read(servers, authorize, target, request))
        return
    if len(target) == 3 and target[2] in ("erase", "trim"):
        if method != "POST":
            raise Refusal(405, f"{target[2]} takes POST")
        _check_json(request, target[2])
        raw = await body()
        server = _server(servers, target[0])
        await respond(send, 200, await _remove(server, authorize, target, request, raw or b"{}"))
        return
    action = target[-1]
    if not (
        (len(target) == 3 and action == "retry-now")
        or (len(target) == 4 and action in ("redrive", "skip", "wake", "cancel"))
    ):
        raise Refusal(
            404,
            "inspection actions are POST /_a2/inspect/{contract}/{session}/{index}/redrive "
            "(or /skip, /wake, /cancel) and /{contract}/{session}/retry-now (or /erase, /trim)",
        )
    if method != "POST":
        raise Refusal(405, f"{action} takes POST")
    _check_json(request, action)
    raw = await body()
    with bad_input():
        words = _decode_action(raw or b"{}")
    actions = await _act(servers, authorize, target, request, words)
    await respond(send, 200, wire.encode({"actions": wire.actions_to_wire(actions)}))


def _check_json(request: Request, what: str) -> None:
    if request.headers.get("content-type", "").partition(";")[0].strip() != "application/json":
        raise Refusal(415, f"{what} takes a JSON body: content-type: application/json")


def _server(servers: Mapping[str, Server], name: str) -> Server:
    server = servers.get(name)
    if server is None:
        raise Refusal(404, f"no contract named {name!r} is mounted")
    return server


async def _read(
    servers: Mapping[str, Server], authorize: Authorize | None, target: list[str], request: Request
) -> bytes:
    server = _server(servers, target[0])
    with bad_input():
        session_id = server.session(target[1]).id if len(target) == 2 else ""
    await check_authorized(authorize, request, InspectOperation(server.contract.name, session_id))
    query = request.query
    limit = index_param("limit", query.get("limit"))
    limit = 100 if limit is None else limit
    view = query.get("view", "sessions")
    if session_id == "" and view not in ("sessions", "dead-letters"):
        raise Refusal(400, f"`view` is 'sessions' or 'dead-letters', got {view[:40]!r}")
    inspect = server.inspect
    try:
        with bad_input():
            if session_id:
                page = await inspect.read_session_page(
                    session_id,
                    after_index=index_param("after", query.get("after")) or 0,
                    limit=limit,
                    through_index=index_param("through", query.get("through")),
                )
                return wire.encode(wire.session_events_page_to_wire(page))
            if view == "dead-letters":
                dead = await inspect.list_dead_letters(limit=limit, cursor=query.get("cursor"))
                return wire.encode(wire.dead_letters_page_to_wire(dead))
            listed = await inspect.list_sessions(limit=limit, cursor=query.get("cursor"))
            return wire.encode(wire.sessions_page_to_wire(listed))
    except InspectionUnsupportedError as exc:
        raise Refusal(404, str(exc)) from None


async def _act(
    servers: Mapping[str, Server],
    authorize: Authorize | None,
    target: list[str],
    request: Request,
    words: _ActionBody,
) -> list[OperatorAction]:
    server = _server(servers, target[0])
    contract = server.contract.name
    with bad_input():
        session_id = server.session(target[1]).id
    index = 0
    if len(target) == 4:
        index = index_param("index", target[2]) or 0
        if index < 1:
            raise Refusal(400, "the event index must be a positive integer")
    by, reason = words.by, words.reason
    operation: (
        RedriveOperation | SkipOperation | RetryNowOperation | WakeOperation | CancelOperation
    )
    if target[-1] == "retry-now":
        operation = RetryNowOperation(contract, session_id, by, reason)
    elif target[-1] == "redrive":
        operation = RedriveOperation(contract, session_id, index, by, reason)
    elif target[-1] == "wake":
        operation = WakeOperation(contract, session_id, index, by, reason)
    elif target[-1] == "cancel":
        operation = CancelOperation(contract, session_id, index, by, reason)
    else:
        operation = SkipOperation(contract, session_id, index, by, reason)
    await check_authorized(authorize, request, operation)
    inspect = server.inspect
    try:
        with bad_input():
            try:
                match operation:
                    case RetryNowOperation():
                        return await inspect.retry_now(session_id, by=by, reason=reason)
                    case RedriveOperation():
                        return [await inspect.redrive(session_id, index, by=by, reason=reason)]
                    case SkipOperation():
                        return [await inspect.skip(session_id, index, by=by, reason=reason)]
                    case WakeOperation():
                        return [await inspect.wake(session_id, index, by=by, reason=reason)]
                    case CancelOperation():
                        return [await inspect.cancel(session_id, index, by=by, reason=reason)]
            except OperatorActionError as exc:
                raise _refused(exc) from None
    except InspectionUnsupportedError as exc:
        raise Refusal(404, str(exc)) from None


async def _bulk(
    server: Server, authorize: Authorize | None, request: Request, asked: wire.WireBulkRequest
) -> BulkResult:
    contract = server.contract.name
    await check_authorized(authorize, request, InspectOperation(contract))
    by, reason = asked.by, asked.reason

    async def allow(session_id: str, index: int) -> bool:
        operation: RedriveOperation | SkipOperation
        if asked.action == "redrive":
            operation = RedriveOperation(contract, session_id, index, by, reason)
        else:
            operation = SkipOperation(contract, session_id, index, by, reason)
        try:
            await check_authorized(authorize, request, operation)
        except A2Error as exc:
            if exc.code != ErrorCode.FORBIDDEN:
                raise
            return False
        return True

    try:
        with bad_input():
            return await server.inspect.bulk(
                asked.action,
                asked.dead_letter_filter(),
                by=by,
                reason=reason,
                dry_run=asked.dry_run,
                all=asked.all,
                limit=DEFAULT_BULK_LIMIT if asked.limit is None else asked.limit,
                allow=allow,
            )
    except InspectionUnsupportedError as exc:
        raise Refusal(404, str(exc)) from None


async def _export(
    server: Server, authorize: Authorize | None, session: str, request: Request
) -> bytes:
    with bad_input():
        session_id = server.session(session).id
    await check_authorized(authorize, request, InspectOperation(server.contract.name, session_id))
    try:
        with bad_input():
            archive = await server.retention.export(session_id)
    except InspectionUnsupportedError as exc:
        raise Refusal(404, str(exc)) from None
    return server.retention.lines(archive)


async def _remove(
    server: Server, authorize: Authorize | None, target: list[str], request: Request, raw: bytes
) -> bytes:
    """An erasure or a trim: the body checked, the operation authorized, then
    ``server.retention`` asked; its answer as the wire's record."""
    contract = server.contract.name
    with bad_input():
        session_id = server.session(target[1]).id
        asked = _decode_erase(raw) if target[2] == "erase" else _decode_trim(raw)
    operation: EraseOperation | TrimOperation
    if isinstance(asked, _EraseBody):
        operation = EraseOperation(contract, session_id, asked.by, asked.reason)
    else:
        operation = TrimOperation(contract, session_id, asked.reducer, asked.by, asked.reason)
    await check_authorized(authorize, request, operation)
    retention = server.retention
    try:
        with bad_input():
            try:
                if isinstance(asked, _EraseBody):
                    erased = await retention.erase(
                        session_id,
                        by=asked.by,
                        reason=asked.reason,
                        expected_index=asked.expected_index,
                    )
                    return wire.encode({"erased": wire.erased_to_wire(erased)})
                trimmed = await retention.trim(
                    session_id, asked.reducer, by=asked.by, reason=asked.reason
                )
                return wire.encode({"trimmed": wire.trimmed_to_wire(trimmed)})
            except RetentionError as exc:
                refusal = Refusal(409, str(exc))
                refusal.error = A2Error(ErrorCode.INVALID_PAYLOAD, str(exc), {"reason": exc.reason})
                raise refusal from None
    except InspectionUnsupportedError as exc:
        raise Refusal(404, str(exc)) from None


def _refused(exc: OperatorActionError) -> Refusal:
    """404 for a missing event, 409 for any other refusal; the reason in
    the envelope's ``details``."""
    refusal = Refusal(404 if exc.reason == "no_event" else 409, str(exc))
    refusal.error = A2Error(ErrorCode.INVALID_PAYLOAD, str(exc), {"reason": exc.reason})
    return refusal
