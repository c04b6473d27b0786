"""Issue 40, item 2: a missing optional package, a tokenizer without the chat template a recipe turns on, a misspelt
template argument and a model that is neither a folder nor in the cache each end ``ggpo-train`` (its real entry,
``train_main``) with one line naming the culprit and the fix, exit status 2, before any weights load. A missing
package is simulated by ``sys.modules[NAME] = None``: ``import NAME`` then fails and ``find_spec`` finds nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ggpo_lightning.cli.errors import USER_ERROR_EXIT
from ggpo_lightning.cli.train import train_main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture()
def no_weights(monkeypatch):
    """Fails the test if the model's weights load: the error must come first."""
    def load(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the error")

    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm", load)


def error_line(capsys, tmp_path: Path, model: Path, data_dir: Path, *extra: str, recipe: str = "quickstart") -> str:
    """The one error line of ``ggpo-train`` on the tiny model, after checking its exit status and that nothing
    else was reported."""
    with pytest.raises(SystemExit) as stop:
        train_main(["--config", str(RECIPES / f"{recipe}.yaml"), "--model.model_name_or_path", str(model),
                    "--tiny_model", "null", "--synthetic_data", "null",
                    "--data.train_path", str(data_dir / "train.jsonl"), "--data.val_path", "null",
                    "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *extra])
    assert stop.value.code == USER_ERROR_EXIT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "run with --debug" in lines[1], lines  # the error and the --debug hint only
    assert not (tmp_path / "runs").exists()  # no run directory made
    return lines[0]


@pytest.mark.parametrize("missing,extra,recipe,line", [
    (("peft",), (), "quickstart-lora",
     "model.lora (remove the section to train all weights) needs peft, which is not installed: "
     "pip install 'ggpo-lightning[lora]'"),
    (("wandb",), ("--config", str(RECIPES / "loggers" / "wandb.yaml")), "quickstart",
     "trainer.logger WandbLogger needs wandb, which is not installed: pip install 'ggpo-lightning[wandb]'"),
    (("tensorboard", "tensorboardX"), ("--config", str(RECIPES / "loggers" / "tensorboard.yaml")), "quickstart",
     "trainer.logger TensorBoardLogger needs tensorboard, which is not installed: "
     "pip install 'ggpo-lightning[tensorboard]'"),
])
def test_a_missing_extra_is_one_line_with_the_install_command(capsys, monkeypatch, tmp_path, tiny_model_dir, data_dir,
                                                              no_weights, missing, extra, recipe, line):
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    assert error_line(capsys, tmp_path, tiny_model_dir, data_dir, *extra, recipe=recipe) == f"ggpo-train: error: {line}"


def test_parquet_prompts_without_pyarrow(capsys, monkeypatch, tmp_path, tiny_model_dir, data_dir, no_weights):
    import pyarrow
    import pyarrow.parquet

    prompts = tmp_path / "train.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([{"prompt": "1+2=", "answer": "3"}] * 8), prompts)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert error_line(capsys, tmp_path, tiny_model_dir, data_dir, "--data.train_path", str(prompts)) == (
        "ggpo-train: error: data.train_path (a Parquet file) needs pyarrow, which is not installed: "
        "pip install 'ggpo-lightning[data]'")


def test_a_chat_template_the_tokenizer_does_not_have(capsys, tmp_path, tiny_model_dir, data_dir, no_weights):
    assert error_line(capsys, tmp_path, tiny_model_dir, data_dir, "--model.chat_template", "true") == (
        f"ggpo-train: error: model.chat_template is on but the tokenizer of {tiny_model_dir} has no chat template; "
        "turn model.chat_template off (the prompt text as it is) or use a model whose tokenizer has one")


def test_a_misspelt_chat_template_argument_is_refused(capsys, tmp_path, qwen3_model_dir, data_dir, no_weights):
    assert error_line(capsys, tmp_path, qwen3_model_dir, data_dir, "--model.chat_template",
                      "{kwargs: {enable_thinkin: false}}", "--model.verifier", "math") == (
        f"ggpo-train: error: model.chat_template.kwargs.enable_thinkin is not a variable of the chat template of "
        f"{qwen3_model_dir}, which would ignore it; did you mean enable_thinking?")


def test_the_right_chat_template_argument_passes_the_check(qwen3_model_dir):
    from ggpo_lightning.models.loading import load_tokenizer
    from ggpo_lightning.rollouts.group import chat_template_errors

    tokenizer = load_tokenizer(qwen3_model_dir)
    assert chat_template_errors(tokenizer, {"kwargs": {"enable_thinking": False}}, "qwen3") == []


def test_a_model_neither_a_folder_nor_in_the_cache(capsys, tmp_path, data_dir, no_weights, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    line = error_line(capsys, tmp_path, "nobody/no-such-model", data_dir)
    assert line.startswith("ggpo-train: error: model.model_name_or_path: 'nobody/no-such-model' is neither a local "
                           "folder nor a model in the Hugging Face cache"), line
