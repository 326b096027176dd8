"""The mailbox of one background drain.

The write path does not start a second drain for a session that has one: it
wakes the running drain (:meth:`DrainSignal.notify`), or hands it the events
an append claimed for it (:meth:`DrainSignal.adopt`). The registry
(``drains.py``) keeps one signal per running drain; the drain reads it and,
while it runs, listens to it (:class:`Listener`). Only the signal's methods
change it.

A handed-over claim is started at once, from the appending task: the signal
calls :meth:`Listener.take_adopted`, so the handler's task is started in the
drain's nursery one scheduler pass sooner than if the drain's own task woke
to start it (and a claim round trip sooner if that task is waiting on the
store). That call is the one place the write path reaches into a drain, and
the reason this is a listener rather than a queue the drain polls.
"""

from __future__ import annotations

import uuid
from typing import Protocol

import msgspec

from ..stores.base import StoredEvent

__all__ = ["Adopted", "DrainSignal", "Listener"]


class Adopted(msgspec.Struct, frozen=True):
    """Events an append claimed for a drain, with that claim's lease window."""

    holder: str
    events: list[StoredEvent]
    expires_at: float
    watchdog_at_ms: int


class Listener(Protocol):
    """The running drain, as its mailbox tells it what arrived."""

    def poke(self) -> None:
        """Something changed: look again before deciding anything."""
        ...

    def take_adopted(self) -> bool:
        """Start the events handed over so far (:meth:`DrainSignal.take`)."""
        ...


class DrainSignal:
    """The mailbox of one background drain: the write path wakes it instead of
    starting a second one, and hands it events claimed elsewhere (an append's
    own claim). Only its methods change it.

    ``holder`` is the drain's claim holder, known before the drain starts so an
    append can claim for it; appends that do are bracketed by
    :meth:`begin_append` and :meth:`appended` (the drain waits for their answer
    rather than end or claim against them).
    """

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder or str(uuid.uuid4())
        self._version = 0
        self._closed = False
        self._adopted: list[Adopted] = []
        self._appending = 0
        self._listener: Listener | None = None

    @property
    def closed(self) -> bool:
        """The drain has finished: wake or hand work to a new one."""
        return self._closed

    @property
    def version(self) -> int:
        """How often the drain was woken: it claims again when this moved."""
        return self._version

    @property
    def appending(self) -> bool:
        """Appends that claim for this drain are in flight."""
        return self._appending > 0

    def listen(self, drain: Listener) -> None:
        """Tell ``drain`` (the running one) of wake-ups and handed-over claims."""
        self._listener = drain

    def take(self) -> list[Adopted]:
        """The claims handed over since the last call."""
        adopted, self._adopted = self._adopted, []
        return adopted

    def close(self) -> None:
        """Mark the drain finished (idempotent)."""
        self._closed = True
        self._listener = None

    def begin_append(self) -> None:
        """An append is claiming for this drain: its answer is coming."""
        self._appending += 1

    def appended(self) -> None:
        """An append that claimed for this drain has its answer (or failed)."""
        self._appending -= 1
        if self._listener is not None:
            self._listener.poke()

    def notify(self) -> None:
        """Something may be claimable: claim again before ending."""
        self._version += 1
        if self._listener is not None:
            self._listener.poke()

    def adopt(
        self, holder: str, events: list[StoredEvent], expires_at: float, watchdog_at_ms: int
    ) -> None:
        """Run ``events``, already claimed by ``holder``, as if this drain had
        claimed them (no further claim is needed for them)."""
        self._adopted.append(Adopted(holder, events, expires_at, watchdog_at_ms))
        if self._listener is not None:
            # Started from here, not from the drain's loop: one scheduler pass
            # sooner to the handler.
            self._listener.take_adopted()
