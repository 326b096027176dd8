"""examples/checkout.py runs: a day passes on the mock clock, order 1 ships
and keeps its charge, order 2 is refunded at the 24-hour timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_checkout_example_charges_waits_and_refunds_on_timeout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "checkout.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert "order-1: shipped (event #2): the charge stands" in lines
    assert "order-2: no shipment within 24 h: refunded ch-order-2/placed:charge" in lines
    assert "order-1: ['placed', 'shipped', 'charged']" in lines
    assert "order-2: ['placed', 'refunded']" in lines
    assert lines[-1] == "charges: [990, 1250], refunds: 1"
