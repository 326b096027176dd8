"""The contract and timings shared by the writer and the worker processes."""

from __future__ import annotations

import msgspec

import a2trio


class Job(msgspec.Struct, frozen=True):
    n: int


class Done(msgspec.Struct, frozen=True):
    n: int
    pid: int


jobs = a2trio.contract("jobs", events={"job": Job, "slow": Job, "done": Done})

#: Short leases so a SIGKILLed worker's claim lapses within seconds, and a
#: heartbeat a third of the ttl so a loaded machine still renews in time.
TIMINGS = a2trio.Timings(claim_ttl_s=3.0, heartbeat_s=1.0)

#: Where the worker that runs the first attempt of a ``slow`` job writes its pid.
VICTIM_FILE = "victim.pid"
