"""``python -m a2trio`` and the ``a2trio`` console command (``pyproject.toml``
names this module's ``main``): the dispatcher of :mod:`a2trio.cli`."""

from __future__ import annotations

import sys

from .cli import COMMANDS, main

__all__ = ["COMMANDS", "main"]

if __name__ == "__main__":
    sys.exit(main())
