"""NanGuard: non-finite steps counted, a streak stops the run with a checkpoint; the step's metrics record."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from ggpo_lightning.training.hooks import NanGuard, UpdateHooks


def test_a_streak_of_non_finite_losses_saves_and_stops_and_a_finite_step_resets_it(tmp_path):
    saved = []
    trainer = SimpleNamespace(global_step=7, log_dir=str(tmp_path), default_root_dir="unused", should_stop=False,
                              save_checkpoint=saved.append)
    guard = NanGuard(max_in_a_row=2)
    assert guard.skip(trainer) == 1 and not trainer.should_stop
    guard.passed()  # a finite step between: the streak starts again
    assert guard.skip(trainer) == 2 and not trainer.should_stop and not saved
    assert guard.skip(trainer) == 3 and trainer.should_stop
    assert saved == [tmp_path / "nan-stop.ckpt"] and guard.total == 3


def test_step_metrics_are_recorded_as_floats_and_nan_left_out_only_where_it_means_none():
    hooks = UpdateHooks()
    hooks.record_step_metrics({"train/reward": torch.tensor(0.25), "train/logratio_correct": torch.tensor(float("nan")),
                               "train/rollout_seconds": 1.5}, nan_means_none=True)
    hooks.record_step_metrics({"train/grad_norm": torch.tensor(float("nan"))})  # a NaN gradient: recorded
    assert set(hooks.last_step_metrics) == {"train/reward", "train/rollout_seconds", "train/grad_norm"}
    assert hooks.last_step_metrics["train/reward"] == 0.25 and hooks.last_step_metrics["train/rollout_seconds"] == 1.5
    assert math.isnan(hooks.last_step_metrics["train/grad_norm"])
    assert all(type(v) is float for v in hooks.last_step_metrics.values())
