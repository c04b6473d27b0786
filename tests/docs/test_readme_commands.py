"""The README is a front door: short, and its commands marked runnable run as written from a clone (after
``make setup``), in the repository's root, with the venv's scripts on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RUNNABLE = re.compile(r"^```bash runnable\n(.*?)^```", re.S | re.M)
"""A fenced block with the info string ``bash runnable`` (GitHub still highlights it as bash)."""


def runnable_commands(text: str) -> list[str]:
    return [line for block in RUNNABLE.findall(text) for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) <= 250
    assert runnable_commands("x\n```bash runnable\nggpo-train --help\n# a comment\n```\n```bash\nmake test\n```\n") \
        == ["ggpo-train --help"]


def test_the_readmes_runnable_commands_run_as_written(tmp_path):
    commands = runnable_commands(README)
    assert any(c.startswith("ggpo-train ") for c in commands) and len(commands) >= 3
    scripts = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    for command in commands:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert done.stdout.strip(), f"{command}: printed nothing"
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before  # the commands leave the clone as they found it
