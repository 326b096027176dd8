"""Regression guard: a benchmark A/B against a base commit, alternated in one run.

    .venv/bin/python bench/regress.py            # bench/vs_queues.py --only a2trio, vs main
    .venv/bin/python bench/regress.py --base HEAD~3 --rounds 5
    .venv/bin/python bench/regress.py -- bench/drain.py --store postgres
    .venv/bin/python bench/regress.py --base main -- bench/push_lane.py

Run it for every change to the drain, the write path or a store (README,
"Development"). It checks the base commit out into a temporary worktree
(``git worktree add --detach``, removed afterwards), copies this tree's
``bench/`` into it so both sides run the same measuring code, and runs the
benchmark command (after ``--``; default ``bench/vs_queues.py --only
a2trio``) on each side ``--rounds`` times, alternating which goes first
(AB, BA, AB, ...), each run writing its figures with ``--json PATH`` (a flat
object of name -> number). It prints each figure's median on both sides,
their ratio and the spread, and exits 1 when a figure is worse than the base
by more than ``--tolerance`` (default 10 %) in the medians.

Figures named in ``/s`` are better higher; in ``µs`` or ``ms`` better lower;
others are shown without a verdict. Only ratios measured in one run mean
anything on a shared machine (a recorded absolute once hid a 0.69x
regression behind a busy machine's noise), and even those only when the
machine is quiet: the 1-minute load is printed before and after, and above
``QUIET_LOAD`` the script says so and its verdict is not to be trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMMAND = ["bench/vs_queues.py", "--only", "a2trio"]
#: Above this 1-minute load average a run's verdict is not to be trusted.
QUIET_LOAD = 1.5


def direction(name: str) -> int:
    """+1 if higher is better, -1 if lower is, 0 if neither."""
    if "/s" in name:
        return 1
    if "µs" in name or name.endswith(" ms") or "ms/" in name:
        return -1
    return 0


def run(tree: Path, command: list[str]) -> dict[str, float]:
    """Run ``command`` (a bench script and its arguments) in ``tree``."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "figures.json")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, *command, "--json", out], cwd=tree, env=env)
        if not os.path.exists(out):
            raise SystemExit(f"{' '.join(command)} in {tree} wrote no figures")
        if done.returncode:
            # A bench that fails on a verdict of its own (vs_queues.py's cap
            # check) has still measured.
            print(f"# (exit status {done.returncode} in {tree})")
        figures: dict[str, float] = json.loads(Path(out).read_text())
    return figures


def base_tree(base: str, folder: Path) -> Path:
    """A worktree of ``base`` with this tree's ``bench/``."""
    tree = folder / "base"
    subprocess.run(
        ["git", "worktree", "add", "--quiet", "--detach", str(tree), base], cwd=ROOT, check=True
    )
    shutil.rmtree(tree / "bench")
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def table(
    base: dict[str, list[float]], head: dict[str, list[float]], tolerance: float
) -> tuple[list[str], int]:
    lines = [
        "| figure | base (median) | this tree (median) | this / base | runs (base; this) | |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    worse = 0
    for figure, before in base.items():
        after = head.get(figure)
        if not after:
            lines.append(f"| {figure} | {statistics.median(before):,.1f} | missing | | | |")
            continue
        b, a = statistics.median(before), statistics.median(after)
        ratio = a / b if b else float("inf")
        sign = direction(figure)
        verdict = ""
        if sign and ratio**sign < 1 - tolerance:
            verdict = "worse"
            worse += 1
        elif sign and ratio**sign > 1 + tolerance:
            verdict = "better"
        runs = ", ".join(f"{v:,.0f}" for v in before) + "; " + ", ".join(f"{v:,.0f}" for v in after)
        lines.append(f"| {figure} | {b:,.1f} | {a:,.1f} | {ratio:.2f}x | {runs} | {verdict} |")
    return lines, worse


def main() -> int:
    argv = sys.argv[1:]
    command = DEFAULT_COMMAND
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the commit to compare with (main)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side (3)")
    parser.add_argument("--tolerance", type=float, default=0.1)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    load = os.getloadavg()[0]
    print(f"# bench/regress.py: {' '.join(command)}; base {args.base} ({revision.strip()})")
    print(f"# {args.rounds} rounds, alternated; 1-minute load {load:.2f}, {os.cpu_count()} cores")
    base_runs: dict[str, list[float]] = {}
    head_runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        tree = base_tree(args.base, Path(folder))
        try:
            for round_ in range(args.rounds):
                sides = [(tree, base_runs), (ROOT, head_runs)]
                for side, runs in sides if round_ % 2 == 0 else sides[::-1]:
                    for figure, value in run(side, command).items():
                        runs.setdefault(figure, []).append(value)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    lines, worse = table(base_runs, head_runs, args.tolerance)
    print("\n".join(lines))
    after = os.getloadavg()[0]
    print(f"\n# 1-minute load after: {after:.2f}")
    if max(load, after) > QUIET_LOAD:
        print(
            f"# the machine was not quiet (load above {QUIET_LOAD}): run again before trusting this"
        )
    print(f"# {worse} figure(s) worse than the base by more than {args.tolerance:.0%}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
