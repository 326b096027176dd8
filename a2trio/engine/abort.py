"""The abort hub: ``abort_on`` matching, delivered as cancellation.

Theory of operation. A handler registered with ``abort_on`` runs inside an
*abort scope* (see :mod:`a2trio.engine.drain`). One hub per drain follows the
session's log from the earliest active trigger and, for every event whose type
some subscription watches, asks each matching subscription's predicate; a match
sets ``ctx.aborted`` and cancels that handler's abort scope with the reason
``"aborted by <event id>"``.

No event is missed between a handler's start and the hub's position:
a subscription is registered first (synchronously), then reads the log after
its trigger once (*catch-up*). Anything the hub's feed reaches later is
dispatched to it live; anything the feed had already passed is in the catch-up
read. An abort event appended before the handler even started therefore still
aborts it.

A failure of the hub's feed (or of a predicate) is never swallowed: it aborts
every subscribed handler and becomes the error of their attempts, which then
record a failure and are retried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from ..contract import Event, EventType
from ..stores.base import Store, StoredEvent

__all__ = [
    "AbortHub",
    "AbortMatcher",
    "AbortOn",
    "AbortPredicate",
    "AbortSubscription",
    "abort_matcher",
]

#: type -> True (any event of the type aborts) or a predicate
#: ``(event, trigger, {"attempt": n}) -> bool``.
AbortPredicate = Callable[[Event[Any], Event[Any], dict[str, int]], bool]
#: ``abort_on=``: event types (names or handles), or a mapping of them to
#: ``True`` or a predicate.
AbortOn = (
    Sequence[str | EventType[Any]] | Mapping[str | EventType[Any], bool | AbortPredicate] | None
)
AbortMatcher = Mapping[str, "bool | Callable[[Event[Any], Event[Any], dict[str, int]], bool]"]


class AbortSubscription:
    """One running handler's interest in abort events."""

    def __init__(
        self,
        hub: AbortHub,
        trigger: StoredEvent,
        matcher: AbortMatcher,
        attempt: int,
        scope: trio.CancelScope,
        aborted: trio.Event,
    ) -> None:
        self._hub = hub
        self.trigger = trigger
        self.matcher = matcher
        self.attempt = attempt
        self.scope = scope
        self.aborted = aborted
        self.error: BaseException | None = None
        self._public_trigger: Event[Any] | None = None

    def offer(self, event: StoredEvent) -> None:
        """Abort the handler if ``event`` matches (idempotent)."""
        if self.aborted.is_set() or event.index <= self.trigger.index:
            return
        rule = self.matcher.get(event.type)
        if rule is None or rule is False:
            return
        if rule is not True:
            to_public = self._hub.to_public
            if self._public_trigger is None:
                self._public_trigger = to_public(self.trigger)
            try:
                matched = rule(to_public(event), self._public_trigger, {"attempt": self.attempt})
            except Exception as exc:
                self.fail(exc)
                return
            if not matched:
                return
        self.aborted.set()
        self.scope.cancel(reason=f"aborted by {event.id}")

    def fail(self, error: BaseException) -> None:
        """Abort the handler because the hub cannot watch for it any longer."""
        if self.error is None:
            self.error = error
        self.aborted.set()
        self.scope.cancel(reason=f"abort hub failed: {error!r}")

    async def catch_up(self) -> None:
        """Offer every event already in the log after the trigger."""
        for event in await self._hub.store.read(self._hub.key, after_index=self.trigger.index):
            self.offer(event)

    def close(self) -> None:
        """The handler has ended: stop watching for it."""
        self._hub.unsubscribe(self)


class AbortHub:
    """Follows one session for the abort subscriptions of one drain.

    The hub's feed task lives in the drain's nursery; it starts with the first
    subscription and stops when the last one closes.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        nursery: trio.Nursery,
        to_public: Callable[[StoredEvent], Event[Any]],
    ) -> None:
        self.store = store
        self.key = key
        self.to_public = to_public
        self._nursery = nursery
        self._subscriptions: set[AbortSubscription] = set()
        self._scope: trio.CancelScope | None = None

    def subscribe(
        self,
        trigger: StoredEvent,
        matcher: AbortMatcher,
        attempt: int,
        scope: trio.CancelScope,
        aborted: trio.Event,
    ) -> AbortSubscription:
        """Register a handler; call :meth:`AbortSubscription.catch_up` next."""
        subscription = AbortSubscription(self, trigger, matcher, attempt, scope, aborted)
        self._subscriptions.add(subscription)
        if self._scope is None:
            self._scope = trio.CancelScope()
            self._nursery.start_soon(self._follow, self._scope, trigger.index)
        return subscription

    def unsubscribe(self, subscription: AbortSubscription) -> None:
        """Forget ``subscription``; the last one out stops the hub's feed."""
        self._subscriptions.discard(subscription)
        if not self._subscriptions and self._scope is not None:
            self._scope.cancel(reason="no abort subscriptions left")
            self._scope = None

    async def _follow(self, scope: trio.CancelScope, start_after: int) -> None:
        with scope:
            try:
                async with self.store.stream(self.key, start_after=start_after) as feed:
                    async for event in feed:
                        for subscription in list(self._subscriptions):
                            subscription.offer(event)
            except Exception as exc:
                for subscription in list(self._subscriptions):
                    subscription.fail(exc)
            else:
                closed = RuntimeError("the abort hub's feed ended while handlers were active")
                for subscription in list(self._subscriptions):
                    subscription.fail(closed)
            if self._scope is scope:
                self._scope = None


def abort_matcher(abort_on: AbortOn) -> dict[str, bool | AbortPredicate] | None:
    """``abort_on=`` as the matcher :class:`AbortHub` reads (None: none).

    Raises:
      TypeError: a bad shape (a string, a rule that is neither ``True`` nor
        a predicate)."""
    if abort_on is None:
        return None
    if isinstance(abort_on, Mapping):
        matcher: dict[str, bool | AbortPredicate] = {}
        for key, rule in abort_on.items():
            name = key.name if isinstance(key, EventType) else key
            if rule is not True and rule is not False and not callable(rule):
                raise TypeError(f"abort_on[{name!r}] must be True or a predicate, got {rule!r}")
            if rule is not False:
                matcher[name] = rule
        return matcher or None
    if isinstance(abort_on, str):
        raise TypeError(f"abort_on must be a list of types, not the string {abort_on!r}")
    return (
        dict.fromkeys((key.name if isinstance(key, EventType) else key for key in abort_on), True)
        or None
    )
