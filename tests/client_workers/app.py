"""A notes app with no handlers: every event in its log is one the test pushed.

Served by ``python -m a2trio.serve tests.client_workers.app:server --store ...``.
"""

from __future__ import annotations

import msgspec

import a2trio


class Note(msgspec.Struct, frozen=True):
    n: int


notes = a2trio.contract("notes", events={"note": Note}, presence={"typing": bool})

#: No store: ``--store`` (``A2_STORE``) picks it.
server = a2trio.Server(notes)
