"""Subscriptions: durable cursors over streams that wake workers (Sections 6, 7).

Theory of operation. Every subscription, its links and cursors, and its
wake in flight are folded from one session (:mod:`.subscription_model`,
:mod:`.subscription_log`), so every lane process on a store decides on the
same state and a decision is committed conditionally: a wake is issued once
per generation, a claim has one holder, a stale callback is fenced, across
processes too.

Three kinds of task live in the nursery the lane owns (:meth:`run`), so no
request waits for a webhook:

* the waker: appends and deletes mark their path (:meth:`changed`, no I/O);
  it links the streams a pattern matches and wakes the idle subscriptions
  with pending work (a ``woke`` event first, then the webhook or the
  pull-wake event);
* deliveries: one task per webhook call, signed, bounded by
  ``webhook_timeout_s``; a failure schedules a retry (``failed``: 1 s
  doubling to 60 s, 20 % jitter), a ``{"done": true}`` answer acks the wake's
  snapshot;
* the ticker: at least once a second it brings the state up to date (so
  subscriptions made by other processes take effect here), takes the
  retries that are due and ends the wakes whose lease ran out (waking again
  when work is pending), and wakes a subscription it has not seen before
  when it has pending work (after a restart: the appends whose wake a crash
  cut off).
"""

from __future__ import annotations

import json
import logging
import random
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

import h11
import trio

from ... import Server
from .model import CONTRACT as STREAMS_CONTRACT
from .protocol import Offset, format_offset
from .subscription_log import Plan, SubscriptionLog
from .subscription_model import (
    BEFORE_FIRST,
    Acked,
    Config,
    Delivered,
    Failed,
    Keyed,
    Keyref,
    Link,
    Linked,
    Registry,
    Released,
    Retrying,
    Subscribed,
    Subscription,
    SubscriptionError,
    Unlinked,
    Woke,
    glob_match,
    key_of,
    missing,
    relative,
)
from .table import Streams
from .webhooks import MissingCrypto, Signer, WebhookRefused, post
from .writes import AppendRequest, decide_append

__all__ = ["WEBHOOK_TIMEOUT_S", "Config", "SubscriptionError", "Subscriptions"]

logger = logging.getLogger("a2trio.transport.durable_streams.subscriptions")

#: How long one webhook call may take, connect to answer.
WEBHOOK_TIMEOUT_S: Final = 10.0
#: The ticker's longest sleep: how late a lease expiry or a retry is taken.
TICK_S: Final = 1.0
#: The most streams a pattern links when its subscription is created.
MAX_BACKFILL: Final = 10_000
RETRY_BASE_MS: Final = 1_000
RETRY_MAX_MS: Final = 60_000
ZERO: Final = format_offset(Offset(0, 0))


class Subscriptions:
    """The subscriptions of the lane's store, as this process serves them."""

    def __init__(
        self,
        streams: Streams,
        server: Server,
        *,
        signing_key: bytes | None,
        local_webhooks: bool,
        webhook_timeout_s: float,
    ) -> None:
        self.streams = streams
        self.log = SubscriptionLog(server)
        self.local_webhooks = local_webhooks
        self.webhook_timeout_s = webhook_timeout_s
        self._given = Signer(signing_key) if signing_key is not None else None
        self._signer: Signer | None = self._given
        self._nursery: trio.Nursery | None = None
        self._dirty: set[str] = set()
        self._poke = trio.Event()
        self._roots: tuple[int, frozenset[str]] = (-1, frozenset())

    @property
    def now_ms(self) -> int:
        return self.streams.now_ms

    # -- the lane's tasks ---------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the waker, the ticker and the deliveries for the block."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._waker)
            nursery.start_soon(self._ticker)
            try:
                yield
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def changed(self, path: str) -> None:
        """``path`` was appended to or deleted: wake its subscriptions (later,
        in the waker). No I/O; nothing when no subscription is under it."""
        state = self.log.cached
        if state is None or not state.subscriptions or self._nursery is None:
            return
        index, roots = self._roots
        if index != state.index:
            roots = frozenset(sub.root for sub in state.subscriptions.values())
            self._roots = (state.index, roots)
        if any(path.startswith(root + "/") for root in roots):
            self._dirty.add(path)
            self._poke.set()

    async def _waker(self) -> None:
        while True:
            await self._poke.wait()
            self._poke = trio.Event()
            paths, self._dirty = self._dirty, set()
            try:
                for path in sorted(paths):
                    await self._on_change(path)
            except Exception:
                # Never the lane's end: the next append or start wakes again.
                logger.exception("subscriptions: a wake failed")

    async def _on_change(self, path: str) -> None:
        state = await self.log.state()
        for key, sub in list(state.subscriptions.items()):
            rel = relative(sub.root, path)
            if rel is None:
                continue
            link = sub.links.get(rel)
            if sub.pattern is not None and glob_match(sub.pattern, rel):
                live = await self.tail(path) != ZERO
                if live and (link is None or not link.glob):
                    await self.log.write(_linking(key, rel))
                elif not live and link is not None and link.glob:
                    await self.log.write(_unlinking(key, rel))
                    continue
            elif link is None:
                continue
            await self.wake(key)

    async def _ticker(self) -> None:
        seen: set[str] = set()
        while True:
            now = self.now_ms
            due = now + int(TICK_S * 1000)
            try:
                state = await self.log.state()
                for key, sub in list(state.subscriptions.items()):
                    if key not in seen:
                        seen.add(key)
                        await self.wake(key)
                    wake = sub.wake
                    if wake is None:
                        continue
                    if wake.next_attempt_ms is not None:
                        if now >= wake.next_attempt_ms:
                            await self._retry(key, wake.id)
                        else:
                            due = min(due, wake.next_attempt_ms)
                    elif wake.lease_until_ms is not None:
                        if now >= wake.lease_until_ms:
                            await self._expire(key, wake.id)
                        else:
                            due = min(due, wake.lease_until_ms)
                seen &= state.subscriptions.keys()
            except Exception:
                logger.exception("subscriptions: a tick failed (the next one retries)")
            await trio.sleep(max(0.01, (due - now) / 1000))

    async def _expire(self, key: str, wake_id: str) -> None:
        def decide(state: Registry) -> Plan[None]:
            sub = state.subscriptions.get(key)
            wake = sub.wake if sub is not None else None
            if wake is None or wake.id != wake_id or wake.lease_until_ms is None:
                return plan([])
            if self.now_ms < wake.lease_until_ms or wake.next_attempt_ms is not None:
                return plan([])
            return plan([("released", Released(key, wake_id, "lease"))])

        await self.log.write(decide)
        await self.wake(key)

    async def _retry(self, key: str, wake_id: str) -> None:
        def decide(state: Registry) -> Plan[bool]:
            sub = state.subscriptions.get(key)
            wake = sub.wake if sub is not None else None
            if sub is None or wake is None or wake.id != wake_id or wake.next_attempt_ms is None:
                return [], lambda _s: False
            lease = self.now_ms + sub.lease_ttl_ms
            return [("retrying", Retrying(key, wake_id, lease))], lambda _s: True

        if await self.log.write(decide):
            self._spawn_delivery(key, wake_id)

    # -- stream tails and wakes ---------------------------------------------

    async def tail(self, path: str) -> str:
        """The offset after ``path``'s data; :data:`ZERO` when it has none."""
        state = await self.streams.state(path)
        if state.status(self.now_ms) != "live" or (state.tail == 0 and state.fork is None):
            return ZERO
        return state.tail_offset

    async def tails(self, sub: Subscription) -> dict[str, str]:
        return {path: await self.tail(f"{sub.root}/{path}") for path in sub.links}

    async def wake(self, key: str) -> bool:
        """Wake ``key`` if it is idle with pending work; whether it did."""
        state = await self.log.state()
        sub = state.subscriptions.get(key)
        if sub is None or sub.wake is not None:
            return False
        tails = await self.tails(sub)
        pending = [p for p, tail in tails.items() if p in sub.links and tail > sub.links[p].acked]
        if not pending:
            return False
        generation, wake_id = sub.generation + 1, f"w_{secrets.token_hex(12)}"
        if sub.type == "pull-wake":
            await self._wake_event(sub, pending[0], generation)

        def decide(state: Registry) -> Plan[bool]:
            current = state.subscriptions.get(key)
            if current is None or current.wake is not None or current.generation != sub.generation:
                return [], lambda _s: False
            lease = self.now_ms + sub.lease_ttl_ms if sub.type == "webhook" else None
            return [("woke", Woke(key, generation, wake_id, tails, lease))], lambda _s: True

        issued = await self.log.write(decide)
        if issued and sub.type == "webhook":
            self._spawn_delivery(key, wake_id)
        return issued

    async def _wake_event(self, sub: Subscription, stream: str, generation: int) -> None:
        assert sub.wake_stream is not None
        path = f"{sub.root}/{sub.wake_stream}"
        event = {
            "type": "wake",
            "subscription_id": sub.id,
            "stream": stream,
            "generation": generation,
            "ts": self.now_ms,
        }
        append = AppendRequest(json.dumps(event).encode(), "application/json", None, False, None)
        answer = await self.streams.write(path, decide_append(path, append, self.now_ms))
        if answer.status >= 300:
            logger.warning(
                "subscriptions: the wake stream of %r answered %d: %s",
                sub.id,
                answer.status,
                answer.body[:200].decode(errors="replace"),
            )

    def _spawn_delivery(self, key: str, wake_id: str) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._deliver, key, wake_id)

    async def _deliver(self, key: str, wake_id: str) -> None:
        try:
            await self._call_webhook(key, wake_id)
        except Exception:
            # Never the lane's end: the wake's lease brings it back.
            logger.exception("subscriptions: a delivery of %r failed (its lease retries)", key)

    async def _call_webhook(self, key: str, wake_id: str) -> None:
        state = await self.log.state()
        sub = state.subscriptions.get(key)
        wake = sub.wake if sub is not None else None
        if sub is None or wake is None or wake.id != wake_id or sub.webhook_url is None:
            return
        # The cached state moves while the webhook answers: keep what is sent.
        attempts, snapshot = wake.attempts, dict(wake.snapshot)
        signer = await self.signer()
        body = json.dumps(
            {
                "subscription_id": sub.id,
                "wake_id": wake_id,
                "generation": sub.generation,
                "streams": infos(sub, snapshot),
                "callback_url": self.action_url(sub, "callback"),
                "callback_token": signer.token(key, sub.generation, wake_id),
            },
            separators=(",", ":"),
        ).encode()
        status, answer = 0, b""
        try:
            headers = {
                "content-type": "application/json",
                "webhook-signature": signer.signature(body),
            }
            status, answer = await post(
                sub.webhook_url,
                body,
                headers,
                timeout_s=self.webhook_timeout_s,
                local=self.local_webhooks,
            )
        except (
            MissingCrypto,
            WebhookRefused,
            OSError,
            trio.TooSlowError,
            h11.ProtocolError,
        ) as exc:
            logger.info("subscriptions: the webhook of %r failed: %r", sub.id, exc)
        if not 200 <= status < 300:
            backoff = min(RETRY_BASE_MS * 2**attempts, RETRY_MAX_MS)
            next_ms = self.now_ms + int(backoff * random.uniform(0.8, 1.2))
            failed = [("failed", Failed(key, wake_id, next_ms))]
            await self.log.write(lambda s: _if_wake(s, key, wake_id, failed))
            return
        done = _done(answer)
        await self.log.write(_delivered(key, wake_id, snapshot, done))
        if done:
            await self.wake(key)

    # -- the signing key ----------------------------------------------------

    async def signer(self) -> Signer:
        """The lane's signer: ``signing_key=``, or the store's seed (made by
        the first process that needs one)."""
        if self._signer is not None:
            return self._signer

        def decide(state: Registry) -> Plan[bytes]:
            if state.seed is not None:
                return [], _seed
            return [("keyed", Keyed(secrets.token_bytes(32)))], _seed

        self._signer = Signer(await self.log.write(decide))
        return self._signer

    # -- what the routes ask ------------------------------------------------

    def action_url(self, sub: Subscription, action: str) -> str:
        return f"{sub.base_url}{sub.root}/__ds/subscriptions/{quote(sub.id, safe='')}/{action}"

    async def get(self, root: str, sub_id: str) -> Subscription:
        """Raises: SubscriptionError: 404."""
        sub = (await self.log.state()).subscriptions.get(key_of(root, sub_id))
        if sub is None:
            raise missing()
        return sub

    async def create(
        self, root: str, sub_id: str, config: Config, base_url: str
    ) -> tuple[bool, Subscription]:
        """Create ``sub_id`` under ``root``, or re-confirm it (whether it was
        created, and it). Links the explicit streams and the pattern's
        existing streams at their tails.

        Raises:
          SubscriptionError: 409 ``SUBSCRIPTION_ALREADY_EXISTS``.
        """
        key = key_of(root, sub_id)
        digest = config.digest()
        existing = (await self.log.state()).subscriptions.get(key)
        if existing is not None:
            return _confirmed(existing, digest)
        links = {
            path: Link(await self.tail(f"{root}/{path}"), explicit=True) for path in config.streams
        }
        if config.pattern is not None:
            for path in await self._matching(root, config.pattern):
                link = links.setdefault(path, Link(await self.tail(f"{root}/{path}")))
                link.glob = True
        created_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        sub = Subscription(
            sub_id,
            root,
            "webhook" if config.type == "webhook" else "pull-wake",
            digest,
            created_at,
            base_url,
            config.lease_ttl_ms,
            config.pattern,
            list(config.streams),
            config.webhook_url,
            config.wake_stream,
            config.description,
            links,
        )

        def decide(state: Registry) -> Plan[tuple[bool, Subscription]]:
            current = state.subscriptions.get(key)
            if current is not None:
                return [], lambda _s: _confirmed(current, digest)
            return [("subscribed", Subscribed(key, sub))], lambda s: (True, s.subscriptions[key])

        return await self.log.write(decide)

    async def _matching(self, root: str, pattern: str) -> list[str]:
        """The live streams under ``root`` that ``pattern`` matches (at most
        :data:`MAX_BACKFILL`), from the store's listing of sessions."""
        inspection = self.streams.server.store.inspect
        if inspection is None:
            return []
        literal = []
        for segment in pattern.strip("/").split("/"):
            if segment in ("*", "**"):
                break
            literal.append(segment)
        prefix = "/".join([root, *literal])
        store_prefix = f"{STREAMS_CONTRACT.name}\x1f{prefix}"
        found: list[str] = []
        cursor: str | None = None
        while len(found) < MAX_BACKFILL:
            page = await inspection.list_sessions(prefix=store_prefix, limit=500, cursor=cursor)
            for summary in page.sessions:
                path = summary.session_id.split("\x1f", 1)[-1]
                rel = relative(root, path)
                if rel is not None and glob_match(pattern, rel) and await self.tail(path) != ZERO:
                    found.append(rel)
            cursor = page.cursor
            if cursor is None:
                break
        return found[:MAX_BACKFILL]

    async def delete(self, root: str, sub_id: str) -> None:
        key = key_of(root, sub_id)
        await self.log.write(
            lambda s: plan([("unsubscribed", Keyref(key))] if key in s.subscriptions else [])
        )

    async def link(self, root: str, sub_id: str, paths: list[str]) -> None:
        """Raises: SubscriptionError: 404."""
        key = key_of(root, sub_id)
        tails = {path: await self.tail(f"{root}/{path}") for path in paths}

        def decide(state: Registry) -> Plan[None]:
            sub = state.subscriptions.get(key)
            if sub is None:
                raise missing()
            new = {p: t for p, t in tails.items() if not (p in sub.links and sub.links[p].explicit)}
            return plan([("linked", Linked(key, "explicit", new))] if new else [])

        await self.log.write(decide)

    async def unlink(self, root: str, sub_id: str, path: str) -> None:
        """Raises: SubscriptionError: 404."""
        key = key_of(root, sub_id)

        def decide(state: Registry) -> Plan[None]:
            sub = state.subscriptions.get(key)
            if sub is None:
                raise missing()
            link = sub.links.get(path)
            if link is None or not link.explicit:
                return plan([])
            return plan([("unlinked", Unlinked(key, "explicit", path))])

        await self.log.write(decide)


def _delivered(
    key: str, wake_id: str, snapshot: dict[str, str], done: bool
) -> Callable[[Registry], Plan[None]]:
    """A 2xx webhook answer: the wake is delivered; a synchronous ``done``
    acks the tails it was sent and ends it (Section 7.1)."""

    def decide(state: Registry) -> Plan[None]:
        sub = state.subscriptions.get(key)
        wake = sub.wake if sub is not None else None
        if sub is None or wake is None or wake.id != wake_id:
            return plan([])
        events: list[tuple[str, Any]] = []
        if sub.status == "failed" or wake.attempts:
            events.append(("delivered", Delivered(key, wake_id)))
        if done:
            links = sub.links
            offsets = {p: t for p, t in snapshot.items() if p in links and t > links[p].acked}
            events.append(("acked", Acked(key, wake_id, offsets, True)))
        return plan(events)

    return decide


def _linking(key: str, rel: str) -> Callable[[Registry], Plan[None]]:
    # Linked before the append that found it (Section 6.2): its data is pending.
    return lambda state: plan(
        [("linked", Linked(key, "glob", {rel: BEFORE_FIRST}))] if key in state.subscriptions else []
    )


def _unlinking(key: str, rel: str) -> Callable[[Registry], Plan[None]]:
    # A deleted stream leaves the globs that matched it; explicit links stay.
    return lambda state: plan(
        [("unlinked", Unlinked(key, "glob", rel))] if key in state.subscriptions else []
    )


def plan(events: list[tuple[str, Any]]) -> Plan[None]:
    return events, lambda _s: None


def _seed(state: Registry) -> bytes:
    assert state.seed is not None
    return state.seed


def _confirmed(existing: Subscription, digest: str) -> tuple[bool, Subscription]:
    if existing.config_hash != digest:
        raise SubscriptionError(
            409,
            "SUBSCRIPTION_ALREADY_EXISTS",
            "Subscription already exists with different configuration",
        )
    return False, existing


def _if_wake(state: Registry, key: str, wake_id: str, events: list[tuple[str, Any]]) -> Plan[None]:
    sub = state.subscriptions.get(key)
    current = sub is not None and sub.wake is not None and sub.wake.id == wake_id
    return plan(events if current else [])


def infos(sub: Subscription, tails: dict[str, str]) -> list[dict[str, Any]]:
    infos = []
    for path, link in sub.links.items():
        tail = tails.get(path, link.acked if link.acked != BEFORE_FIRST else ZERO)
        infos.append(
            {
                "path": path,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": link.acked,
                "tail_offset": tail,
                "has_pending": tail > link.acked,
            }
        )
    return infos


def _done(answer: bytes) -> bool:
    try:
        parsed = json.loads(answer)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("done") is True
