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
    changed = recipe(tmp_path, synthetic_data={"task": TASK, "n_train": 10, "n_test": 4, "seed": 1})
    with pytest.raises(SettingsError, match=r"data holds splits made with other parameters \(n_train: "
                                            r"recorded 12, requested 10\)"):
        build_quickstart_inputs(changed)  # the recipe changed since: not a silent reuse of the old rows
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


@pytest.mark.parametrize("top,message", [
    ({"synthetic_data": {"task": {"families": ["foo"], "levels": [1]}}},
     "synthetic_data: SynthMathTask.families: unknown 'foo'"),
    ({"synthetic_data": {"task": TASK, "n_train": 1000}}, r"synthetic_data: n_train \+ n_test = \d+ exceeds"),
    ({"synthetic_data": {"task": TASK, "n_train": 12, "n_test": 4}, "tiny_model": {"sft_check_every": 0}},
     "tiny_model: invalid TinyModelConfig: sft_check_every must be >= 1, got 0"),
])
def test_a_bad_task_or_tiny_model_setting_is_one_line_naming_the_group_before_anything_is_written(tmp_path, top,
                                                                                                     message):
    with pytest.raises(SettingsError, match=message) as error:
        build_quickstart_inputs(recipe(tmp_path, **top))
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []  # nothing written: no data left behind by a refused tiny_model either
