"""The Redis store's claims: the drain's side of the store.

Claiming the eligible set, renewing claims, recording a failure or a
release (the verdict is ``rules.fail_verdict`` or ``rules.release_verdict``
itself, written back by a compare-and-set script), and the sweep of the
sessions with claimable work.
:class:`~a2trio.stores.redis.RedisStore`'s methods of the same names call
these; the sweep is the store's ``store.sweep``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import trio

from ...errors import A2Error, ErrorCode
from .. import rules as verdicts
from ..base import (
    Busy,
    Claimed,
    ClaimRef,
    ClaimResult,
    FailResult,
    ReleaseResult,
    RenewResult,
    Settled,
)
from . import codec
from . import scripts as lua
from .conn import errors
from .scripts import CAS_ROUNDS, SWEEP_PAGE

if TYPE_CHECKING:
    from ...clock import Clock
    from .codec import Keys
    from .conn import Connection

__all__ = ["RedisClaims"]


class RedisClaims:
    """Args: ``conn``, the store's command client; ``keys``, its key names;
    ``clock``, its clock (claim and failure times)."""

    def __init__(self, conn: Connection, keys: Keys, clock: Clock) -> None:
        self._conn = conn
        self._keys = keys
        self._clock = clock

    async def claim_available(
        self,
        session_id: str,
        *,
        holder: str,
        ttl_ms: int,
        expires_at_ms: int | None = None,
        exclude: Sequence[int] = (),
        limit: int | None = None,
    ) -> ClaimResult:
        """``CLAIM``: the eligible set claimed, or ``Busy`` until the next is
        due, or ``Settled``."""
        with errors("claim"):
            now = self._clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            reply = await self._conn.run(
                lua.CLAIM,
                self._keys.session_keys(session_id),
                [
                    now,
                    holder,
                    expires_at,
                    -1 if limit is None else max(0, limit),
                    self._keys.flow_prefix,
                    self._keys.throttle_prefix,
                    *exclude,
                ],
            )
        if reply[0] == b"claimed":
            waiting, throttled = _keys(reply[1]), _keys(reply[2])
            rows = sorted(codec.rows(session_id, reply[3:]), key=lambda row: row.index)
            return Claimed(rows, waiting, throttled)
        if reply[0] == b"busy":
            return Busy(int(reply[1]), _keys(reply[2]), _keys(reply[3]))
        return Settled()

    async def claimable_sessions(self, prefix: str, *, limit: int) -> list[str]:
        """See :meth:`~a2trio.stores.base.SweepsClaimable.claimable_sessions`:
        a pass over the sessions with open events (``P:open-sessions``, by
        prefix), a page of them checked by each ``SWEEP`` script, never the
        history.

        Cancellation: a read.
        """
        found: list[str] = []
        low = b"[" + prefix.encode()
        high = b"(" + prefix.encode() + b"\xff"
        with errors("sweep"):
            while len(found) < limit:
                page = [
                    codec.text(sid)
                    for sid in await self._conn.run(
                        lua.LIST, [self._keys.global_key("open-sessions")], [low, high, SWEEP_PAGE]
                    )
                ]
                if not page:
                    break
                keys = [self._keys.key(sid, s) for sid in page for s in ("open", "meta")]
                flags = await self._conn.run(
                    lua.SWEEP,
                    keys,
                    [self._clock.now_ms(), self._keys.flow_prefix, self._keys.throttle_prefix],
                )
                found += [sid for sid, flag in zip(page, flags, strict=True) if flag]
                if len(page) < SWEEP_PAGE:
                    break
                low = b"(" + page[-1].encode()
        return found[:limit]

    async def renew_claims(
        self,
        session_id: str,
        *,
        holder: str,
        claims: Sequence[ClaimRef],
        ttl_ms: int,
        expires_at_ms: int | None = None,
    ) -> RenewResult:
        """``RENEW``: this holder's live claims extended; the others reported superseded."""
        if not claims:
            await trio.lowlevel.checkpoint()
            return RenewResult([], [])
        with errors("renew"):
            now = self._clock.now_ms()
            expires_at = now + ttl_ms if expires_at_ms is None else expires_at_ms
            pairs = [value for c in claims for value in (c.index, c.attempt)]
            renewed, superseded = await self._conn.run(
                lua.RENEW,
                self._keys.session_keys(session_id),
                [now, holder, expires_at, self._keys.flow_prefix, *pairs],
            )
        return RenewResult(sorted(int(i) for i in renewed), sorted(int(i) for i in superseded))

    async def fail_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        error: str,
        max_failures: int,
        retry_after_ms: int | None = None,
    ) -> FailResult:
        """``rules.fail_verdict`` over the row as read, written back by
        ``FAIL_WRITE`` only if the row is unchanged, with the failed attempt
        (``P:S:failures``); read again if it moved (``CAS_ROUNDS`` times at
        most)."""
        with errors("fail"):
            for _ in range(CAS_ROUNDS):
                raw, row = await self._read_meta(session_id, index)
                verdict = verdicts.fail_verdict(row, attempt, max_failures)
                if not verdict.record:
                    return verdict.result
                now = self._clock.now_ms()
                dead = verdict.result.outcome == "dead_lettered"
                retry_at = None if dead or retry_after_ms is None else now + retry_after_ms
                failed = msgspec.structs.replace(
                    row,
                    failure_count=verdict.result.failure_count,
                    last_error=error,
                    last_failed_at_ms=now,
                    last_failed_attempt=attempt,
                    failed_at_ms=now if dead else row.failed_at_ms,
                    claim_holder=None,
                    claim_expires_at_ms=None,
                    not_before_ms=retry_at,
                    wake_on=None,
                )
                assert row.claim_holder is not None  # rules.holds_claim
                history = codec.Failure(
                    attempt, error, now, row.claim_holder, row.last_claimed_at_ms
                )
                if await self._write_meta(
                    session_id, index, raw, failed, dead=dead, failure=history
                ):
                    return FailResult(verdict.result.outcome, failed.failure_count, retry_at)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, "fail failed: the event's row kept changing under it"
        )

    async def release_attempt(
        self,
        session_id: str,
        *,
        index: int,
        attempt: int,
        delay_ms: int | None,
        wake_on: Sequence[str] = (),
        seen_through: int | None = None,
    ) -> ReleaseResult:
        """``rules.release_verdict`` over the row as read, written back as a
        failure is (compare-and-set, ``CAS_ROUNDS`` times at most); with a
        wake mark by ``RELEASE_MARK`` (its ``rules.wakes`` check too)."""
        with errors("release"):
            for _ in range(CAS_ROUNDS):
                raw, row = await self._read_meta(session_id, index)
                if verdicts.release_verdict(row, attempt) == "superseded":
                    return ReleaseResult("superseded")
                now = self._clock.now_ms()
                not_before = verdicts.NEVER_MS if delay_ms is None else now + delay_ms
                released = msgspec.structs.replace(
                    row,
                    claim_holder=None,
                    claim_expires_at_ms=None,
                    not_before_ms=not_before,
                    wake_on=None,
                )
                if wake_on:
                    stored = await self._mark(
                        session_id, index, raw, released, wake_on, seen_through, now
                    )
                    if stored is not None:
                        return ReleaseResult("released", stored)
                elif await self._write_meta(session_id, index, raw, released, dead=False):
                    return ReleaseResult("released", not_before)
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, "release failed: the event's row kept changing under it"
        )

    async def _mark(
        self,
        session_id: str,
        index: int,
        raw: bytes | None,
        meta: codec.Meta,
        wake_on: Sequence[str],
        seen_through: int | None,
        now: int,
    ) -> int | None:
        """``RELEASE_MARK``: the not-before stored, or None if the row moved."""
        keys = self._keys.session_keys(session_id)
        if meta.concurrency_key is not None:
            keys.append(self._keys.flow_prefix + meta.concurrency_key)
        through = "" if seen_through is None else seen_through
        args = [index, raw, codec.encode(meta), through, codec.encode(list(wake_on)), now]
        reply = await self._conn.run(lua.RELEASE_MARK, keys, args)
        return int(reply[1]) if int(reply[0]) else None

    async def _read_meta(self, session_id: str, index: int) -> tuple[bytes | None, codec.Meta]:
        """``FAIL_READ``: the event's meta as stored and decoded (a settled
        event's: ``codec.SETTLED``).

        Raises:
          ValueError: no event at ``index``."""
        front, raw = await self._conn.run(
            lua.FAIL_READ, self._keys.session_keys(session_id), [index]
        )
        if not 1 <= index <= int(front):
            raise verdicts.no_event(session_id, index)
        return raw, codec.SETTLED if raw is None else codec.decode_meta(raw)

    async def _write_meta(
        self,
        session_id: str,
        index: int,
        raw: bytes | None,
        meta: codec.Meta,
        *,
        dead: bool,
        failure: codec.Failure | None = None,
    ) -> bool:
        """``FAIL_WRITE``: ``meta`` written if the row is still ``raw``, and
        the ``failure`` appended to the event's failed attempts with it; a
        keyed row's claim leaves its key's set (its slot frees)."""
        keys = [self._keys.key(session_id, s) for s in ("meta", "open", "head", "failures")]
        if meta.concurrency_key is not None:
            keys.append(self._keys.flow_prefix + meta.concurrency_key)
        args = [index, raw, codec.encode(meta), "1" if dead else "0"]
        if failure is not None:
            args.append(codec.encode(failure))
        return bool(await self._conn.run(lua.FAIL_WRITE, keys, args))


def _keys(reply: Sequence[bytes]) -> list[str]:
    return [codec.text(key) for key in reply]
