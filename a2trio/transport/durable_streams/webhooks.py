"""Webhook delivery for subscriptions (Sections 6.2, 6.5, 7.1, 12.8-12.10):
URL checks against SSRF, Ed25519 signatures and their JWKS, callback
tokens, and one signed ``POST`` over Trio.

The signature is Ed25519 (the ``cryptography`` package: ``pip install
'a2trio[webhooks]'``); a lane without it serves pull-wake subscriptions
only. Callback and claim tokens are HMAC-SHA256 over the subscription, its
generation and its wake, keyed by a secret derived from the signing seed,
so any process holding the seed validates any process's tokens.

The ``POST`` is HTTP/1.1 over ``trio.open_tcp_stream`` (TLS for
``https://``) spoken with ``h11``, hypercorn's own parser: the lane needs
no HTTP client. The host is resolved and every address checked before
connecting, so a name that resolves into a private range is refused like
the address itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import ssl
import time
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

import h11
import trio

__all__ = [
    "MAX_RESPONSE_BYTES",
    "MissingCrypto",
    "Signer",
    "WebhookRefused",
    "check_url",
    "post",
]

#: How much of a webhook's answer is read (its ``{"done": true}``).
MAX_RESPONSE_BYTES: Final = 64 * 1024
#: The longest webhook URL accepted.
MAX_URL_LENGTH: Final = 2048
_LOCAL_HOST: Final = re.compile(r"(?:localhost|127\.\d{1,3}\.\d{1,3}\.\d{1,3})\Z")


class WebhookRefused(Exception):
    """A webhook URL the lane does not call (Section 12.8)."""


class MissingCrypto(Exception):
    """Webhook signing needs the ``cryptography`` package."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _is_local(host: str) -> bool:
    return _LOCAL_HOST.match(host) is not None


def check_url(url: str, *, local: bool) -> None:
    """Refuse a webhook URL the protocol says not to call: not ``https``
    (``http`` only to ``localhost`` / ``127.0.0.x`` with ``local``), an
    address that is not public, credentials in the URL.

    Raises:
      WebhookRefused: why.
    """
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRefused(f"webhook.url is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookRefused("webhook.url must be a valid URL") from None
    host = (parts.hostname or "").lower()
    if not host or port == 0:
        raise WebhookRefused("webhook.url must name a host")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("webhook.url must not carry credentials")
    if parts.scheme == "http":
        if local and _is_local(host):
            return
        raise WebhookRefused(
            "http webhook URLs are only allowed for localhost or 127.0.0.x, on a lane "
            "built with local_webhooks=True; use https"
        )
    if parts.scheme != "https":
        raise WebhookRefused("webhook.url must use https")
    if host == "localhost" or host.endswith(".localhost"):
        raise WebhookRefused("webhook.url must not target this machine over https")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: its addresses are checked when it is called
    if not address.is_global or address.is_multicast:
        raise WebhookRefused("webhook.url must not target private or link-local hosts")


def _allowed(address: str, *, loopback: bool) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if loopback:
        return ip.is_loopback
    return ip.is_global and not ip.is_multicast


async def _resolve(host: str, port: int, *, loopback: bool) -> str:
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        address = str(sockaddr[0])
        if _allowed(address, loopback=loopback):
            return address
    raise WebhookRefused(f"{host} resolves to no address a webhook may target")


class Reply(NamedTuple):
    """A webhook's answer: its status and (the start of) its body."""

    status: int
    body: bytes


async def post(
    url: str, body: bytes, headers: dict[str, str], *, timeout_s: float, local: bool
) -> Reply:
    """``POST`` ``body`` to ``url`` (checked by :func:`check_url` first) and
    read the answer, all within ``timeout_s``.

    Raises:
      WebhookRefused: the URL, or every address of its host, is refused.
      OSError, trio.TooSlowError, h11.ProtocolError, ssl.SSLError: the call failed.
    """
    check_url(url, local=local)
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with trio.fail_after(timeout_s):
        address = await _resolve(host, port, loopback=not https)
        stream: trio.abc.Stream = await trio.open_tcp_stream(address, port)
        try:
            if https:
                stream = trio.SSLStream(
                    stream,
                    ssl.create_default_context(),
                    server_hostname=host,
                    https_compatible=True,
                )
            return await _exchange(stream, parts.netloc, target, body, headers)
        finally:
            await trio.aclose_forcefully(stream)


async def _exchange(
    stream: trio.abc.Stream, netloc: str, target: str, body: bytes, headers: dict[str, str]
) -> Reply:
    connection = h11.Connection(h11.CLIENT)
    fields = [
        ("host", netloc),
        ("user-agent", "a2trio-durable-streams"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        *headers.items(),
    ]
    await stream.send_all(
        connection.send(h11.Request(method="POST", target=target, headers=fields))
        + connection.send(h11.Data(data=body))
        + connection.send(h11.EndOfMessage())
    )
    status = 0
    answer = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(bytes(await stream.receive_some(65536)))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            answer += event.data[: MAX_RESPONSE_BYTES - len(answer)]
            if len(answer) >= MAX_RESPONSE_BYTES:
                break
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    return Reply(status, bytes(answer))


class Signer:
    """The lane's webhook signing key (from a 32-byte seed) and the token key
    derived from it."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError("a webhook signing key is a 32-byte Ed25519 seed")
        self._seed = seed
        self._token_key = hashlib.sha256(
            b"a2trio durable streams callback tokens\x1f" + seed
        ).digest()
        self._private: Any = None
        self._jwk: dict[str, str] | None = None

    def _load(self) -> Any:
        if self._private is None:
            try:
                from cryptography.hazmat.primitives import serialization
                from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
            except ImportError:
                raise MissingCrypto(
                    "webhook subscriptions sign with Ed25519: install the cryptography "
                    "package (pip install 'a2trio[webhooks]')"
                ) from None
            private = Ed25519PrivateKey.from_private_bytes(self._seed)
            raw = private.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
            x = _b64url(raw)
            # RFC 7638's thumbprint: the required members, sorted, no spaces.
            thumbprint = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
            kid = "ds_" + _b64url(hashlib.sha256(thumbprint.encode()).digest())
            self._jwk = {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": x,
                "kid": kid,
                "use": "sig",
                "alg": "EdDSA",
            }
            self._private = private
        return self._private

    def jwk(self) -> dict[str, str]:
        """The public key as a JWK (Section 6.5).

        Raises:
          MissingCrypto: ``cryptography`` is not installed.
        """
        self._load()
        assert self._jwk is not None
        return dict(self._jwk)

    @property
    def kid(self) -> str:
        """The key's id (its JWK thumbprint).

        Raises:
          MissingCrypto: ``cryptography`` is not installed.
        """
        return self.jwk()["kid"]

    def signature(self, body: bytes, now_s: int | None = None) -> str:
        """The ``Webhook-Signature`` header of ``body``: Ed25519 over
        ``<timestamp>.<body>`` (Section 7.1).

        Raises:
          MissingCrypto: ``cryptography`` is not installed.
        """
        private = self._load()
        stamp = int(time.time()) if now_s is None else now_s
        signed = private.sign(f"{stamp}.".encode() + body)
        return f"t={stamp},kid={self.kid},ed25519={_b64url(signed)}"

    def token(self, key: str, generation: int, wake_id: str) -> str:
        """A callback or claim token for one wake of one subscription."""
        claims = _b64url(json.dumps([key, generation, wake_id]).encode())
        mac = hmac.new(self._token_key, claims.encode(), hashlib.sha256).digest()
        return f"{claims}.{_b64url(mac)}"

    def read_token(self, token: str) -> tuple[str, int, str] | None:
        """The (subscription, generation, wake) a token was made for; ``None``
        for a token this key did not make."""
        claims, _, mac = token.partition(".")
        expected = hmac.new(self._token_key, claims.encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(_unb64url(mac), expected):
                return None
            key, generation, wake_id = json.loads(_unb64url(claims))
        except (ValueError, TypeError):
            return None
        if not isinstance(key, str) or not isinstance(wake_id, str) or type(generation) is not int:
            return None
        return key, generation, wake_id
