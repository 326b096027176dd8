"""What the app transaction backends share (``store.transactions``: the
SQLite and Postgres stores): the check of an app's own statement."""

from __future__ import annotations

import re

__all__ = ["check_statement"]

# A statement that would end (or restart) the block's transaction: `rollback
# to savepoint` and `release` keep it, so they are the app's to use.
_ENDS_TRANSACTION = re.compile(
    r"\s*(commit|end|abort|begin|start|prepare\s+transaction"
    r"|rollback(?!\s+(work\s+|transaction\s+)?to\b))\b",
    re.IGNORECASE,
)


def check_statement(sql: object) -> str:
    """``sql`` if it may run in an app transaction.

    Raises:
      TypeError: it is not a string.
      ValueError: it begins or ends a transaction: the block commits when it
        ends and rolls back when it raises (savepoints are the app's).
    """
    if not isinstance(sql, str):
        raise TypeError(f"sql must be a string, got {sql!r}")
    if _ENDS_TRANSACTION.match(sql):
        raise ValueError(
            f"{sql.strip()[:40]!r} begins or ends a transaction: the block commits when"
            " it ends and rolls back when it raises (savepoints work inside it)"
        )
    return sql
