"""The contract the multi-process test's processes share."""

from __future__ import annotations

import msgspec

import a2trio


class Job(msgspec.Struct, frozen=True):
    n: int
    stall: bool = False


class Done(msgspec.Struct, frozen=True):
    job: str


jobs = a2trio.contract("jobs", events={"job": Job, "done": Done})

#: Sessions the writers spread their events over.
SESSIONS = [f"s{n:02d}" for n in range(50)]


def store_key(session_id: str) -> str:
    """The store's key for a session of ``jobs`` (the server's namespacing)."""
    return f"{jobs.name}\x1f{session_id}"
