"""The reasoning recipe (issue 28): synth_math with worked solutions, the math verifier, the paper's template, and a
tiny model warmed up on worked solutions, built through the recipe's own code path (here at toy size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ggpo_lightning.cli.quickstart import build_quickstart_inputs, synthetic_data_config, tiny_model_config
from ggpo_lightning.cli.train import run_training
from ggpo_lightning.models.loading import load_tokenizer
from ggpo_lightning.records.prompts import PAPER_TEMPLATE
from ggpo_lightning.tasks import ArithmeticTask, SynthMathTask
from ggpo_lightning.training.preflight import check_run

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
REASONING = RECIPES / "reasoning-cpu.yaml"
TOY = ("--tiny_model.hidden_size", "16", "--tiny_model.num_heads", "2", "--tiny_model.num_layers", "1",
       "--tiny_model.sft_steps", "2", "--tiny_model.sft_batch_size", "4", "--synthetic_data.n_train", "10",
       "--synthetic_data.n_test", "5")


def resolved(capsys, recipe: Path, *extra: str) -> dict:
    """The recipe as ``ggpo-train --print_config`` resolves it (which checks the data and model settings too)."""
    with pytest.raises(SystemExit) as exit_info:
        run_training(["--config", str(recipe), *extra, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_the_reasoning_recipe_asks_for_the_math_verifier_the_papers_template_and_the_shipped_ggpo(capsys):
    config = resolved(capsys, REASONING)
    assert config["model"]["verifier"] == "math"
    assert config["data"]["prompt_template"] == PAPER_TEMPLATE and config["data"]["prompt_field"] == "problem"
    assert config["model"]["objective"]["name"] == "ggpo" and config["model"]["objective"]["behavior_anchor"] is None
    # greedy held-out accuracy at the rollout's length, which worked solutions (40-150 tokens with <eos>) fit
    assert config["model"]["eval"]["max_new_tokens"] == config["model"]["rollout"]["sampling"]["max_new_tokens"] >= 150
    assert synthetic_data_config(config).task == SynthMathTask(**yaml.safe_load(REASONING.read_text())
                                                               ["synthetic_data"]["task"])
    tiny = tiny_model_config(config)
    assert tiny.task == synthetic_data_config(config).task and tiny.prompt_template == PAPER_TEMPLATE


def test_the_quickstart_recipe_still_builds_the_arithmetic_task(capsys):
    config = resolved(capsys, RECIPES / "quickstart.yaml")
    assert synthetic_data_config(config).task == ArithmeticTask(max_operand=99, ops="+")
    tiny = tiny_model_config(config)
    assert tiny.task == ArithmeticTask(max_operand=99, ops="+") and tiny.prompt_template == "{prompt}"


def test_the_reasoning_recipe_builds_its_data_and_model_at_toy_size_and_passes_its_preflight(capsys, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's paths are relative: runs/reasoning-cpu/...
    config = resolved(capsys, REASONING, *TOY)
    build_quickstart_inputs(config)
    check_run(config, None)  # prompt lengths against the model's context, memory, the files

    data = tmp_path / "runs" / "reasoning-cpu" / "data"
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    assert len(train) == 10 and all(row["solution"].endswith(f"$\\boxed{{{row['answer']}}}$.") for row in train)
    model = tmp_path / "runs" / "reasoning-cpu" / "tiny-model"
    record = json.loads((model / "tiny_model.json").read_text())
    assert record["config"]["task"] == config["synthetic_data"]["task"]
    assert record["config"]["prompt_template"] == PAPER_TEMPLATE and record["warmup_steps"] == 2
    # the warm-up's teacher forgets carries: the start's mistakes are a habit, set by the data (all its steps run)
    assert 0.5 < record["config"]["sft_forgotten_carry"] < 1 and record["config"]["sft_target_accuracy"] is None
    tokenizer = load_tokenizer(model)  # the reasoning tokenizer: the template and the solutions have no <unk>
    ids = tokenizer(PAPER_TEMPLATE.format(prompt=train[0]["problem"]) + train[0]["solution"])["input_ids"]
    assert tokenizer.unk_token_id not in ids

    build_quickstart_inputs(config)  # the second run reuses both
    assert "[tiny-model] reusing" in capsys.readouterr().out
    # and the tiny model's build lock (filelock's file, kept: removing it would let a waiting build and a new one
    # lock two different files)
    assert sorted(p.name for p in (tmp_path / "runs" / "reasoning-cpu").iterdir()) == [".tiny-model.lock", "data",
                                                                                        "tiny-model"]


def test_a_template_other_than_the_recipes_is_an_error_naming_both_keys(capsys):
    config = resolved(capsys, REASONING)
    config["tiny_model"]["prompt_template"] = "Q: {prompt}\nA:"
    with pytest.raises(ValueError, match=r"tiny_model.prompt_template 'Q: \{prompt\}\\nA:' differs from "
                                         r"data.prompt_template"):
        tiny_model_config(config)
