"""The columns of one event row that the rules read, one protocol per rule.

A backend passes its own row type (a dataclass, a decoded record, a
``StoredEvent``): anything with these attributes.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "ActionTarget",
    "Bookkeeping",
    "Claim",
    "Completion",
    "Debounced",
    "Dispatch",
    "Laned",
    "Retrying",
]


class Bookkeeping(Protocol):
    """The dispatch columns of one event row that the attempt fences read."""

    @property
    def processed_at_ms(self) -> int | None: ...
    @property
    def failed_at_ms(self) -> int | None: ...
    @property
    def attempt_count(self) -> int: ...
    @property
    def claim_holder(self) -> str | None: ...
    @property
    def failure_count(self) -> int: ...
    @property
    def last_failed_attempt(self) -> int | None: ...


class Dispatch(Protocol):
    """The columns the claim rules read."""

    @property
    def processed_at_ms(self) -> int | None: ...
    @property
    def failed_at_ms(self) -> int | None: ...
    @property
    def lane_ready(self) -> bool: ...
    @property
    def claim_expires_at_ms(self) -> int | None: ...
    @property
    def not_before_ms(self) -> int | None: ...


class Retrying(Dispatch, Protocol):
    """The columns the sweep reads: the claim rules' and the backoff's."""

    @property
    def failure_count(self) -> int: ...
    @property
    def last_failed_at_ms(self) -> int | None: ...


class Debounced(Protocol):
    """The columns a debounced append reads of an earlier row."""

    @property
    def type(self) -> str: ...
    @property
    def debounce_key(self) -> str | None: ...
    @property
    def processed_at_ms(self) -> int | None: ...
    @property
    def failed_at_ms(self) -> int | None: ...
    @property
    def claim_expires_at_ms(self) -> int | None: ...


class Laned(Protocol):
    """The columns of the lane rules."""

    @property
    def lane(self) -> str | None: ...
    @property
    def lane_ready(self) -> bool: ...


class Claim(Bookkeeping, Protocol):
    """The columns the renewal reads."""

    @property
    def claim_expires_at_ms(self) -> int | None: ...


class Completion(Bookkeeping, Protocol):
    """The columns the completion fence reads."""

    @property
    def processed_by_attempt(self) -> int | None: ...
    @property
    def returned_event_ids(self) -> list[str] | None: ...


class ActionTarget(Bookkeeping, Protocol):
    """The columns an operator action's fence reads."""

    @property
    def claim_expires_at_ms(self) -> int | None: ...
