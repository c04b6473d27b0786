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
