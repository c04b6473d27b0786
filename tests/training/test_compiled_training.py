"""``model.compile: true`` trains as the eager run: the same losses over 5 steps (fp32), the compile time and the
compiles in each step's metrics, and no compile once every width bucket and layout has been seen."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from ggpo_lightning.core.objectives import ObjectiveConfig

from training_runs import fit, make_data, make_module


class Record(L.Callback):
    def __init__(self) -> None:
        self.losses, self.metrics = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(trainer.callback_metrics["train/loss"]))

    # the module completes a step's row in its own on_train_batch_end, which runs after the callbacks'
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step:
            self.metrics.append(dict(pl_module.last_step_metrics))

    def on_train_end(self, trainer, pl_module) -> None:
        self.metrics.append(dict(pl_module.last_step_metrics))


def run(tiny_model_dir, data_dir, compile: bool, steps: int = 5) -> Record:
    torch.manual_seed(0)
    # SGD: Adam's steps are lr * g / (|g| + eps), which turns rounding differences of near-zero gradients (the first
    # steps' loss is 0: learner = reference) into lr-sized weight differences; SGD keeps them rounding-sized
    module = make_module(tiny_model_dir, compile=compile, objective=ObjectiveConfig(name="grpo", behavior_anchor=0.04),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    record = Record()
    fit(module, make_data(data_dir), steps=steps, callbacks=[record])
    return record


@pytest.mark.slow  # ~40 s with inductor's cache warm, minutes cold (its C++ compiles)
def test_compiled_run_gives_the_eager_losses(tiny_model_dir, data_dir):
    """5 steps of the tiny model (GRPO with the behavior anchor: a loss from the first step), learner and reference
    compiled, against eager: losses equal to rel 1e-5 (abs 1e-6; measured: 1.2e-7 rel); every step's row carries
    compile/seconds and compile/compiles, which stop growing after the warm-up although the steps' row widths and
    counts vary (the later steps' widths in buckets the first two saw, the row count a dynamic dimension)."""
    eager = run(tiny_model_dir, data_dir, compile=False)
    compiled = run(tiny_model_dir, data_dir, compile=True)
    assert len(compiled.losses) == len(eager.losses) == 5
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5, abs=1e-6)
    assert not any("train/compile/compiles" in row for row in eager.metrics)
    compiles = [row["train/compile/compiles"] for row in compiled.metrics]
    seconds = [row["train/compile/seconds"] for row in compiled.metrics]
    assert compiles[0] >= 2 and seconds[0] > 0
    assert compiles[2:] == [compiles[2]] * 3 and seconds[2:] == [seconds[2]] * 3
