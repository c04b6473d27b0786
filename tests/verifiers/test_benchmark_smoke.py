"""``benchmarks/verifier_throughput.py`` runs end to end on a few pairs, several boxes
included (the script itself checks that every mode gives the same scores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "verifier_throughput.py"


def test_throughput_benchmark_runs_with_several_boxes() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--n", "48", "--workers", "1", "--multi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith(("in-", "pool"))}
    assert set(rows) == {"in-process", "pool(1)", "pool(1)+groups"}
    accuracy = float(rows["in-process"][-1])
    assert 0.2 < accuracy < 0.8  # about half right: a verifier scoring all 0 or all 1 fails
