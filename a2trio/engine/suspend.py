"""A suspended attempt's release (issue 34): the claim given up without a
failure until the wake time of a durable sleep or wait, with the wait's
wake mark (``docs/durable-handlers.md``; :mod:`.durable` raises the
:class:`~.durable.Suspend` that :mod:`.runs` catches and hands here).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..stores.rules import NEVER_MS
from .attempt import SUPERSEDED, SURRENDERED, SUSPENDED, Outcome

if TYPE_CHECKING:
    from ..stores.base import StoredEvent
    from ..telemetry import Span
    from .abort import AbortSubscription
    from .context import Engine
    from .durable import Suspend

__all__ = ["release"]

#: Suspended attempts (INFO) and releases that failed (WARNING), with the
#: attempt runner's fields (``a2_session``, ``a2_index``, ``a2_attempt``).
logger = logging.getLogger("a2trio.drain")


async def release(
    engine: Engine,
    key: str,
    event: StoredEvent,
    suspend: Suspend,
    span: Span,
    abort: AbortSubscription | None,
) -> Outcome:
    """End a suspended attempt: its claim released without a failure, the
    event not claimable before ``suspend.wake_at_ms``
    (``store.release_attempt``) unless an event of its wake mark lands first
    (the wait's type and, for a handler with ``abort_on``, the abort types:
    an abort settles it at once, not at its wake), and this process's drain
    armed for that instant (other processes' sweeps find it then too). A
    release the store refuses (a newer attempt owns the event) is
    superseded; one that fails surrenders (the claim lapses and a later
    attempt sleeps or waits what is left)."""
    session_id = engine.session_of(key) or key
    fields = {"a2_session": session_id, "a2_index": event.index, "a2_attempt": event.attempt_count}
    now = engine.store.clock.now_ms()
    delay_ms = None if suspend.wake_at_ms is None else max(0, suspend.wake_at_ms - now)
    wake_on = list(suspend.wake_on)
    seen = suspend.seen_through
    try:
        if abort is not None:
            # The abort events the hub has not offered yet (read here, so a
            # predicate that refuses one does not wake the attempt again).
            rows = await engine.store.read(key, after_index=event.index)
            for row in rows:
                abort.offer(row)
            top = rows[-1].index if rows else event.index
            landed = any(r.type in wake_on and r.index > (seen or top) for r in rows)
            if abort.aborted.is_set() or landed:
                delay_ms = 0
            wake_on += [t for t, rule in abort.matcher.items() if rule is not False]
            seen = top
        answer = await engine.store.release_attempt(
            key,
            index=event.index,
            attempt=event.attempt_count,
            delay_ms=delay_ms,
            wake_on=wake_on if delay_ms != 0 else (),
            seen_through=seen,
        )
    except Exception as exc:
        span.record_error(exc)
        span.set_attribute("a2.event.outcome", "surrendered")
        logger.warning(
            "%s #%d of session %r (attempt %d) could not suspend (%s); it is retried once "
            "the claim expires",
            event.type,
            event.index,
            session_id,
            event.attempt_count,
            exc,
            extra=fields,
        )
        return SURRENDERED
    if answer.outcome == "superseded" or answer.not_before_ms is None:
        span.set_attribute("a2.event.outcome", "superseded")
        return SUPERSEDED
    span.set_attribute("a2.event.outcome", "suspended")
    if answer.not_before_ms < NEVER_MS:
        engine.watchdogs.wake(session_id, answer.not_before_ms)
    logger.info(
        "%s #%d of session %r (attempt %d) suspended until %d: %s",
        event.type,
        event.index,
        session_id,
        event.attempt_count,
        answer.not_before_ms,
        suspend.reason,
        extra=fields,
    )
    return SUSPENDED
