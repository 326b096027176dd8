"""``python -m a2trio.serve``: the serve command, kept at its first path.

The command is :mod:`a2trio.cli.serve`; this module re-exports its names, so
``a2trio.serve.guard_hypercorn``, ``a2trio.serve.AccessLog`` and the rest keep
working.
"""

from __future__ import annotations

import sys

from .cli.serve import (
    KEEP_ALIVE_S,
    PREFLIGHT_TIMEOUT_S,
    SHUTDOWN_GRACE_S,
    AccessLog,
    JsonFormatter,
    StartupError,
    TargetError,
    configure_logging,
    guard_hypercorn,
    lanes,
    load_target,
    main,
    stores,
)

__all__ = [
    "KEEP_ALIVE_S",
    "PREFLIGHT_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "AccessLog",
    "JsonFormatter",
    "StartupError",
    "TargetError",
    "configure_logging",
    "guard_hypercorn",
    "lanes",
    "load_target",
    "main",
    "stores",
]

if __name__ == "__main__":
    sys.exit(main())
