"""Retention: a long session trimmed below its snapshot, a closed one
archived to a file, a user's one erased (``docs/operations.md``,
"Retention")::

    python examples/retention.py      # a SQLite file in a temporary folder

The output, the same on every run::

    state: 100 points through index 100
    trimmed through index 99: 99 events removed
    state after the trim: 101 points through index 101
    history from the start: TRIMMED (trimmed through 99)
    history after the trim point: [100, 101]
    archived: 3 events; the file's first line has sessionId game-2, index 3
    erased: 2 events, 1 presence rows; history now: []
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import msgspec
import trio

import a2trio
from a2trio.stores.sqlite import sqlite

__all__ = ["Cursor", "Scored", "main", "points", "scores"]


class Scored(msgspec.Struct, frozen=True):
    points: int


class Cursor(msgspec.Struct, frozen=True):
    x: int


scores = a2trio.contract("scores", events={"scored": Scored}, presence={"cursor": Cursor})


def _add(total: int, event: a2trio.Event[Scored]) -> int:
    return total + event.payload.points


points = a2trio.Reducer("points", 0, _add)


async def main(store: a2trio.Store, folder: Path) -> None:
    """Three sessions, one per retention operation."""
    async with a2trio.Server(scores, store=store) as server:
        # A long game: its state is cached as a snapshot, then the events
        # the snapshot covers are trimmed (the last one always stays).
        game = server.session("game-1")
        for _ in range(100):
            await game.append(scores.event("scored", Scored(1)))
        total, index = await game.state(points)
        print(f"state: {total} points through index {index}")
        await server.settle()  # the snapshot's write-back
        trimmed = await server.retention.trim("game-1", points, by="ops", reason="compact")
        print(f"trimmed through index {trimmed.through_index}: {trimmed.events} events removed")
        await game.append(scores.event("scored", Scored(1)))
        total, index = await game.state(points)
        print(f"state after the trim: {total} points through index {index}")
        try:
            await game.history()
        except a2trio.A2Error as exc:
            through = exc.details["trimmedThrough"]
            print(f"history from the start: {exc.code} (trimmed through {through})")
        print("history after the trim point:", [e.index for e in await game.history(gte=100)])

        # A finished game: exported to a new file, then erased.
        done = server.session("game-2")
        await done.append(*(scores.event("scored", Scored(n)) for n in (1, 2, 3)))
        target = folder / "game-2.jsonl"
        archived = await server.retention.archive("game-2", target, by="ops", reason="closed")
        first = json.loads(target.read_text().splitlines()[0])
        head = f"sessionId {first['sessionId']}, index {first['index']}"
        print(f"archived: {archived.events} events; the file's first line has {head}")

        # A player who asked to be forgotten: everything of the session goes.
        player = server.session("player-7")
        await player.append(scores.event("scored", Scored(5)), scores.event("scored", Scored(6)))
        await player.set_presence("p7", {"cursor": Cursor(3)})
        erased = await server.retention.erase("player-7", by="ops", reason="erasure request")
        removed = f"{erased.events} events, {erased.presence} presence rows"
        print(f"erased: {removed}; history now: {await player.history()}")


async def _run() -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with sqlite(str(Path(folder) / "scores.db")) as store:
            await main(store, Path(folder))


if __name__ == "__main__":
    trio.run(_run)
