"""Issue 40, item 5: an objective from outside the package, named by a recipe: a module imported with
``ggpo-train --objective_module``, or an entry point of the group ``ggpo.objectives`` of an installed package
(a ``.dist-info`` folder on ``sys.path``, as pip writes it). Both through ``ggpo-train`` itself."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ggpo_lightning.cli.errors import USER_ERROR_EXIT
from ggpo_lightning.cli.train import run_training, train_main
from ggpo_lightning.core import objectives

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"

# RLOO (docs/examples/rloo_objective.py), counting its calls
OBJECTIVE = '''
import torch
from ggpo_lightning.core.objectives import Objective

calls = []


def rloo_loss(inputs, config):
    calls.append(inputs.logp.shape)
    mask = inputs.mask  # [G, K]
    rewards = torch.where(mask, inputs.rewards, torch.zeros_like(inputs.rewards))  # [G, K]
    n = mask.sum(-1, keepdim=True)  # [G, 1]
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (n - 1).clamp(min=1)  # [G, K]
    advantage = torch.where(mask & (n >= 2), rewards - baseline, torch.zeros_like(rewards))  # [G, K]
    return (-(advantage * inputs.logp).sum(-1) / n.squeeze(-1).clamp(min=1)).mean()


RLOO = Objective("{name}", rloo_loss, level="sequence")
'''


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """The objectives registered by a test leave with it."""
    monkeypatch.setattr(objectives, "_OBJECTIVES", dict(objectives._OBJECTIVES))


def train(tmp_path: Path, model: Path, data_dir: Path, *extra: str):
    return run_training(["--config", str(QUICKSTART), "--model.model_name_or_path", str(model),
                         "--tiny_model", "null", "--synthetic_data", "null",
                         "--data.train_path", str(data_dir / "train.jsonl"), "--data.val_path", "null",
                         "--data.prompts_per_step", "2", "--model.rollout.k", "4",
                         "--model.rollout.sampling.max_new_tokens", "3", "--trainer.max_steps", "2",
                         "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--summary.export", "false",
                         *extra])


def test_an_objective_module_registers_the_objective_a_recipe_names(tmp_path, monkeypatch, tiny_model_dir, data_dir):
    package = tmp_path / "plugins" / "my_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "objectives.py").write_text(OBJECTIVE.format(name="rloo") + "\nfrom ggpo_lightning.core.objectives "
                                           "import register_objective\nregister_objective(RLOO)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    cli = train(tmp_path, tiny_model_dir, data_dir, "--objective_module", "my_pkg.objectives",
                "--model.objective.name", "rloo")
    import my_pkg.objectives

    assert cli.model.objective.name == "rloo" and cli.trainer.global_step == 2
    assert my_pkg.objectives.calls == [(2, 4), (2, 4)]  # one loss per update: 2 prompt groups of K=4
    saved = (Path(cli.trainer.log_dir) / "config.yaml").read_text()
    assert "objective_module: my_pkg.objectives" in saved  # a resume from the saved configuration imports it too


def test_an_entry_point_of_an_installed_package_names_an_objective(tmp_path, monkeypatch, tiny_model_dir, data_dir):
    site = tmp_path / "site"
    site.mkdir()
    (site / "ep_objectives.py").write_text(OBJECTIVE.format(name="rloo_ep"))
    info = site / "ep_objectives-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-objectives\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ggpo.objectives]\nrloo_ep = ep_objectives:RLOO\n")
    monkeypatch.syspath_prepend(str(site))
    assert "rloo_ep" in objectives.available_objectives()
    cli = train(tmp_path, tiny_model_dir, data_dir, "--model.objective.name", "rloo_ep")
    import ep_objectives

    assert cli.model.objective is ep_objectives.RLOO and len(ep_objectives.calls) == 2
    assert json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())["optimizer_steps"] == 2


def test_an_objective_module_that_is_not_found_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        train_main(["--config", str(QUICKSTART), "--objective_module", "no_such_pkg.objectives", "--print_config"])
    assert stop.value.code == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert err.startswith("ggpo-train: error: objective_module: cannot import 'no_such_pkg.objectives' (No module "
                          "named 'no_such_pkg'); is its folder on PYTHONPATH, or its package installed?\n"), err


def test_an_unknown_objective_says_how_to_add_one():
    message = "\n".join(objectives.ObjectiveConfig(name="rloo").errors())
    assert textwrap.dedent("""\
        model.objective.name: unknown objective 'rloo'; available: agro, ggpo, grpo, m2po, maxrl, oapl, prime_rl, \
vespo (a plugin's: --objective_module or an entry point of 'ggpo.objectives', docs/ADDING_AN_OBJECTIVE.md)""") == message
