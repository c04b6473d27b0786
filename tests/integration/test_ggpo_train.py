"""End to end: ``ggpo-train`` on the quickstart recipe, shrunk to the tiny test model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from ggpo_lightning.models.loading import load_tokenizer
from ggpo_lightning.cli.train import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "quickstart.yaml"


def train(tmp_path: Path, model_dir: Path, *extra: str, recipe: Path = QUICKSTART):
    return run_training([
        "--config", str(recipe),
        "--model.model_name_or_path", str(model_dir), "--tiny_model", "null",
        "--model.rollout.sampling.max_new_tokens", "3",
        "--data.train_path", str(tmp_path / "data" / "train.jsonl"),
        "--data.val_path", str(tmp_path / "data" / "test.jsonl"),
        "--synthetic_data.n_train", "64", "--synthetic_data.n_test", "16",
        "--data.prompts_per_step", "4",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.val_check_interval", "2",
        *extra,
    ])


def test_a_run_writes_metrics_summary_and_a_loadable_model(tmp_path, tiny_model_dir, capsys):
    cli = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "4")
    run_dir = Path(cli.trainer.log_dir)
    out = capsys.readouterr().out
    assert f"summary written to {run_dir / 'summary.json'}" in out
    assert "held-out accuracy" in out and "before" in out and "after" in out

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recipe"] == "quickstart"
    assert summary["optimizer_steps"] == 4
    assert summary["generated_samples"] == 4 * 4 * 8  # steps x prompts x K, online
    assert 0 <= summary["accuracy_before"] <= 1 and 0 <= summary["accuracy_after"] <= 1
    assert summary["wall_seconds"] > 0

    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    columns = set(rows[0])
    for name in ("loss", "reward", "accuracy", "gibbs_gap", "ess", "mixed_reward_fraction", "staleness",
                 "kl_behavior_k1", "kl_behavior_k3", "log_mass_ratio", "logratio_ref_on_behavior", "behavior_anchor",
                 "rollout_seconds", "rollout_verify_seconds", "rollout_prompt_tokens", "train_seconds",
                 "rollout_tokens_per_s", "train_tokens_per_s",
                 "coverage_log_ratio_max", "coverage_log_ratio_p95", "coverage_ess", "coverage_ess_share",
                 "token_log_ratio_mean", "token_log_ratio_max"):
        assert f"train/{name}" in columns, name
    assert "val/accuracy" in columns
    updates = [r for r in rows if r["train/loss"]]
    assert [int(r["step"]) for r in updates] == [0, 1, 2, 3]  # one row per update, with everything recorded in it
    assert all(r["train/train_seconds"] and r["train/grad_norm"] and r["train/coverage_ess"] for r in updates)
    assert [int(r["step"]) for r in rows if r["val/accuracy"]] == [1, 3]  # after updates 2 and 4, as Lightning numbers

    exported = Path(summary["final_model"])
    model = AutoModelForCausalLM.from_pretrained(exported)  # plain transformers, no ggpo code
    assert model.num_parameters() > 0
    assert load_tokenizer(exported)("1+2=")["input_ids"] == load_tokenizer(tiny_model_dir)("1+2=")["input_ids"]
    assert not [p for p in run_dir.rglob("*") if p.name.endswith((".tmp", ".partial"))]


def test_log_every_n_steps_thins_the_update_rows(tmp_path, tiny_model_dir):
    cli = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "5", "--trainer.log_every_n_steps", "2",
                "--trainer.val_check_interval", "5")
    rows = list(csv.DictReader(open(Path(cli.trainer.log_dir) / "metrics.csv")))
    # every second update, as Lightning thins the rows it writes itself (checked against Lightning's self.log)
    assert [int(r["step"]) for r in rows if r["train/loss"]] == [1, 3]
    assert "train/grad_norm" in cli.model.last_step_metrics and set(cli.model.last_step_metrics) <= set(rows[0])


def test_the_lora_quickstart_exports_an_adapter_and_a_merged_model(tmp_path, tiny_model_dir):
    from peft import PeftModel

    cli = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "4", "--model.ref_refresh_every", "2",
                recipe=RECIPES / "quickstart-lora.yaml")
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert summary["recipe"] == "quickstart-lora" and summary["optimizer_steps"] == 4
    assert cli.model.reference is None and cli.model.policy.lora_merges == 2
    merged = AutoModelForCausalLM.from_pretrained(summary["final_model"])  # plain transformers
    adapter_dir = Path(summary["final_adapter"])
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter_dir / "base"), adapter_dir)
    assert merged.num_parameters() == adapted.get_base_model().num_parameters() - sum(
        p.numel() for n, p in adapted.named_parameters() if ".lora_" in n)


def test_resume_from_the_last_checkpoint_through_the_cli(tmp_path, tiny_model_dir):
    first = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "3")
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert last.is_file()
    second = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "5", "--ckpt_path", str(last))
    summary = json.loads((Path(second.trainer.log_dir) / "summary.json").read_text())
    assert summary["optimizer_steps"] == 5
    assert summary["generated_samples"] == 5 * 4 * 8
    assert summary["accuracy_before"] == json.loads(
        (Path(first.trainer.log_dir) / "summary.json").read_text())["accuracy_before"]


@pytest.mark.parametrize("field,value,match", [
    ("--model.rollout.k", "1", "model.rollout.k"),
    ("--model.objective.beta", "0", "model.objective.beta must be"),
    ("--model.objective.name", "ppo", "model.objective.name: unknown objective 'ppo'"),
    ("--model.verifier", "nope", "model.verifier"),
])
def test_bad_settings_fail_before_the_model_loads(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        run_training(["--config", str(QUICKSTART), "--model.model_name_or_path", str(tmp_path / "missing"),
                      "--tiny_model", "null", field, value])
    assert not (tmp_path / "missing").exists()


def test_a_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_training(["--config", str(QUICKSTART), "--model.model_name_or_path", str(tmp_path / "missing"),
                      "--tiny_model", "null"])


@pytest.mark.slow
def test_the_lora_quickstart_learns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe builds its model and data under runs/
    cli = run_training(["--config", str(RECIPES / "quickstart-lora.yaml")])
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert summary["accuracy_after"] > summary["accuracy_before"] + 0.05, summary  # measured: 0.559 -> 0.771


@pytest.mark.vllm
def test_a_run_with_the_vllm_engine_completes_and_logs_reward(tmp_path, wide_tiny_model_dir):
    cli = train(tmp_path, wide_tiny_model_dir, "--trainer.max_steps", "3", "--model.rollout.engine", "vllm",
                "--model.rollout.sync_every", "2")
    assert cli.model.engine.version == 2  # synced once, after the second update: the vLLM engine took the weights
    rows = list(csv.DictReader(open(Path(cli.trainer.log_dir) / "metrics.csv")))
    rewards = [float(r["train/reward"]) for r in rows if r["train/reward"]]
    assert len(rewards) == 3 and all(0 <= r <= 1 for r in rewards)
    assert max(float(r["train/staleness"]) for r in rows if r["train/staleness"]) > 0  # step 1 sampled from step 0


@pytest.mark.vllm
def test_the_quickstart_learns_with_the_vllm_engine(tmp_path, monkeypatch):
    """The quickstart recipe, rollouts from vLLM, 100 updates: held-out greedy accuracy (256 prompts) rises by
    more than 0.05. The tiny model's warm-up is chaotic across CPUs (``TinyModelConfig.sft_target_accuracy``), and
    so is the gain: 0.574 -> 0.777 on the machine that first ran this, 0.562 -> 0.645 on the AMD EPYC of
    2026-12-04 with the code of 5152331 and of the rollout redesign alike; a run that does not learn stays within
    the held-out noise (about 0.03)."""
    monkeypatch.chdir(tmp_path)  # the recipe builds its model and data under runs/
    cli = run_training(["--config", str(QUICKSTART), "--model.rollout.engine", "vllm", "--trainer.max_steps", "100",
                        "--trainer.val_check_interval", "100", "--data.val_size", "256"])
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    print(f"quickstart with the vLLM engine, 100 updates: accuracy {summary['accuracy_before']:.3f} -> "
          f"{summary['accuracy_after']:.3f} in {summary['wall_seconds']:.0f} s")
    assert cli.model.engine.version == 100  # synced after every update
    assert summary["accuracy_after"] > summary["accuracy_before"] + 0.05, summary


def test_in_flight_updates_on_the_hf_engine_straddle_and_resume_exactly(tmp_path, tiny_model_dir):
    """``in_flight_updates: keep`` with the HF engine: each sync lands inside the next rollout (responses of two
    versions, a staleness of sync_every at that step), and a run stopped with weights in flight (the sync after
    update 4) and resumed trains as the uninterrupted run does."""
    settings = ("--model.rollout.sync_every", "2", "--model.rollout.in_flight_updates", "keep",
                "--model.rollout.sampling.max_new_tokens", "6", "--trainer.val_check_interval", "10")
    whole = train(tmp_path / "whole", tiny_model_dir, "--trainer.max_steps", "6", *settings)
    rows = [r for r in csv.DictReader(open(Path(whole.trainer.log_dir) / "metrics.csv")) if r["train/loss"]]
    swaps = {int(r["step"]): float(r["train/in_flight_straddling"]) for r in rows if r["train/in_flight_straddling"]}
    assert sorted(swaps) == [2, 4]  # the rollouts right after the syncs at updates 2 and 4
    assert max(swaps.values()) > 0
    assert max(float(r["train/staleness_max"]) for r in rows) == 2  # the old version's groups, at the sync's step
    first = train(tmp_path / "parts", tiny_model_dir, "--trainer.max_steps", "4", *settings)
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    second = train(tmp_path / "parts", tiny_model_dir, "--trainer.max_steps", "6", "--ckpt_path", str(last), *settings)
    resumed = [r for r in csv.DictReader(open(Path(second.trainer.log_dir) / "metrics.csv")) if r["train/loss"]]
    by_step = {int(r["step"]): r for r in rows}
    assert [int(r["step"]) for r in resumed] == [4, 5]  # step 4's rollout swaps in the weights the checkpoint held
    for r in resumed:
        for name in ("train/loss", "train/reward", "train/in_flight_straddling", "train/staleness"):
            assert r[name] == by_step[int(r["step"])][name], (r["step"], name)
