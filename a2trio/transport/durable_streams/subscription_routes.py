"""The reserved control routes, ``{root}/__ds/...`` (Sections 6 and 7).

=========================================== ======= ==========================
route                                       method  answer
=========================================== ======= ==========================
``__ds/jwks.json``                          GET     the webhook signing keys
``__ds/subscriptions/:id``                  PUT     201 created, 200 the same
                                                    again, 409 another config
``__ds/subscriptions/:id``                  GET     the subscription
``__ds/subscriptions/:id``                  DELETE  204
``__ds/subscriptions/:id/streams``          POST    204: explicit links added
``__ds/subscriptions/:id/streams/:path``    DELETE  204: one removed
``__ds/subscriptions/:id/callback``         POST    a webhook's ack (token)
``__ds/subscriptions/:id/claim``            POST    a pull-wake claim
``__ds/subscriptions/:id/ack``              POST    a claim's ack (token)
``__ds/subscriptions/:id/release``          POST    204: a claim let go
=========================================== ======= ==========================

``root`` is whatever precedes the first ``__ds`` segment of the path: the
lane serves every path, so each prefix is a stream root of its own, and the
paths in bodies are relative to it. Errors answer the protocol's envelope,
``{"error": {"code", "message"}}``. ``authorize`` is asked a
:class:`SubscriptionOperation` before every route but the keys and the
token-authenticated ``callback``, ``ack`` and ``release``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import msgspec

from .. import Request
from .context import LaneContext, Receive, Scope
from .subscription_acks import acknowledge, claim, release, serialize
from .subscription_model import Config, SubscriptionError
from .subscriptions import Subscriptions
from .table import Answer
from .webhooks import MissingCrypto, WebhookRefused, check_url

__all__ = ["SubscriptionOperation", "control_path", "serve_control"]

DEFAULT_LEASE_TTL_MS: Final = 30_000
MIN_LEASE_TTL_MS: Final = 1_000
MAX_LEASE_TTL_MS: Final = 600_000
#: The longest subscription id.
MAX_ID_LENGTH: Final = 256

ReadBody = Callable[[Request, Receive], Awaitable[bytes]]


class SubscriptionOperation(msgspec.Struct, frozen=True, tag="durable-stream-subscription"):
    """What ``authorize`` is asked about a subscription under the stream
    root ``root``: ``subscribe`` (with its ``pattern``, ``streams`` and
    ``wake_stream``, where it writes its wake events), ``read``,
    ``unsubscribe``, ``link`` and ``unlink`` (``streams``), ``claim``."""

    action: Literal["subscribe", "read", "unsubscribe", "link", "unlink", "claim"]
    root: str
    id: str
    pattern: str | None = None
    streams: tuple[str, ...] = ()
    wake_stream: str | None = None


def control_path(path: str) -> tuple[str, list[str]] | None:
    """(root, the segments after ``__ds``) for a control path, else ``None``."""
    segments = path.split("/")
    try:
        at = segments.index("__ds")
    except ValueError:
        return None
    return "/".join(segments[:at]), segments[at + 1 :]


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Answer:
    return Answer(
        status, {"content-type": "application/json", **(headers or {})}, json.dumps(body).encode()
    )


def _invalid(message: str) -> SubscriptionError:
    return SubscriptionError(400, "INVALID_REQUEST", message)


def _not_allowed(allow: str) -> Answer:
    return Answer(405, {"allow": allow}, b"method not allowed")


async def serve_control(
    subs: Subscriptions,
    context: LaneContext,
    read_body: ReadBody,
    scope: Scope,
    request: Request,
    receive: Receive,
    root: str,
    rest: list[str],
) -> Answer:
    """Answer one request to a control route."""
    try:
        if rest == ["jwks.json"]:
            if request.method != "GET":
                return _not_allowed("GET")
            try:
                key = (await subs.signer()).jwk()
            except MissingCrypto as exc:
                raise SubscriptionError(404, "SUBSCRIPTION_NOT_FOUND", str(exc)) from None
            headers = {
                "content-type": "application/jwk-set+json",
                "cache-control": "public, max-age=300",
            }
            return Answer(200, headers, json.dumps({"keys": [key]}).encode())
        if len(rest) < 2 or rest[0] != "subscriptions" or not rest[1]:
            raise SubscriptionError(
                404, "SUBSCRIPTION_NOT_FOUND", "Durable Streams control route not found"
            )
        sub_id, tail = rest[1], rest[2:]
        if len(sub_id) > MAX_ID_LENGTH or not sub_id.isprintable():
            raise _invalid(f"a subscription id is at most {MAX_ID_LENGTH} printable characters")
        route = _Route(subs, context, read_body, scope, request, receive, root, sub_id)
        if not tail:
            return await route.base()
        if tail[0] == "streams":
            return await route.streams("/".join(tail[1:]))
        if len(tail) == 1 and tail[0] in ("callback", "claim", "ack", "release"):
            if request.method != "POST":
                return _not_allowed("POST")
            return await route.action(tail[0])
        raise SubscriptionError(
            404, "SUBSCRIPTION_NOT_FOUND", "Durable Streams control route not found"
        )
    except SubscriptionError as exc:
        return _json(exc.status, exc.body)


class _Route:
    def __init__(
        self,
        subs: Subscriptions,
        context: LaneContext,
        read_body: ReadBody,
        scope: Scope,
        request: Request,
        receive: Receive,
        root: str,
        sub_id: str,
    ) -> None:
        self.subs = subs
        self.context = context
        self.read_body = read_body
        self.request = request
        self.receive = receive
        self.root = root
        self.sub_id = sub_id
        host = request.headers.get("host", "localhost")
        self.base_url = f"{scope.get('scheme', 'http')}://{host}{scope.get('root_path', '')}"

    async def _authorized(self, action: Any, **fields: Any) -> None:
        await self.context.authorized(
            self.request, SubscriptionOperation(action, self.root, self.sub_id, **fields)
        )

    async def _body(self) -> Any:
        raw = await self.read_body(self.request, self.receive)
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise _invalid("Invalid JSON body") from None

    async def _kid(self) -> str | None:
        try:
            return (await self.subs.signer()).kid
        except MissingCrypto:
            return None

    def _path(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value.strip("/"):
            raise _invalid(f"{what} must be a non-empty stream path")
        path = value.strip("/")
        if path.split("/", 1)[0] == "__ds":
            raise _invalid(f"{what} must not be under the reserved __ds")
        try:
            self.subs.streams.server.session(f"{self.root}/{path}")
        except (TypeError, ValueError) as exc:
            raise _invalid(f"{what}: {exc}") from None
        return path

    def _paths(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise _invalid("streams must be a non-empty string array")
        return tuple(dict.fromkeys(self._path(v, "streams[]") for v in value))

    def _config(self, payload: Any) -> Config:
        if not isinstance(payload, dict):
            raise _invalid("Request body must be a JSON object")
        kind = payload.get("type")
        if kind not in ("webhook", "pull-wake"):
            raise _invalid('type must be "webhook" or "pull-wake"')
        pattern = payload.get("pattern")
        if pattern is not None:
            pattern = self._path(pattern, "pattern")
        streams = self._paths(payload["streams"]) if payload.get("streams") else ()
        if pattern is None and not streams:
            raise _invalid("At least one of pattern or streams is required")
        lease = payload.get("lease_ttl_ms", DEFAULT_LEASE_TTL_MS)
        if type(lease) is not int or not MIN_LEASE_TTL_MS <= lease <= MAX_LEASE_TTL_MS:
            raise _invalid(
                f"lease_ttl_ms must be an integer from {MIN_LEASE_TTL_MS} to {MAX_LEASE_TTL_MS}"
            )
        url = wake_stream = None
        if kind == "webhook":
            webhook = payload.get("webhook")
            url = webhook.get("url") if isinstance(webhook, dict) else None
            if not isinstance(url, str) or not url:
                raise _invalid("webhook subscriptions require webhook.url")
            try:
                check_url(url, local=self.subs.local_webhooks)
            except WebhookRefused as exc:
                raise SubscriptionError(400, "WEBHOOK_URL_REJECTED", str(exc)) from None
        else:
            wake_stream = self._path(payload.get("wake_stream"), "wake_stream")
        description = payload.get("description")
        if description is not None and not isinstance(description, str):
            raise _invalid("description must be a string")
        return Config(kind, pattern, streams, url, wake_stream, lease, description)

    async def base(self) -> Answer:
        subs, method = self.subs, self.request.method
        if method == "PUT":
            config = self._config(await self._body())
            await self._authorized(
                "subscribe",
                pattern=config.pattern,
                streams=config.streams,
                wake_stream=config.wake_stream,
            )
            kid = await self._kid()
            if config.type == "webhook" and kid is None:
                raise _invalid(
                    "webhook subscriptions sign with Ed25519: install the cryptography "
                    "package (pip install 'a2trio[webhooks]')"
                )
            created, sub = await subs.create(self.root, self.sub_id, config, self.base_url)
            return _json(201 if created else 200, serialize(sub, self.base_url, kid))
        if method == "GET":
            await self._authorized("read")
            sub = await subs.get(self.root, self.sub_id)
            return _json(
                200, serialize(sub, self.base_url, await self._kid()), {"cache-control": "no-store"}
            )
        if method == "DELETE":
            await self._authorized("unsubscribe")
            await subs.delete(self.root, self.sub_id)
            return Answer(204, {})
        return _not_allowed("GET, PUT, DELETE")

    async def streams(self, path: str) -> Answer:
        if not path:
            if self.request.method != "POST":
                return _not_allowed("POST")
            payload = await self._body()
            paths = self._paths(payload.get("streams") if isinstance(payload, dict) else None)
            await self._authorized("link", streams=paths)
            await self.subs.link(self.root, self.sub_id, list(paths))
            return Answer(204, {})
        if self.request.method != "DELETE":
            return _not_allowed("DELETE")
        path = self._path(path, "the stream")
        await self._authorized("unlink", streams=(path,))
        await self.subs.unlink(self.root, self.sub_id, path)
        return Answer(204, {})

    async def action(self, name: str) -> Answer:
        subs = self.subs
        if name == "claim":
            payload = await self._body()
            worker = payload.get("worker") if isinstance(payload, dict) else None
            if not isinstance(worker, str) or not worker or len(worker) > MAX_ID_LENGTH:
                raise _invalid(f"worker must be a non-empty string of at most {MAX_ID_LENGTH}")
            await self._authorized("claim")
            return _json(200, await claim(subs, self.root, self.sub_id, worker))
        authorization = self.request.headers.get("authorization", "")
        if not authorization.startswith("Bearer "):
            raise SubscriptionError(
                401, "TOKEN_INVALID", "Missing or malformed Authorization header"
            )
        token = authorization[len("Bearer ") :].strip()
        payload = await self._body()
        if name == "release":
            await release(subs, self.root, self.sub_id, token, payload)
            return Answer(204, {})
        kind = "webhook" if name == "callback" else "pull-wake"
        return _json(
            200, await acknowledge(subs, self.root, self.sub_id, token, payload, kind=kind)
        )
