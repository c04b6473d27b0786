"""A mistyped key or a bad value on ggpo-train's command line is one line naming the key (issue 25, finding 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.records.errors import SettingsError

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


def error_of(*args: str) -> str:
    with pytest.raises(ValueError) as error:
        run_training(["--config", str(QUICKSTART), *args])
    return str(error.value)


@pytest.mark.parametrize("args,message", [
    (("--model.objective.betaa", "1"), "unknown key model.objective.betaa; did you mean model.objective.beta?"),
    (("--trainer.max_stepz", "3"), "unknown key trainer.max_stepz; did you mean trainer.max_steps?"),
    (("--model.rollout.sampling.top_pp", "1"),
     "unknown key model.rollout.sampling.top_pp; did you mean model.rollout.sampling.top_p?"),
    (("--model.objective.beta", "abc"), "model.objective.beta: expected float, got 'abc'"),
    (("--data.prompts_per_step", "x"), "data.prompts_per_step: expected int, got 'x'"),
])
def test_a_command_line_mistake_is_one_line_naming_the_key(args, message):
    with pytest.raises(SettingsError) as error:
        run_training(["--config", str(QUICKSTART), *args])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("args,message", [
    (("--model.objective.beta", "-1"), "model.objective.beta must be a finite number > 0, got -1.0"),
    (("--data.mode", "onlin"), "data.mode must be one of ('online', 'offline'), got 'onlin'"),
    (("--model.rollout.k", "0"), "model.rollout.k"),
])
def test_print_config_refuses_what_the_run_would_refuse(args, message, capsys):
    assert message in error_of(*args, "--print_config")
    assert capsys.readouterr().out == ""  # nothing printed as if it were valid


def test_a_short_config_flag_gets_the_renamed_key_check(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  beta: 0.1\n")
    for flag in (["-c", str(old)], [f"--config={old}"]):
        with pytest.raises(ValueError, match=rf"{old}: model.beta is now model.objective.beta"):
            run_training(["--config", str(QUICKSTART), *flag])


@pytest.mark.parametrize("recipe,key,line,suggestion", [
    ("model:\n  rollout:\n    sampling:\n      temprature: 0.5\n", "model.rollout.sampling.temprature", 4,
     "model.rollout.sampling.temperature"),
    ("model:\n  verifer: numeric\n", "model.verifer", 2, "model.verifier"),
    ("model:\n  rollout:\n    kk: 3\n", "model.rollout.kk", 3, "model.rollout.k"),
    ("trainer:\n  max_step: 3\n", "trainer.max_step", 2, "trainer.max_steps"),
    ("trainr:\n  max_steps: 3\n", "trainr.max_steps", 1 + 1, "trainer.max_steps"),
    ("model:\n  optimizer:\n    class_path: torch.optim.AdamW\n    init_args:\n      lrr: 0.1\n",
     "model.optimizer.init_args.lrr", 5, "model.optimizer.init_args.lr"),
    ("trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n    init_args:\n      save_dirr: x\n",
     "trainer.logger.init_args.save_dirr", 5, "trainer.logger.init_args.save_dir"),
])
def test_a_misspelt_key_in_a_recipe_file_names_the_file_line_full_key_and_the_closest(tmp_path, recipe, key, line,
                                                                                     suggestion):
    """Issue 40: a typo nested in YAML was reported as ``model.rollout: expected NoneType`` or ``Group 'model' does
    not accept option 'verifer'``, without the file, the full key or a suggestion."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(recipe)
    with pytest.raises(SettingsError) as error:
        run_training(["--config", str(QUICKSTART), "--config", str(overlay), "--print_config"])
    assert str(error.value) == (f"{overlay}:{line}: unknown key {key}; did you mean {suggestion}? "
                                "(ggpo-train --help lists every key)")


@pytest.mark.parametrize("args,key", [(("--trainer.max_step", "3"), "trainer.max_steps"),
                                      (("--model.objective.bet", "0.1"), "model.objective.beta")])
def test_a_shortened_key_on_the_command_line_is_refused(args, key, capsys):
    """Issue 40: argparse took ``--trainer.max_step 3`` for ``--trainer.max_steps 3``."""
    with pytest.raises(SettingsError, match=rf"^unknown key {args[0][2:]}; did you mean {key}\?"):
        run_training(["--config", str(QUICKSTART), *args, "--print_config"])
    assert capsys.readouterr().out == ""
