"""Profile a server subprocess with py-spy while a bench drives it.

``py-spy`` (the ``bench`` extra) samples another process from outside, so
the server runs unmodified. :func:`recording` wraps the timed part of a
bench; :func:`summary` reads the raw (collapsed) stacks back and lists the
frames that hold the most samples, by self time and inclusive time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio


@asynccontextmanager
async def recording(pid: int, out: Path | None, rate: int = 250) -> AsyncIterator[None]:
    """Sample ``pid`` into ``out`` (raw collapsed stacks) for the block's duration."""
    if out is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out.parent.mkdir(parents=True, exist_ok=True)
    process = await trio.lowlevel.open_process(
        [exe, "record", "--pid", str(pid), "--format", "raw", "-r", str(rate), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await trio.sleep(0.5)  # py-spy attaches before the timed part starts
    try:
        yield
    finally:
        process.send_signal(2)  # SIGINT: py-spy writes its file and exits
        with trio.move_on_after(10):
            await process.wait()


def summary(path: Path, top: int = 15) -> str:
    """The ``top`` frames by self and by inclusive samples, as percentages."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{path}: {total} samples", "  self:"]
    lines += [f"    {100 * n / total:5.1f}%  {f[:110]}" for f, n in own.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"    {100 * n / total:5.1f}%  {f[:110]}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)
