"""Fixtures of the fault tests (helpers: faultkit.py)."""

from __future__ import annotations

import pytest

from faultkit import run, run_dir, train_args, weights


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory):
    """Train/test JSONL of one-digit sums (24/4 prompts)."""
    from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits

    directory = tmp_path_factory.mktemp("fault-data")
    write_splits(ArithmeticTask(max_operand=9, ops="+"), directory, n_train=24, n_test=4, seed=0)
    return directory


@pytest.fixture(scope="session")
def reference_weights(tmp_path_factory, tiny_model_dir, fault_data) -> dict:
    """The learner after an uninterrupted run of STEPS steps."""
    root = tmp_path_factory.mktemp("reference")
    code, out = run(train_args(root, tiny_model_dir, fault_data))
    assert code == 0, out
    return weights(run_dir(root) / "checkpoints" / "last.ckpt")
