"""The learning-rate schedule: hand values, and the logged learning rate across a resume."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from ggpo_lightning.core.schedule import LRScheduleConfig, lr_multiplier

from training_runs import make_data, make_module


def test_warmup_then_each_decay_by_hand():
    args = dict(warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    assert [lr_multiplier(s, decay="constant", **args) for s in range(7)] == [0.5, 1, 1, 1, 1, 1, 1]
    assert [lr_multiplier(s, decay="linear", **args) for s in range(7)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1])  # 0.1 + 0.9 * (1 - (s - 2) / 4)
    assert lr_multiplier(4, decay="cosine", **args) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_multiplier(60, decay="cosine", **args) == pytest.approx(0.1)  # held at the floor past the end


@pytest.mark.parametrize("settings,message", [
    (dict(decay="step"), "decay must be one of"), (dict(warmup_steps=-1), "warmup_steps must be >= 0"),
    (dict(warmup_steps=5, total_steps=5), "total_steps \\(5\\) must exceed"), (dict(min_lr_ratio=2), "min_lr_ratio"),
])
def test_bad_settings_name_their_key(tiny_model_dir, settings, message):
    with pytest.raises(ValueError, match=f"model.lr_scheduler.*{message}"):
        make_module(tiny_model_dir, lr_scheduler=LRScheduleConfig(**settings))


def logged_lrs(log_dir) -> list[float]:
    rows = csv.DictReader(open(next(log_dir.rglob("metrics.csv"))))
    return [float(r["train/lr"]) for r in rows if r.get("train/lr")]


def test_the_logged_learning_rate_follows_the_schedule_across_a_resume(tiny_model_dir, data_dir, tmp_path):
    """metrics.csv's ``train/lr``: the learning rate each update used, continued by a resumed run."""
    schedule = LRScheduleConfig(warmup_steps=2, decay="linear", total_steps=6, min_lr_ratio=0.0)

    def run(name, ckpt_path=None):
        torch.manual_seed(0)
        module = make_module(tiny_model_dir, lr_scheduler=schedule)
        checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3,
                                                          save_top_k=-1)
        L.Trainer(max_steps=6, accelerator="cpu", logger=CSVLogger(tmp_path / name), log_every_n_steps=1,
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                  callbacks=[checkpoints]).fit(module, datamodule=make_data(data_dir), ckpt_path=ckpt_path)
        return logged_lrs(tmp_path / name)

    expected = [1e-2 * lr_multiplier(s, 2, 6, "linear", 0.0) for s in range(6)]  # make_module's AdamW lr 1e-2
    assert run("full") == pytest.approx(expected)
    assert run("resumed", ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt")) == pytest.approx(expected[3:])
