"""``python -m a2trio.inspect``: the inspect command (:mod:`a2trio.cli.inspect`),
kept at its first path."""

from __future__ import annotations

import sys

from .cli.inspect import load_server, main

__all__ = ["load_server", "main"]

if __name__ == "__main__":
    sys.exit(main())
