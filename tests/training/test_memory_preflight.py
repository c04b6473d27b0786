"""``ggpo-train`` prints the memory estimate before the weights load and refuses, naming the key, a run that does not
fit (the 1.7B recipe as a user runs it, on the tiny Qwen3-shaped model and the CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.records.errors import SettingsError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "qwen3-1.7b-math.yaml"


class WeightsLoaded(Exception):
    """The preflight passed: the module started loading the weights."""


@pytest.fixture()
def loads(monkeypatch):
    """Records whether the model's weights were asked for, and stops the run there."""
    calls = []

    def load(*args, **kwargs):
        calls.append(args)
        raise WeightsLoaded

    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm", load)
    return calls


def recipe_args(tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    train = tmp_path / "math.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                             for i in range(40)))
    return ["--config", str(RECIPE), "--data.train_path", str(train), "--model.model_name_or_path", str(model_dir),
            "--trainer.accelerator", "cpu", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *extra]


def test_the_estimate_is_printed_before_the_weights_load(tmp_path, qwen3_model_dir, loads, capsys):
    with pytest.raises(WeightsLoaded):
        run_training(recipe_args(tmp_path, qwen3_model_dir))
    out = capsys.readouterr().out
    assert "memory per device (estimate, before the weights load):" in out
    for part in ("weights", "gradients", "optimizer state", "reference", "activations", "rollout engine"):
        assert part in out
    assert "per micro-batch of 16384 tokens" in out and "(the host (available memory))" in out
    assert len(loads) == 1


def test_a_run_that_does_not_fit_names_the_key_before_the_weights_load(tmp_path, qwen3_model_dir, loads,
                                                                         monkeypatch):
    monkeypatch.setattr("ggpo_lightning.training.preflight._device_memory", lambda on_gpu: (10**6, "GPU 0"))
    with pytest.raises(SettingsError, match=r"the run needs about .* GB per device but GPU 0 has 0\.0 GB .*"
                                            r"lower model\.micro_batch\.max_tokens") as error:
        run_training(recipe_args(tmp_path, qwen3_model_dir))
    assert "\n" not in str(error.value) and not loads
    with pytest.raises(WeightsLoaded):  # the way out the message names
        run_training(recipe_args(tmp_path, qwen3_model_dir, "--memory_check", "false"))
