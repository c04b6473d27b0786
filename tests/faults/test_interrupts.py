"""Signals and kill -9: a run stopped at any point loses at most the step in progress."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from faultkit import STEPS, assert_same_weights, orphans, run, run_dir, train_args, weights
from ggpo_lightning.training.checkpoint_io import check_checkpoint


@pytest.mark.parametrize("name", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_a_signal_saves_a_checkpoint_and_summary_and_the_resume_matches_an_uninterrupted_run(
        tmp_path, tiny_model_dir, fault_data, reference_weights, name):
    code, out = run(train_args(tmp_path / "a", tiny_model_dir, fault_data), f"signal_step=1:{name}")
    assert code == 128 + getattr(signal, name), out  # non-zero, as a shell reports a signal
    directory = run_dir(tmp_path / "a")
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["reason"] == f"stopped by {name}"
    assert summary["optimizer_steps"] == 2  # the step in progress finished
    saved = directory / "checkpoints" / "interrupted.ckpt"
    assert summary["checkpoint"] == str(saved) and f"--ckpt_path {saved}" in out

    code, out = run(train_args(tmp_path / "b", tiny_model_dir, fault_data, "--ckpt_path", str(saved)))
    assert code == 0, out
    assert_same_weights(weights(run_dir(tmp_path / "b") / "checkpoints" / "last.ckpt"), reference_weights)


def test_a_sigterm_after_lightning_took_the_handlers_and_before_training_stops_after_the_first_step(
        tmp_path, tiny_model_dir, fault_data):
    """Between Lightning's installing its signal handlers and the first step (the loaders' setup), a SIGTERM is
    Lightning's to note: it stopped the run at an epoch's end with its own exception and exit code 0, a stopped run
    that looked finished. The run guard takes it over at train start: stopped after the first step, exit 143."""
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data), "signal_start=SIGTERM")
    assert code == 128 + signal.SIGTERM, out
    summary = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["reason"] == "stopped by SIGTERM", summary
    assert summary["optimizer_steps"] == 1 and Path(summary["checkpoint"]).is_file()


def _trial(seed: int, tmp_path, tiny_model_dir, fault_data, reference_weights, tmpdir) -> str:
    """kill -9 at a seeded random point (mid-save, mid-step, mid-rollout); then the newest checkpoint loads, the
    resume ends on the uninterrupted run's weights and no temporary file is left. Returns the plan."""
    rng = random.Random(seed)
    plan = rng.choice([f"kill_save={rng.randint(1, 2 * STEPS - 1)}:{rng.random():.2f}",
                       f"kill_step={rng.randint(1, STEPS - 1)}", f"kill_rollout={rng.randint(1, STEPS)}"])
    code, out = run(train_args(tmp_path / "killed", tiny_model_dir, fault_data), plan, tmpdir=tmpdir)
    assert code == -signal.SIGKILL, out
    last = run_dir(tmp_path / "killed") / "checkpoints" / "last.ckpt"
    resume = []
    if last.exists():
        check_checkpoint(last)  # complete: the previous checkpoint, never a torn one
        weights(last)
        resume = ["--ckpt_path", str(last)]
    # the same recipe again, as a user would: the next version directory of the same logger folder
    code, out = run(train_args(tmp_path / "killed", tiny_model_dir, fault_data, *resume), tmpdir=tmpdir)
    assert code == 0, out
    resumed = run_dir(tmp_path / "killed").with_name("version_1")
    assert_same_weights(weights(resumed / "checkpoints" / "last.ckpt"), reference_weights)
    assert not orphans(tmp_path, tmpdir)
    assert not list(tmpdir.iterdir())
    return plan


@pytest.fixture()
def other_filesystem_tmpdir(tmp_path):
    """TMPDIR on another file system (tmpfs /dev/shm) where the machine has one, else under tmp_path."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    directory = Path(tempfile.mkdtemp(dir=base, prefix="ggpo-faults-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_kill_9_in_the_middle_of_a_checkpoint_save(tmp_path, tiny_model_dir, fault_data, reference_weights,
                                                   other_filesystem_tmpdir):
    code, out = run(train_args(tmp_path / "killed", tiny_model_dir, fault_data), "kill_save=3:0.5",
                    tmpdir=other_filesystem_tmpdir)
    assert code == -signal.SIGKILL, out
    checkpoints = run_dir(tmp_path / "killed") / "checkpoints"
    assert orphans(checkpoints)  # the torn temporary file, beside the target (not in TMPDIR) ...
    assert not list(other_filesystem_tmpdir.iterdir())
    check_checkpoint(checkpoints / "last.ckpt")  # ... while last.ckpt is the previous complete checkpoint
    assert not orphans(checkpoints)  # removed once its writer is dead
    code, out = run(train_args(tmp_path / "resumed", tiny_model_dir, fault_data, "--ckpt_path",
                               str(checkpoints / "last.ckpt")))
    assert code == 0, out
    assert_same_weights(weights(run_dir(tmp_path / "resumed") / "checkpoints" / "last.ckpt"), reference_weights)


@pytest.mark.slow
def test_kill_9_at_20_random_points(tmp_path, tiny_model_dir, fault_data, reference_weights, other_filesystem_tmpdir):
    plans = []
    for seed in range(20):
        plans.append(_trial(seed, tmp_path / f"trial-{seed}", tiny_model_dir, fault_data, reference_weights,
                            other_filesystem_tmpdir))
        print(f"trial {seed}: {plans[-1]}: resumed to the uninterrupted weights, no orphans", flush=True)
    assert len({p.split("=")[0] for p in plans}) == 3  # saves, steps and rollouts were all hit


def test_a_finished_run_leaves_the_signal_handlers_as_it_found_them(tmp_path, tiny_model_dir, fault_data):
    from ggpo_lightning.cli.train import run_training

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--trainer.max_steps", "1"))
    assert {s: signal.getsignal(s) for s in before} == before
