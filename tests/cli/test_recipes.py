"""Every recipe parses against ggpo-train; --help and --print_config work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ggpo_lightning.cli.train import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ALL_YAML = sorted(RECIPES.rglob("*.yaml"))
OVERLAY_FOLDERS = {"baselines", "overlays", "loggers"}  # overlays go after a base recipe
BASES = [p for p in ALL_YAML if not OVERLAY_FOLDERS & set(p.parts)]
OVERLAYS = [p for p in ALL_YAML if "baselines" in p.parts]  # baselines: the objective only
ROLLOUT_OVERLAYS = [p for p in ALL_YAML if "overlays" in p.parts]  # the rollout settings only
LOGGER_OVERLAYS = [p for p in ALL_YAML if "loggers" in p.parts]  # the logger only


def test_the_recipe_folder_holds_what_the_readme_promises():
    names = {p.relative_to(RECIPES).as_posix() for p in ALL_YAML}
    assert {"quickstart.yaml", "qwen3-1.7b-math.yaml", "offline.yaml", "baselines/grpo.yaml",
            "baselines/agro.yaml", "baselines/ggpo-paper.yaml"} <= names
    assert len(BASES) >= 3 and len(OVERLAYS) >= 2
    readme = (RECIPES / "README.md").read_text()
    assert all(p.relative_to(RECIPES).as_posix() in readme for p in ALL_YAML), "README table misses a recipe"


def test_every_baseline_overlay_is_a_valid_objective():
    """Each baseline's ``model.objective`` passes the checks a run makes (the corrections only on GRPO, in bounds)."""
    from ggpo_lightning.core.objectives import ObjectiveConfig

    assert len(OVERLAYS) == 13  # grpo, agro, maxrl, ggpo-paper, GRPO's five corrections (issue 43), issue 57's four
    for overlay in OVERLAYS:
        assert ObjectiveConfig(**yaml.safe_load(overlay.read_text())["model"]["objective"]).errors() == [], overlay


def print_config(capsys, *configs: Path, extra: tuple[str, ...] = ()) -> dict:
    args = [a for c in configs for a in ("--config", str(c))] + list(extra) + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:  # jsonargparse prints, then exits before building anything
        run_training(args)
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("recipe", BASES, ids=lambda p: p.name)
def test_every_recipe_parses_and_prints_its_config(recipe, capsys):
    raw = yaml.safe_load(recipe.read_text())
    config = print_config(capsys, recipe)
    assert config["model"]["objective"] == {**config["model"]["objective"], **raw["model"]["objective"]}
    assert config["model"]["model_name_or_path"] == raw["model"]["model_name_or_path"]
    assert config["trainer"]["max_steps"] == raw["trainer"]["max_steps"]
    assert config["seed_everything"] == raw["seed_everything"]  # explicit, never `true`
    assert config["model"]["lora"] == raw["model"].get("lora")  # null, or every LoRA field as written


@pytest.mark.parametrize("scaled,single,differ", [
    ("fsdp-cpu-2proc.yaml", "quickstart.yaml", set()),
    ("qwen3-1.7b-math-8gpu.yaml", "qwen3-1.7b-math.yaml", {"prompts_per_step"}),
    ("qwen3-4b-math-8gpu.yaml", "qwen3-1.7b-math.yaml", {"prompts_per_step", "model_name_or_path"}),
])
def test_multi_device_recipes_change_only_devices_and_batch(scaled, single, differ):
    """A sharded recipe trains what its one-device counterpart trains (only devices, strategy, batch, name; its memory
    settings, vLLM's share and the micro-batch budget, are sized for its own share of the model)."""
    many, one = (yaml.safe_load((RECIPES / name).read_text()) for name in (scaled, single))
    assert many["trainer"]["strategy"]["class_path"] == "lightning.pytorch.strategies.ModelParallelStrategy"
    assert many["trainer"]["strategy"]["init_args"] == {"data_parallel_size": many["trainer"]["devices"],
                                                        "tensor_parallel_size": 1}
    assert many["data"]["prompts_per_step"] % many["trainer"]["devices"] == 0
    for recipe in (many, one):  # the memory budgets are per card and model state, and leave what is trained as it is
        recipe["model"].pop("micro_batch", None)
        recipe["model"].get("rollout", {}).pop("vllm_args", None)
    for section in ("model", "data"):
        changed = {k for k in many[section].keys() | one[section].keys() if many[section].get(k) != one[section].get(k)}
        assert changed == differ & (many[section].keys() | one[section].keys()), section
    ignore = {"devices", "strategy", "logger"}
    assert {k: v for k, v in many["trainer"].items() if k not in ignore} == \
        {k: v for k, v in one["trainer"].items() if k not in ignore}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
@pytest.mark.parametrize("base", BASES, ids=lambda p: p.name)
def test_baseline_overlays_change_only_the_objective_side(base, overlay, capsys):
    config = print_config(capsys, base, overlay)
    raw = yaml.safe_load(overlay.read_text())["model"]["objective"]
    assert config["model"]["objective"] == {**config["model"]["objective"], **raw}
    assert raw["name"] == overlay.stem.partition("-")[0]  # ggpo-paper: the paper's ggpo; grpo-tis: grpo with TIS
    plain = print_config(capsys, base)
    assert config["data"] == plain["data"] and config["trainer"] == plain["trainer"]


def test_the_paper_preset_turns_the_anchor_off_where_the_shipped_ggpo_has_it(capsys):
    """``ggpo`` (shipped) and ``ggpo-paper`` differ only in the behavior anchor: lambda = beta vs 0 when stale."""
    from ggpo_lightning.core.objectives import ObjectiveConfig

    stale = ("--model.rollout.sync_every", "16")
    shipped = print_config(capsys, RECIPES / "quickstart.yaml", extra=stale)["model"]["objective"]
    paper = print_config(capsys, RECIPES / "quickstart.yaml", RECIPES / "baselines/ggpo-paper.yaml",
                         extra=stale)["model"]["objective"]
    assert {k: v for k, v in paper.items() if k != "behavior_anchor"} == \
        {k: v for k, v in shipped.items() if k != "behavior_anchor"}
    assert ObjectiveConfig(**shipped).anchor_weight(16) == shipped["beta"] > 0
    assert ObjectiveConfig(**paper).anchor_weight(16) == 0.0


@pytest.mark.parametrize("overlay", ROLLOUT_OVERLAYS, ids=lambda p: p.name)
def test_rollout_overlays_change_only_the_rollout_settings(overlay, capsys):
    config = print_config(capsys, RECIPES / "quickstart.yaml", overlay)
    plain = print_config(capsys, RECIPES / "quickstart.yaml")
    assert config["data"] == plain["data"] and config["trainer"] == plain["trainer"]
    rollout = yaml.safe_load(overlay.read_text())["model"]["rollout"]
    assert config["model"]["rollout"] == {**plain["model"]["rollout"], **rollout} != plain["model"]["rollout"]
    assert {k: v for k, v in config["model"].items() if k != "rollout"} == {
        k: v for k, v in plain["model"].items() if k != "rollout"}


@pytest.mark.parametrize("overlay", LOGGER_OVERLAYS, ids=lambda p: p.name)
def test_logger_overlays_change_only_the_logger_and_keep_the_run_folder(overlay, capsys):
    config = print_config(capsys, RECIPES / "qwen3-1.7b-math.yaml", overlay)
    plain = print_config(capsys, RECIPES / "qwen3-1.7b-math.yaml")
    logger, before = config["trainer"].pop("logger"), plain["trainer"].pop("logger")
    assert config == plain
    assert logger["class_path"] == yaml.safe_load(overlay.read_text())["trainer"]["logger"]["class_path"]
    assert (logger["init_args"]["save_dir"], logger["init_args"]["name"]) == ("runs", "qwen3-1.7b-math") == \
        (before["init_args"]["save_dir"], before["init_args"]["name"])


def test_command_line_overrides_win(capsys):
    config = print_config(capsys, RECIPES / "quickstart.yaml",
                          extra=("--model.objective.beta", "0.05", "--trainer.max_steps", "7"))
    assert config["model"]["objective"]["beta"] == 0.05 and config["trainer"]["max_steps"] == 7


@pytest.mark.parametrize("old,new", [("--model.beta", "model.objective.beta"),
                                     ("--model.eval_temperature", "model.eval.temperature"),
                                     ("--model.objective", "model.objective.name: grpo"),
                                     ("--model.rollout.mode", "model.rollout.schedule"),
                                     ("--data.max_staleness", "data.buffer_max_staleness"),
                                     ("--data.synthetic.n_train", "synthetic_data")])
def test_a_renamed_key_on_the_command_line_names_its_new_key(old, new):
    with pytest.raises(ValueError, match=rf"command line: {old[2:]}.* is now {new}"):
        run_training(["--config", str(RECIPES / "quickstart.yaml"), old, "grpo" if "objective" in old else "0.5"])


def test_a_renamed_key_in_a_recipe_file_names_its_new_key_and_the_file(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  objective: grpo\n  beta: 0.1\n  eval_batch_size: 8\n  tiny_model: {hidden_size: 8}\n"
                   "  rollout: {mode: async}\ndata: {max_staleness: 2, synthetic: {n_train: 8}}\n")
    with pytest.raises(ValueError) as error:
        run_training(["--config", str(RECIPES / "quickstart.yaml"), "--config", str(old)])
    message = str(error.value)
    for expected in ("model.objective: grpo is now model.objective.name: grpo", "model.beta is now model.objective.beta",
                     "model.eval_batch_size is now model.eval.batch_size", "model.tiny_model is now tiny_model",
                     "model.rollout.mode is now model.rollout.schedule", "data.max_staleness is now data.buffer_max_staleness",
                     "data.synthetic is now synthetic_data"):
        assert f"{old}: {expected}" in message


def test_a_run_configuration_saved_before_the_renames_is_migrated_not_refused(tmp_path, capsys):
    """A ``config.yaml`` that ggpo-train saved in a run directory (beside its metrics.csv) is the run's own record:
    its renamed keys move to the new ones (with a warning), the file itself is left as it was."""
    import yaml

    recipe = yaml.safe_load((RECIPES / "quickstart.yaml").read_text())
    recipe["data"]["synthetic"] = recipe.pop("synthetic_data")
    recipe["model"]["rollout"]["mode"] = "sync"
    recipe["data"]["max_staleness"] = 4
    run_dir = tmp_path / "version_0"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step\n")
    saved = run_dir / "config.yaml"
    saved.write_text(yaml.safe_dump(recipe))
    before = saved.read_text()
    with pytest.warns(UserWarning, match="model.rollout.mode -> model.rollout.schedule.*data.synthetic -> synthetic_data"):
        config = print_config(capsys, saved)
    assert config["model"]["rollout"]["schedule"] == "sync" and config["data"]["buffer_max_staleness"] == 4
    assert config["synthetic_data"]["n_train"] == recipe["data"]["synthetic"]["n_train"]
    assert saved.read_text() == before
    copied = tmp_path / "config.yaml"  # the same file outside a run directory is a recipe: refused
    copied.write_text(before)
    with pytest.raises(ValueError, match="model.rollout.mode is now model.rollout.schedule"):
        print_config(capsys, copied)


def test_a_typo_in_a_flag_is_an_error_naming_it():
    with pytest.raises(ValueError, match="unknown key model.betta"):
        run_training(["--config", str(RECIPES / "quickstart.yaml"), "--model.betta", "0.05"])


def test_ggpo_train_help_runs_as_a_program():
    out = subprocess.run([sys.executable, "-c", "from ggpo_lightning.cli.train import train_main; train_main()", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--config", "--print_config", "--model.objective", "--model.eval", "--data.train_path",
                 "--ckpt_path"):
        assert flag in out.stdout


EXPERIMENTS = RECIPES.parent / "experiments"


@pytest.mark.parametrize("grid_file", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_grid_gives_runs_that_parse(grid_file, capsys):
    """Each axis value of every grid in experiments/ appears in at least one run checked with --print_config, so a
    renamed or mistyped key fails here, not hours into a sweep."""
    from ggpo_lightning.lab.sweep import _argv, load_grid

    grid = load_grid(grid_file)
    covered, checked = set(), 0
    for run in grid.runs:
        values = {(axis, value) for axis, value in run.labels.items() if axis != "seed"}
        if values <= covered:
            continue
        covered |= values
        argv = _argv(grid, run)
        config = print_config(capsys, grid.base, extra=tuple(argv[argv.index(str(grid.base)) + 1:]))
        checked += 1
        for key, value in run.overrides.items():  # each override reached the parsed configuration
            node = config
            for part in key.split("."):
                node = node[part]
            assert node == value or str(node) == str(value), (key, node, value)
    assert checked >= 1
