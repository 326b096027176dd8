"""``python -m a2trio.new NAME``: the new command (:mod:`a2trio.cli.new`),
kept at its first path."""

from __future__ import annotations

import sys

from .cli.new import main, write_project

__all__ = ["main", "write_project"]

if __name__ == "__main__":
    sys.exit(main())
