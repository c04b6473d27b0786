"""The quickstart's builders: synthetic data into data.train_path's folder, the tiny model's task from it."""

from __future__ import annotations

import pytest

from ggpo_lightning.cli.quickstart import build_quickstart_inputs, synthetic_data_config, tiny_model_config
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.tasks import ArithmeticTask, SynthMathTask

TASK = {"max_operand": 9, "ops": "+"}


def recipe(tmp_path, **top):
    return {"data": {"train_path": str(tmp_path / "data" / "train.jsonl")}, "model": {"model_name_or_path": "m"},
            **top}


def test_synthetic_data_is_written_where_the_recipe_reads_it_and_only_once(tmp_path):
    config = recipe(tmp_path, synthetic_data={"task": TASK, "n_train": 12, "n_test": 4, "seed": 1})
    build_quickstart_inputs(config)
    train = tmp_path / "data" / "train.jsonl"
    assert len(train.read_text().splitlines()) == 12 and len((tmp_path / "data" / "test.jsonl").read_text().splitlines()) == 4
    train.write_text('{"id": "mine", "prompt": "1+1=", "answer": "2"}\n')
    build_quickstart_inputs(config)  # an existing file is the user's data: left alone
    assert "mine" in train.read_text()
    assert list(tmp_path.iterdir()) == [tmp_path / "data"]  # nothing written elsewhere


def test_synthetic_data_needs_a_train_path(tmp_path):
    with pytest.raises(ValueError, match="set data.train_path"):
        build_quickstart_inputs({"data": {"train_path": None}, "synthetic_data": {"task": TASK}})


def test_the_tiny_model_learns_the_recipes_task_and_nothing_else(tmp_path):
    assert tiny_model_config(recipe(tmp_path, tiny_model={}, synthetic_data={"task": TASK})).task == ArithmeticTask(**TASK)
    with pytest.raises(ValueError, match="tiny_model needs synthetic_data"):
        tiny_model_config(recipe(tmp_path, tiny_model={}))
    with pytest.raises(ValueError, match="differs from synthetic_data.task"):
        tiny_model_config(recipe(tmp_path, tiny_model={"task": {"max_operand": 5, "ops": "+"}},
                                 synthetic_data={"task": TASK}))


def test_the_fields_a_recipe_sets_choose_the_task_and_a_mix_is_an_error_naming_the_key(tmp_path):
    synth = {"families": ["gcd"], "levels": [1]}
    assert synthetic_data_config(recipe(tmp_path, synthetic_data={"task": synth})).task == SynthMathTask(["gcd"], [1])
    assert synthetic_data_config(recipe(tmp_path, synthetic_data={"task": {}})).task == ArithmeticTask()
    with pytest.raises(SettingsError, match="synthetic_data.task sets families, levels, ops: give the fields of one task"):
        synthetic_data_config(recipe(tmp_path, synthetic_data={"task": {**synth, "ops": "+"}}))
