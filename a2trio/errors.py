"""The one error family a caller can act on.

Every failure a caller can do something about is an :class:`A2Error` with a
:class:`ErrorCode`. Programmer errors (a bad session id, bad bounds, a handler
for an undeclared type) are plain :class:`TypeError` / :class:`ValueError`,
raised before anything is written.

============================== ==========================================================
code                           meaning
============================== ==========================================================
``INVALID_PAYLOAD``            a payload or presence value failed its msgspec schema
``FORBIDDEN``                  ``authorize`` or ``validate_push`` refused the operation
``UNKNOWN_EVENT_TYPE``         the contract declares no such event type
``PARTIAL_DUPLICATE_BATCH``    a batch mixes stored and fresh ids, or reuses a foreign id
``SUPERSEDED_ATTEMPT``         a newer attempt owns the triggering event (the fence)
``CLAIM_EXPIRED``              the local lease estimate lapsed without renewal
``STORE_UNAVAILABLE``          the backend failed; the original is ``__cause__``
``STORE_NOT_CONFIGURED``       ``A2_ENV=production`` and no store was given
``UNKNOWN_PRESENCE_FIELD``     the contract declares no such presence field
``PRESENCE_NOT_SUPPORTED``     the store has no presence capability
``TRANSACTIONS_NOT_SUPPORTED`` the store has no app transactions (``Server.transaction``)
``INDEX_CONFLICT``             a conditional append found the log past its expected index
``CALL_REFUSED``               an actor's call refused (:class:`a2trio.Refused`)
``TRIMMED``                    a read started below the session's trim point
============================== ==========================================================

HTTP statuses for these codes live in one table, ``a2trio.transport.wire``.

:class:`SqlError` is the one exception of an app's own SQL statements in an
app transaction (``Server.transaction``): the database refused the statement.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import TracebackType
from typing import Any

import trio

__all__ = ["A2Error", "ErrorCode", "SqlError", "store_unavailable"]


class ErrorCode(enum.StrEnum):
    """The seed's ten error codes, the actors' two, the app transaction's one
    and retention's one (``TRIMMED``), spelled as on the wire."""

    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    FORBIDDEN = "FORBIDDEN"
    UNKNOWN_EVENT_TYPE = "UNKNOWN_EVENT_TYPE"
    PARTIAL_DUPLICATE_BATCH = "PARTIAL_DUPLICATE_BATCH"
    SUPERSEDED_ATTEMPT = "SUPERSEDED_ATTEMPT"
    CLAIM_EXPIRED = "CLAIM_EXPIRED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    STORE_NOT_CONFIGURED = "STORE_NOT_CONFIGURED"
    UNKNOWN_PRESENCE_FIELD = "UNKNOWN_PRESENCE_FIELD"
    PRESENCE_NOT_SUPPORTED = "PRESENCE_NOT_SUPPORTED"
    TRANSACTIONS_NOT_SUPPORTED = "TRANSACTIONS_NOT_SUPPORTED"
    INDEX_CONFLICT = "INDEX_CONFLICT"
    CALL_REFUSED = "CALL_REFUSED"
    TRIMMED = "TRIMMED"


class A2Error(Exception):
    """An error a caller can act on, identified by its :attr:`code`.

    Args:
      code: one of :class:`ErrorCode` (a plain string naming one is accepted).
      message: a sentence naming the bad value and, where there is one, the fix.
      details: structured detail, e.g. msgspec's message and JSON path for
        ``INVALID_PAYLOAD``. Must be JSON-encodable: it travels in the wire
        envelope.
    """

    code: ErrorCode
    message: str
    details: Any

    def __init__(self, code: ErrorCode | str, message: str, details: Any = None) -> None:
        self.code = ErrorCode(code)
        self.message = message
        self.details = details
        super().__init__(f"{self.code}: {message}")

    def __repr__(self) -> str:
        return f"A2Error({self.code.value!r}, {self.message!r})"


class SqlError(Exception):
    """The database refused one of the app's own statements in an app
    transaction (:meth:`a2trio.Transaction.execute`, ``fetch``), or the
    transaction could not commit what the block did.

    Attributes:
      code: Postgres's SQLSTATE (``"23505"``: a unique violation), or SQLite's
        error name (``"SQLITE_CONSTRAINT_PRIMARYKEY"``).
      message: the database's message. The driver's exception is ``__cause__``.

    On Postgres a refused statement aborts the transaction: until a
    ``rollback to savepoint``, every later statement fails, and the block
    rolls back when it ends (a block that swallowed the error raises this
    again at its end, with code ``25P02``: nothing was committed).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


class store_unavailable:
    """Translate any backend failure inside the block into ``STORE_UNAVAILABLE``.

    Each backend store's one error point returns one of these: every public
    method of a store and of its capabilities raises through it, so the
    engine passes a store's errors on as they are and never translates them
    again (``UNREACHABLE_CHECKS`` in :mod:`a2trio.stores.conformance` hold
    each backend to it).

    ``A2Error``, ``TypeError`` and ``ValueError`` pass through unchanged: they
    are verdicts (a fence, a duplicate batch) or programmer errors, not outages.
    Trio's ``Cancelled`` is a ``BaseException`` and is never caught. A class,
    not a generator: it wraps every store call on the hot path.

    An exception group (a driver's or the store's own task group) is judged by
    what it holds besides cancellations: nothing, and it passes through (a
    cancellation); one verdict, and that is raised; otherwise it is one
    ``STORE_UNAVAILABLE`` with the group as ``__cause__``. Its errors beat a
    cancellation it also holds, as they do in a Trio nursery: a driver whose
    tasks failed while the caller was cancelled never lets a bare driver error
    out (once the caller's cancel scope drops the ``Cancelled`` from the group).

    The message names the operation only: the failure (a host, a port, driver
    or server text, SQL) stays in ``__cause__`` and in the logs, never in what
    a client is answered.

    Args:
      what: the operation, for the message (``"append"``).
      permanent: a store's classifier of failures that will fail again
        whatever the retry (the data itself is refused): those raise
        ``INVALID_PAYLOAD`` instead, so clients that retry on 503 do not retry
        them forever. Each store has one.
    """

    __slots__ = ("permanent", "what")

    def __init__(self, what: str, permanent: Callable[[Exception], bool] | None = None) -> None:
        self.what = what
        self.permanent = permanent

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        error: BaseException = exc
        if isinstance(exc, BaseExceptionGroup):
            _, failed = exc.split(trio.Cancelled)
            if failed is None:
                return
            leaves = _leaves(failed)
            if not all(isinstance(leaf, Exception) for leaf in leaves):
                return  # a KeyboardInterrupt, a SystemExit: not ours to judge
            if len(leaves) == 1:
                error = leaves[0]
        elif not isinstance(exc, Exception):
            return
        if isinstance(error, A2Error | TypeError | ValueError):
            if error is exc:
                return
            raise error
        if self.permanent is not None and isinstance(error, Exception) and self.permanent(error):
            raise A2Error(
                ErrorCode.INVALID_PAYLOAD, f"{self.what} failed: the store refused the data"
            ) from exc
        raise A2Error(
            ErrorCode.STORE_UNAVAILABLE, f"{self.what} failed: the store is unavailable"
        ) from exc


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


A2Error.__module__ = "a2trio"
ErrorCode.__module__ = "a2trio"
