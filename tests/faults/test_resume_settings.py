"""The rollout schedule is part of what a resume must match; the separate vLLM engine refuses several trainer
processes (each would start an engine on one device)."""

from __future__ import annotations

import pytest

from faultkit import run_dir, train_args
from ggpo_lightning.cli.train import run_training
from ggpo_lightning.models.checkpoint import fingerprint_differences
from ggpo_lightning.records.errors import ResumeError, SettingsError
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.engines import make_engine, placement_run_errors


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


def test_the_separate_vllm_engine_refuses_several_processes_before_anything_loads(tmp_path, tiny_model_dir,
                                                                                 fault_data, monkeypatch):
    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm",
                        lambda *a, **k: pytest.fail("the weights loaded before the error"))
    with pytest.raises(SettingsError, match="vllm_placement: separate runs one vLLM engine beside one trainer "
                                            "process; this run has 2 processes"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.rollout.engine", "vllm",
                                "--model.rollout.vllm_placement", "separate", "--trainer.devices", "2",
                                "--trainer.accelerator", "cpu"))


def test_the_engine_factory_checks_the_launchers_world_size(monkeypatch):
    separate = RolloutConfig(engine="vllm", vllm_placement="separate")
    assert placement_run_errors(separate, 1) == []
    assert placement_run_errors(RolloutConfig(engine="vllm"), 4) == []  # colocated: one engine per process
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank started by torchrun, before its process group exists
    with pytest.raises(SettingsError, match="this run has 2 processes"):
        make_engine(None, None, separate, "unused", lora=False, record_logprobs=False)
