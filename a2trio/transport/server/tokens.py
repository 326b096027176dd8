"""Short-lived signed tokens for browsers: ``issue_token`` and a ready ``authorize``.

A browser's ``EventSource`` and ``WebSocket`` cannot send an
``Authorization`` header, so a page proves who it is with a cookie or with a
token in the URL. This module is the second way: the application's own
backend (which knows the user) issues a token scoped to one contract, one
session (or all of the contract's), some operations and an expiry; the page
puts it in the query string (``/board/team-1?token=...``,
``/board/team-1/ws?token=...``); :func:`token_authorize` verifies it before
every operation, with no store and no shared state beyond the secret.

Format: ``v1.<payload>.<signature>``, both base64url without padding; the
payload is compact JSON (:class:`TokenClaims`), the signature HMAC-SHA256 of
``v1.<payload>`` under the secret, compared in constant time. Tokens are
bearer secrets: keep them short-lived (``ttl_s``, 5 minutes by default), and
note that open streams and lanes ask ``authorize`` again every
``Limits.reauthorize_s``, so a stream opened with a token ends (resumably)
soon after the token expires; the page then fetches a fresh token and
reconnects from its last index. The library never logs a token:
:class:`~a2trio.transport.Request`'s repr hides the query's ``token`` and the
``Authorization`` and ``Cookie`` headers, and no log line carries a URL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, get_args

import msgspec

from ...errors import A2Error, ErrorCode
from .auth import Authorize, Operation, PushOperation, Request

__all__ = [
    "DEFAULT_TOKEN_TTL_S",
    "OPERATIONS",
    "TOKEN_PARAM",
    "TokenClaims",
    "issue_token",
    "token_authorize",
    "token_of",
    "verify_token",
]

#: How long a token lives unless ``issue_token`` is told otherwise.
DEFAULT_TOKEN_TTL_S: Final = 300.0
#: The query parameter the token rides in.
TOKEN_PARAM: Final = "token"
_VERSION: Final = "v1"


def _name(operation_type: type[msgspec.Struct]) -> str:
    return str(operation_type.__struct_config__.tag)


#: Operation names a token may grant: each :data:`~a2trio.transport.Operation`'s
#: tag (``push``, ``stream``, ``history``, ``subscribe``, ``inspect``,
#: ``redrive``, ``skip``, ``retry_now``, ``state``, ``call``).
OPERATIONS: Final = frozenset(_name(t) for t in get_args(Operation))


class TokenClaims(msgspec.Struct, frozen=True):
    """What a token grants.

    Attributes:
      contract: the contract's name.
      session: the session id, or ``None`` for every session of the contract.
      ops: the granted operation names (:data:`OPERATIONS`).
      exp: expiry, epoch seconds.
      sub: the subject (a user id); when set, pushed presence must be this
        participant's.
      nonce: random, so that two tokens never look alike.
    """

    contract: str
    session: str | None
    ops: tuple[str, ...]
    exp: float
    sub: str | None = None
    nonce: str = ""

    def permits(self, operation: Operation) -> bool:
        """Whether these claims cover ``operation`` (expiry is checked apart)."""
        if operation.contract != self.contract or _name(type(operation)) not in self.ops:
            return False
        if self.session is not None and operation.session_id != self.session:
            return False
        if isinstance(operation, PushOperation) and operation.presence is not None:
            return self.sub is None or operation.presence.participant == self.sub
        return True


def _key(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    if not key:
        raise ValueError("a token secret must not be empty")
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, signed: str) -> str:
    return _b64(hmac.new(key, signed.encode(), hashlib.sha256).digest())


def issue_token(
    secret: str | bytes,
    *,
    contract: str,
    session_id: str | None,
    operations: Iterable[str] = ("stream", "history"),
    ttl_s: float = DEFAULT_TOKEN_TTL_S,
    subject: str | None = None,
    now: float | None = None,
) -> str:
    """A signed token granting ``operations`` on one session of ``contract``
    (``session_id=None``: every session) for ``ttl_s`` seconds.

    Args:
      secret: the HMAC key shared with :func:`token_authorize`.
      contract: the contract's name.
      session_id: the session, or ``None`` for all of the contract's.
      operations: any of :data:`OPERATIONS`: ``push``, ``stream``,
        ``history``, ``subscribe`` (each lane of a multiplexed socket), the
        operator's ``inspect``, ``redrive``, ``skip``, ``retry_now``, and an
        actor's ``state`` and ``call``.
      ttl_s: lifetime in seconds.
      subject: who the token is for; when set, pushed presence must be this
        participant's.
      now: epoch seconds (``time.time()`` when ``None``).

    Raises:
      ValueError: an empty secret, an unknown operation, none at all, or a
        lifetime that is not positive.
    """
    key = _key(secret)
    ops = tuple(dict.fromkeys(operations))
    unknown = [op for op in ops if op not in OPERATIONS]
    if unknown or not ops:
        raise ValueError(f"operations are some of {sorted(OPERATIONS)}, got {list(operations)!r}")
    if not ttl_s > 0:
        raise ValueError(f"`ttl_s` must be positive, got {ttl_s!r}")
    issued = time.time() if now is None else now
    claims = TokenClaims(
        contract, session_id, ops, round(issued + ttl_s, 3), subject, secrets.token_urlsafe(9)
    )
    signed = f"{_VERSION}.{_b64(msgspec.json.encode(claims))}"
    return f"{signed}.{_signature(key, signed)}"


def verify_token(
    secret: str | bytes | Sequence[str | bytes], token: str, *, now: float | None = None
) -> TokenClaims:
    """The claims of a token signed with ``secret`` (or any of a list of
    secrets, for rotation) that has not expired.

    Raises:
      A2Error: ``FORBIDDEN`` for a malformed, forged or expired token (the
        message never repeats the token).
    """
    keys = [_key(secret)] if isinstance(secret, str | bytes) else [_key(s) for s in secret]
    version, _, rest = token.partition(".")
    payload, _, signature = rest.partition(".")
    if version != _VERSION or not payload or not signature:
        raise A2Error(ErrorCode.FORBIDDEN, "the token is malformed")
    signed = f"{version}.{payload}"
    if not any(hmac.compare_digest(_signature(key, signed), signature) for key in keys):
        raise A2Error(ErrorCode.FORBIDDEN, "the token's signature is not valid")
    try:
        claims = msgspec.json.decode(_unb64(payload), type=TokenClaims)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise A2Error(ErrorCode.FORBIDDEN, "the token is malformed") from None
    if claims.exp <= (time.time() if now is None else now):
        raise A2Error(ErrorCode.FORBIDDEN, "the token has expired")
    return claims


def token_of(
    request: Request, *, param: str = TOKEN_PARAM, cookie: str | None = None
) -> str | None:
    """The token a request carries: the query's ``param``, else an
    ``Authorization: Bearer`` header, else the cookie named ``cookie``."""
    token = request.query.get(param)
    if token:
        return token
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    if cookie is not None:
        for pair in request.headers.get("cookie", "").split(";"):
            name, _, value = pair.strip().partition("=")
            if name == cookie and value:
                return value
    return None


def token_authorize(
    secret: str | bytes | Sequence[str | bytes],
    *,
    param: str = TOKEN_PARAM,
    cookie: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Authorize:
    """An ``authorize`` for :func:`~a2trio.transport.asgi` that allows exactly
    what the request's token (:func:`token_of`) grants.

    A request without a token is refused (403); a malformed, forged or expired
    token answers 403 with the reason (``the token has expired``), so a page
    knows to fetch a new one.

    Args:
      secret: the key tokens are signed with, or a list (the first is the
        current one; older ones still verify while tokens signed with them live).
      param: the query parameter.
      cookie: also read the token from this cookie (the cookie pattern).
      clock: epoch seconds, for tests.

    Raises:
      ValueError: an empty secret.
    """
    keys = [secret] if isinstance(secret, str | bytes) else list(secret)
    for key in keys:
        _key(key)

    def authorize(request: Request, operation: Operation) -> bool:
        token = token_of(request, param=param, cookie=cookie)
        if token is None:
            return False
        return verify_token(keys, token, now=clock()).permits(operation)

    return authorize
