"""Regression guard: compare a benchmark run with the figures recorded in the docs.

    .venv/bin/python bench/regress.py                       # re-run every recorded benchmark
    .venv/bin/python bench/regress.py --only scheduler      # one of them
    .venv/bin/python bench/regress.py --from scheduler=run.json   # compare a saved run
    .venv/bin/python bench/regress.py --only scale --record # re-record after a deliberate change

The recorded figures live in ``docs/performance.json`` next to
``docs/performance.md``, which quotes them: per benchmark, the command that
produced them (a ``bench/`` script that writes its figures with ``--json
PATH``, a flat object of figure name -> number), when and where, and the
figures. This script runs each command with ``--json`` (or reads a file given
with ``--from NAME=PATH``) and prints, per figure, the recorded value, the new
one and their ratio.

A figure whose name ends in ``/s`` is better higher; one in ``µs`` or ``ms``
is better lower; others (shares) are shown without a verdict. A figure more
than ``--tolerance`` (default 20 %) on the wrong side is marked ``worse`` and
the exit status is 1. Not for CI: the machines are shared and noisy, so
re-run a flagged benchmark, and compare ratios measured in one run (the
tables in the doc) before believing a regression.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "docs" / "performance.json"


def direction(name: str) -> int:
    """+1 if higher is better, -1 if lower is, 0 if neither."""
    if name.endswith("/s"):
        return 1
    if "µs" in name or name.endswith(" ms") or "ms/" in name:
        return -1
    return 0


def run(command: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "figures.json")
        subprocess.run([sys.executable, *command, "--json", out], cwd=ROOT, check=True)
        figures: dict[str, float] = json.loads(Path(out).read_text())
    return figures


def compare(name: str, recorded: dict[str, float], now: dict[str, float], tolerance: float) -> int:
    """Print one benchmark's table; return how many figures got worse."""
    print(f"\n## {name}\n")
    print("| figure | recorded | now | now / recorded | |")
    print("| --- | ---: | ---: | ---: | --- |")
    worse = 0
    for figure, before in recorded.items():
        if figure not in now:
            print(f"| {figure} | {before:,.1f} | missing | | |")
            continue
        after = now[figure]
        ratio = after / before if before else float("inf")
        sign = direction(figure)
        verdict = ""
        if sign and (ratio**sign) < 1 - tolerance:
            verdict = "worse"
            worse += 1
        elif sign and (ratio**sign) > 1 + tolerance:
            verdict = "better"
        print(f"| {figure} | {before:,.1f} | {after:,.1f} | {ratio:.2f}x | {verdict} |")
    return worse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated benchmark names (default: all)")
    parser.add_argument(
        "--from",
        dest="saved",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="compare the figures in PATH (a --json output) instead of running NAME",
    )
    parser.add_argument("--tolerance", type=float, default=0.2)
    parser.add_argument(
        "--record", action="store_true", help="write the new figures into docs/performance.json"
    )
    args = parser.parse_args()
    document: dict[str, Any] = json.loads(RECORDED.read_text())
    benchmarks: dict[str, Any] = document["benchmarks"]
    saved = dict(item.split("=", 1) for item in args.saved)
    names = args.only.split(",") if args.only else list(saved or benchmarks)
    unknown = [n for n in names if n not in benchmarks]
    if unknown:
        parser.error(
            f"no recorded benchmark {', '.join(unknown)}: known are {', '.join(benchmarks)}"
        )
    print(
        f"# bench/regress.py against {RECORDED.relative_to(ROOT)}; load average "
        f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} cores"
    )
    worse = 0
    for name in names:
        entry = benchmarks[name]
        if name in saved:
            now = json.loads(Path(saved[name]).read_text())
        else:
            now = run(entry["command"])
        print(f"\n# {name}: recorded {entry['recorded']}; command: {' '.join(entry['command'])}")
        worse += compare(name, entry["figures"], now, args.tolerance)
        if args.record:
            entry["figures"] = {k: round(v, 3) for k, v in now.items()}
            entry["recorded"] = f"{datetime.now(UTC):%Y-%m-%d} (bench/regress.py --record)"
    if args.record:
        RECORDED.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"\n{worse} figure(s) worse than recorded by more than {args.tolerance:.0%}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
