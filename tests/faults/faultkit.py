"""Helpers of the fault tests: ``ggpo-train`` as a real subprocess (``child.py``) on the tiny test model.

A module of its own (not conftest.py): test modules import it by name, and ``conftest`` names several files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ggpo_lightning.models.checkpoint import learner_weights, read_checkpoint

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parents[1] / "recipes" / "quickstart.yaml"
STEPS = 4


def train_args(run_root: Path, model_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    """A ``ggpo-train`` command line: the quickstart recipe on the tiny model, 4 steps, a checkpoint every step."""
    return ["--config", str(QUICKSTART), "--model.model_name_or_path", str(model_dir), "--tiny_model", "null",
            "--synthetic_data", "null", "--data.train_path", str(data_dir / "train.jsonl"), "--data.val_path", "null",
            "--data.prompts_per_step", "2", "--model.rollout.k", "4", "--model.rollout.sampling.max_new_tokens", "3",
            "--model.verifier_timeout", "10",
            "--trainer.logger.init_args.save_dir", str(run_root), "--trainer.max_steps", str(STEPS),
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--checkpoint.every_n_train_steps", "1", "--summary.export", "false", *extra]


def child_env(tmpdir: Path | None = None) -> dict[str, str]:
    # the caller's PYTHONPATH kept: a worktree's tests then run that worktree's package, not the installed one
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


def start(args: list[str], *plan: str, tmpdir: Path | None = None) -> subprocess.Popen:
    """``ggpo-train args`` in a child process, with a kill plan (``child.py``)."""
    return subprocess.Popen([sys.executable, str(HERE / "child.py"), *plan, "--", *args], env=child_env(tmpdir),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(args: list[str], *plan: str, tmpdir: Path | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run to the end; ``(exit code, output)``."""
    proc = start(args, *plan, tmpdir=tmpdir)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # no stray trainer left behind
        proc.communicate()
        raise
    return proc.returncode, out


def weights(checkpoint: Path) -> dict:
    return learner_weights(read_checkpoint(checkpoint))


def orphans(*directories: Path) -> list[Path]:
    """Temporary files and folders left behind (the atomic writers' ``.NAME.PID.RANDOM.tmp``)."""
    return [p for d in directories if d.exists() for p in d.rglob("*") if p.name.endswith(".tmp")]


def run_dir(root: Path) -> Path:
    return root / "quickstart" / "version_0"


def assert_same_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    different = [name for name in expected if not (actual[name] == expected[name]).all()]
    assert not different, f"weights differ from the uninterrupted run's: {different}"
