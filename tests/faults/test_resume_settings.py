"""The rollout schedule is part of what a resume must match; the separate vLLM engine's keys name the server engine
that replaced it."""

from __future__ import annotations

import pytest

from faultkit import run_dir, train_args
from ggpo_lightning.cli.train import run_training
from ggpo_lightning.models.checkpoint import fingerprint_differences
from ggpo_lightning.records.errors import ResumeError, SettingsError


def test_a_fingerprint_without_the_schedule_reads_as_sync():
    old = {"settings": {"model.objective.beta": 0.04}, "data": None}  # written before the schedule was recorded
    now = {"settings": {"model.objective.beta": 0.04, "model.rollout.schedule": "sync"}, "data": None}
    assert fingerprint_differences(old, now) == []
    now["settings"]["model.rollout.schedule"] = "async"
    assert fingerprint_differences(old, now) == ["model.rollout.schedule: checkpoint 'sync', now 'async'"]


def test_resuming_a_sync_run_as_async_names_the_schedule(tmp_path, tiny_model_dir, fault_data):
    run_training(train_args(tmp_path / "sync", tiny_model_dir, fault_data, "--trainer.max_steps", "1"))
    last = run_dir(tmp_path / "sync") / "checkpoints" / "last.ckpt"
    with pytest.raises(ResumeError, match=r"(?s)different run:.*model.rollout.schedule: checkpoint 'sync', now "
                                          "'async'"):
        run_training(train_args(tmp_path / "async", tiny_model_dir, fault_data, "--ckpt_path", str(last),
                                "--model.rollout.schedule", "async", "--model.rollout.async_worker", "thread",
                                "--trainer.max_steps", "2"))


def test_the_separate_vllm_engines_keys_name_the_server_engine_before_anything_loads(tmp_path, tiny_model_dir,
                                                                                    fault_data, monkeypatch):
    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm",
                        lambda *a, **k: pytest.fail("the weights loaded before the error"))
    with pytest.raises(SettingsError, match=r"command line: model.rollout.vllm_placement is now model.rollout.engine: "
                                            r"vllm_server with model.rollout.servers: local"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.rollout.engine", "vllm",
                                "--model.rollout.vllm_placement", "separate"))
    with pytest.raises(SettingsError, match=r"model.rollout.vllm_devices is now model.rollout.server_devices"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.rollout.vllm_devices", "[1]"))
