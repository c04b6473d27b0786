"""A new user's first run (issue 25): the README's GPU commands and the recipes' tips as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.training.data import PromptGroupDataModule

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_a_missing_train_path_given_on_the_command_line_is_an_error_before_anything_is_written(tmp_path, monkeypatch):
    """Finding 1: with a quickstart-based recipe, a mistyped --data.train_path generated data next to it."""
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "mydata" / "trian.jsonl"
    with pytest.raises(SettingsError, match=rf"data.train_path {typo} does not exist; synthetic_data is generated "
                                            r"only at the recipe's own data.train_path"):
        run_training(["--config", str(RECIPES / "quickstart.yaml"), "--data.train_path", str(typo)])
    assert list(tmp_path.iterdir()) == []  # no data, no tiny model, no run directory


def test_synthetic_data_set_on_the_command_line_is_built_at_the_command_lines_train_path(tmp_path, monkeypatch):
    """Asking for synthetic data on the command line too is asking for it there (how tests relocate the
    quickstart); the check is made on the command line, before the model (a missing folder here) is touched."""
    monkeypatch.chdir(tmp_path)
    train = tmp_path / "data" / "train.jsonl"
    with pytest.raises(OSError, match="no-model.* does not exist"):
        run_training(["--config", str(RECIPES / "quickstart.yaml"), "--data.train_path", str(train),
                      "--synthetic_data.n_train", "8", "--synthetic_data.n_test", "4", "--tiny_model", "null",
                      "--model.model_name_or_path", str(tmp_path / "no-model"), "--data.val_path", "null"])
    assert len(train.read_text().splitlines()) == 8


def math_recipe_data(capsys, *extra: str) -> dict:
    with pytest.raises(SystemExit):
        run_training(["--config", str(RECIPES / "qwen3-1.7b-math.yaml"), *extra, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)["data"]


def test_the_gpu_command_with_only_a_train_path_reads_it_and_no_default_val_path(tmp_path, capsys):
    """Finding 2: ``--data.train_path math.jsonl`` kept ``data/math/test.jsonl`` as the held-out file."""
    train = tmp_path / "math.jsonl"
    train.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    data = math_recipe_data(capsys, "--data.train_path", str(train))
    datamodule = PromptGroupDataModule(**data)
    datamodule.load_rows()
    assert [r.gold for r in datamodule.train_rows] == ["2"] and datamodule.val_rows == []


def test_the_recipe_tip_for_a_datasets_name_works_as_written(tmp_path, capsys):
    """Finding 2: ``--data.dataset NAME --data.train_path null`` (the recipe's own tip) was refused."""
    folder = tmp_path / "mathset"
    folder.mkdir()
    for split, n in (("train", 3), ("test", 2)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}?", "answer": str(2 * i)}) + "\n"
                                                       for i in range(n)))
    tip = next(line for line in (RECIPES / "qwen3-1.7b-math.yaml").read_text().splitlines() if "--data.dataset" in line)
    assert "--data.dataset NAME --data.train_path null" in tip
    data = math_recipe_data(capsys, "--data.dataset", str(folder), "--data.train_path", "null")
    datamodule = PromptGroupDataModule(**data)
    datamodule.load_rows()
    assert len(datamodule.train_rows) == 3 and [r.gold for r in datamodule.val_rows] == ["0", "2"]
