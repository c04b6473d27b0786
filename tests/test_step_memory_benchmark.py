"""benchmarks/step_memory.py runs (a smoke run at toy size) and reports each point's memory and its estimate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_memory.py"


def test_the_step_memory_benchmark_runs_and_prints_every_point():
    out = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "1", "2", "--k", "2", "--hidden", "64",
                          "--layers", "1", "--response-tokens", "16", "--max-tokens", "48", "--vocab", "256"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    points = re.findall(r"P= *(\d+) K=2 +(one pass|max_tokens 48): step memory +([\d.]+) MB.*; estimate +([\d.]+) MB",
                        out.stdout)
    assert [(p, mode) for p, mode, _, _ in points] == [("1", "one pass"), ("1", "max_tokens 48"),
                                                    ("2", "one pass"), ("2", "max_tokens 48")]
    assert all(float(mb) >= 0 and float(estimate) > 0 for _, _, mb, estimate in points)
    assert "micro-batched:" in out.stdout
