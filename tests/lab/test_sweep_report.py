"""``ggpo sweep`` runs a grid (resumable) and ``ggpo report`` tabulates and plots it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ggpo_lightning.cli.main import main
from ggpo_lightning.lab.report import collect_runs, gain_table, markdown_table
from ggpo_lightning.lab.sweep import load_grid

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


def write_grid(tmp_path: Path, model_dir: Path, **changes) -> Path:
    spec = {
        "base": str(QUICKSTART),
        "out": str(tmp_path / "grid"),
        "seeds": [0],
        "overrides": {
            "model.model_name_or_path": str(model_dir), "tiny_model": None,
            "model.rollout.sampling.max_new_tokens": 3, "data.prompts_per_step": 2,
            "data.train_path": str(tmp_path / "data" / "train.jsonl"),
            "data.val_path": str(tmp_path / "data" / "test.jsonl"),
            "synthetic_data.n_train": 32, "synthetic_data.n_test": 8,
            "trainer.max_steps": 3, "trainer.val_check_interval": 2, "summary.export": False,
        },
        "axes": {"objective": {"ggpo": {"model.objective.name": "ggpo"}, "grpo": {"model.objective.name": "grpo"}},
                 "setting": {"sync2": {"model.rollout.sync_every": 2}}},
        **changes,
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_grid_expands_axes_times_seeds(tmp_path, tiny_model_dir):
    grid = load_grid(write_grid(tmp_path, tiny_model_dir, seeds=[0, 1]))
    assert [r.name for r in grid.runs] == ["ggpo-sync2-seed0", "ggpo-sync2-seed1", "grpo-sync2-seed0",
                                           "grpo-sync2-seed1"]
    assert grid.runs[2].labels == {"objective": "grpo", "setting": "sync2", "seed": 0}
    assert grid.runs[2].overrides["model.objective.name"] == "grpo"
    assert grid.runs[2].overrides["trainer.max_steps"] == 3  # grid-wide overrides apply to every run


def test_seed_placeholders_give_each_seed_its_own_values(tmp_path, tiny_model_dir):
    axes = {"objective": {"ggpo": {"model.objective.name": "ggpo", "tiny_model.seed": "{seed}"}},
            "setting": {"sync2": {"model.model_name_or_path": "runs/g/tiny-seed{seed}", "x.levels": ["{seed}", 2]}}}
    grid = load_grid(write_grid(tmp_path, tiny_model_dir, seeds=[0, 3], axes=axes))
    assert [r.overrides["model.model_name_or_path"] for r in grid.runs] == ["runs/g/tiny-seed0", "runs/g/tiny-seed3"]
    assert [r.overrides["tiny_model.seed"] for r in grid.runs] == ["0", "3"]
    assert grid.runs[1].overrides["x.levels"] == ["3", 2] and grid.runs[1].overrides["trainer.max_steps"] == 3


def test_excluded_cells_are_not_part_of_the_grid(tmp_path, tiny_model_dir):
    """An ``exclude`` entry drops the runs matching all its keys (a value or a list per axis, or seeds): a grid file
    says which cells were trimmed, and the sweep runs exactly the rest."""
    axes = {"objective": {"ggpo": {}, "grpo": {}, "grpo-tis": {}}, "setting": {"sync4": {}, "sync64": {}}}
    exclude = [{"objective": ["grpo", "grpo-tis"], "seed": [1, 2]}, {"objective": "ggpo", "setting": "sync64",
                                                                      "seed": 2}]
    grid = load_grid(write_grid(tmp_path, tiny_model_dir, seeds=[0, 1, 2], axes=axes, exclude=exclude))
    assert [r.name for r in grid.runs] == ["ggpo-sync4-seed0", "ggpo-sync4-seed1", "ggpo-sync4-seed2",
                                           "ggpo-sync64-seed0", "ggpo-sync64-seed1", "grpo-sync4-seed0",
                                           "grpo-sync64-seed0", "grpo-tis-sync4-seed0", "grpo-tis-sync64-seed0"]
    assert grid.runs[4].labels == {"objective": "ggpo", "setting": "sync64", "seed": 1}


def test_an_included_grid_gives_what_the_including_one_leaves_out(tmp_path, tiny_model_dir):
    """``include``: the included grid's base, out, seeds and overrides hold (this file's overrides win key by key);
    an axis this file gives replaces that axis in its place, and a value named without overrides (``name:`` or a
    list of names) is the included grid's; the included ``exclude`` does not carry over."""
    parent = write_grid(tmp_path, tiny_model_dir, seeds=[0, 1],
                        axes={"setting": {"sync2": {"model.rollout.sync_every": 2}},
                              "objective": {"ggpo": {"model.objective.name": "ggpo"},
                                            "grpo": {"model.objective.name": "grpo", "model.objective.beta": 0.0}}},
                        exclude=[{"objective": "grpo", "seed": 1}])
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "long.yaml"
    child.write_text(yaml.safe_dump({
        "include": "../grid.yaml", "overrides": {"trainer.max_steps": 9},
        "axes": {"setting": {"sync4": {"model.rollout.sync_every": 4}},
                 "objective": {"grpo": None, "grpo-kl": {"model.objective.name": "grpo"}}}}, sort_keys=False))
    grid, included = load_grid(child), load_grid(parent)
    assert (grid.base, grid.out) == (included.base, included.out)
    # the included grid's axis order (write_grid's file lists objective first), whatever order this file gives
    assert [r.name for r in grid.runs] == ["grpo-sync4-seed0", "grpo-sync4-seed1", "grpo-kl-sync4-seed0",
                                           "grpo-kl-sync4-seed1"]
    assert grid.runs[1].overrides == {**included.runs[-1].overrides, "trainer.max_steps": 9,
                                      "model.rollout.sync_every": 4}
    child.write_text(yaml.safe_dump({"include": "../grid.yaml", "axes": {"objective": ["grpo"]}}))
    assert [r.name for r in load_grid(child).runs] == ["grpo-sync2-seed0", "grpo-sync2-seed1"]


@pytest.mark.parametrize("child,message", [
    ({"include": "../grid.yaml", "axes": {"objective": ["gpro"]}},
     "axes.objective.gpro: the included grid has no such value; its axes.objective: ggpo, grpo"),
    ({"include": "../none.yaml"}, "include: grid file"),
    ({"include": "long.yaml"}, "includes this file again (a cycle)"),
    ({"axes": {"objective": {"ggpo": None}}, "base": "../grid.yaml", "out": "x"}, "axes.objective.ggpo must map"),
])
def test_bad_includes_name_the_including_file(tmp_path, tiny_model_dir, child, message):
    write_grid(tmp_path, tiny_model_dir)
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "long.yaml"
    path.write_text(yaml.safe_dump(child))
    result = CliRunner().invoke(main, ["sweep", "--dry-run", str(path)])
    assert result.exit_code != 0 and message in result.output and str(path) in result.output, result.output


def test_shards_split_a_grid_into_disjoint_runs(tmp_path, tiny_model_dir):
    grid_file = write_grid(tmp_path, tiny_model_dir, seeds=[0, 1, 2])
    planned = [CliRunner().invoke(main, ["sweep", str(grid_file), "--dry-run", "--shard", f"{i}/2"]) for i in (1, 2)]
    names = [{line.split(": ")[0].split("] ")[1] for line in p.output.splitlines() if line.startswith("[")}
             for p in planned]
    assert names[0] == {"ggpo-sync2-seed0", "ggpo-sync2-seed2", "grpo-sync2-seed1"}
    assert names[1] == {"ggpo-sync2-seed1", "grpo-sync2-seed0", "grpo-sync2-seed2"}
    bad = CliRunner().invoke(main, ["sweep", str(grid_file), "--shard", "3/2"])
    assert bad.exit_code != 0 and "--shard must be I/N" in bad.output


@pytest.mark.parametrize("change,message", [
    ({"seeds": []}, "seeds must be a non-empty list"),
    ({"axes": {}}, "axes must map"),
    ({"base": "nope.yaml"}, "base recipe 'nope.yaml' not found"),
    ({"colour": 1}, "unknown field"),
    ({"axes": {"objective": {"ggpo": "ggpo"}}}, "axes.objective.ggpo must map"),
    ({"axes": {"seed": {"a": {}}}}, "axes.seed: 'seed' is the seeds' label"),
    ({"exclude": {"objective": "grpo"}}, "exclude must be a list"),
    ({"exclude": [{}]}, "exclude[0] must map axis names"),
    ({"exclude": [{"objective": "grpo"}, {"optimizer": "adam"}]}, "exclude[1]: 'optimizer' is not an axis"),
    ({"exclude": [{"objective": ["grpo", "gpro"]}]}, "exclude[0].objective: 'gpro' is not one of ['ggpo', 'grpo']"),
    ({"exclude": [{"seed": 7}]}, "exclude[0].seed: 7 is not one of [0]"),
])
def test_bad_grid_files_name_the_field(tmp_path, tiny_model_dir, change, message):
    path = write_grid(tmp_path, tiny_model_dir, **change)
    result = CliRunner().invoke(main, ["sweep", str(path)])
    assert result.exit_code != 0 and message in result.output and str(path) in result.output


def test_sweep_runs_resumes_and_reports(tmp_path, tiny_model_dir):
    grid_file = write_grid(tmp_path, tiny_model_dir)
    first = CliRunner().invoke(main, ["sweep", str(grid_file)])
    assert first.exit_code == 0, first.output
    assert "2 runs: 2 ran" in first.output
    out = tmp_path / "grid"
    for name in ("ggpo-sync2-seed0", "grpo-sync2-seed0"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["optimizer_steps"] == 3 and summary["objective"] == name.split("-")[0]

    # interrupted before its summary: that run starts over, the finished one is skipped
    (out / "grpo-sync2-seed0" / "summary.json").unlink()
    again = CliRunner().invoke(main, ["sweep", str(grid_file)])
    assert again.exit_code == 0, again.output
    assert "ggpo-sync2-seed0: done, skipped" in again.output and "starting over" in again.output

    runs, errors = collect_runs([out])
    assert not errors and sorted(r.objective for r in runs) == ["ggpo", "grpo"]
    for run in runs:
        assert run.setting == "sync2" and run.seed == 0
        assert [step for step, _ in run.accuracy] == [0, 2, 3]  # before training, at step 2, after
        assert run.final_accuracy == json.loads((run.path / "summary.json").read_text())["accuracy_after"]
        assert len(run.reward) == 3 and run.accuracy_by_samples[-1][0] > 0
        assert len(run.drift) == 3  # KL(mu || pi) logged at every step

    unfinished = out / "ggpo-sync2-seed0" / "summary.json"
    saved = unfinished.read_text()
    unfinished.unlink()
    partial = CliRunner().invoke(main, ["report", str(out)])
    assert partial.exit_code == 0 and "left out, unfinished" in partial.output and "ggpo-sync2-seed0" in partial.output
    assert "| ggpo |" not in partial.output and "| grpo |" in partial.output
    unfinished.write_text(saved)
    starting = out / "ggpo-sync4-seed0"  # a sweep's next run, started but not logging yet
    starting.mkdir()
    (starting / "grid_run.json").write_text(json.dumps({"objective": "ggpo", "setting": "sync4", "seed": 0}))
    in_progress = CliRunner().invoke(main, ["report", str(out)])
    assert in_progress.exit_code == 0 and "left out, unfinished" in in_progress.output
    assert "ggpo-sync4-seed0" in in_progress.output and "| ggpo |" in in_progress.output
    shutil.rmtree(starting)

    (tmp_path / "not-a-run").mkdir()
    report = CliRunner().invoke(main, ["report", str(out), str(tmp_path / "not-a-run"),
                                       "--out", str(tmp_path / "report")])
    assert report.exit_code == 1  # one bad directory: named, the others still reported
    assert "not-a-run: no metrics.csv" in report.output
    assert "| ggpo |" in report.output and "| grpo |" in report.output
    assert {p.name for p in (tmp_path / "report").iterdir()} == {
        "report.md", "accuracy_vs_steps.png", "accuracy_vs_samples.png", "reward_vs_steps.png", "drift_vs_steps.png",
        "coverage_vs_steps.png"}
    written = (tmp_path / "report" / "report.md").read_text()
    for title in ("Gain over the starting model", "KL(mu || pi)", "Drift per token", "lower bound on log C",
                  "Effective sample size", "Mean response length"):
        assert title in written


def test_only_completed_runs_are_done_interrupted_ones_start_over_and_aborted_ones_stay_failed(tmp_path,
                                                                                               tiny_model_dir):
    """A run stopped by a signal writes summary.json too (status interrupted, a checkpoint): not done, it runs again;
    a run aborted by an error of its own is not rerun but counted failed, with its reason, so the sweep exits 1."""
    from ggpo_lightning.lab.sweep import load_grid, run_grid

    grid = load_grid(write_grid(tmp_path, tiny_model_dir,
                                axes={"objective": {name: {"model.objective.name": "grpo"} for name in
                                                    ("a", "b", "c", "d")}}))
    for run, status in zip(grid.runs, ("completed", "interrupted", "aborted")):
        (grid.out / run.name).mkdir(parents=True)
        (grid.out / run.name / "summary.json").write_text(json.dumps({"status": status, "reason": "zero reward"}))
    lines = []
    results = run_grid(grid, dry_run=True, echo=lines.append)
    assert [status for _, status in results] == ["done", "planned", "failed (earlier)", "planned"]
    aborted = grid.runs[2].name
    assert any(f"{aborted}: FAILED earlier (zero reward), skipped; delete" in line for line in lines)
    cli = CliRunner().invoke(main, ["sweep", "--dry-run", str(tmp_path / "grid.yaml")])
    assert cli.exit_code == 1 and f"1 failed: {aborted}" in cli.output and "1 done" in cli.output


def test_table_is_mean_and_sample_std_over_seeds(tmp_path):
    from ggpo_lightning.lab.report import Run

    runs = [Run(tmp_path, "ggpo", "sync1", s, a) for s, a in enumerate([0.5, 0.6, 0.7])]
    runs.append(Run(tmp_path, "grpo", "offline", 0, 0.25))
    table = markdown_table(runs, ["sync1", "offline"])
    assert "| ggpo | 60.0 ± 10.0 (n=3) | – |" in table
    assert "| grpo | – | 25.0 ± 0.0 (n=1) |" in table
    for run, start in zip(runs, [0.4, 0.3, 0.6, None]):  # seeds warmed up to models of their own
        run.start_accuracy = start
    gains = gain_table(runs, ["sync1", "offline"])  # gains 10, 30, 10 points; none without a start
    assert "| ggpo | 16.7 ± 11.5 (n=3) | – |" in gains and "| grpo | – | – |" in gains


def test_step_mean_tables_and_curves_carry_the_spread_over_seeds(tmp_path):
    """Each run's metrics.csv is averaged over its steps (an empty or non-finite cell is no value), then mean ± sample
    std over seeds."""
    from ggpo_lightning.lab.report import Run, _mean_curve, step_mean_table

    for seed, (kl, length) in enumerate([(0.1, 40), (0.2, 60), (0.3, 80)]):
        run = tmp_path / f"ggpo-sync8-seed{seed}"
        run.mkdir()
        header = "step,train/kl_behavior_k1,train/response_length,train/coverage_log_ratio_p95\n"
        (run / "metrics.csv").write_text(header + f"0,{kl},{length},\n1,{3 * kl},{length + 10},inf\n2,,,0.5\n")
        (run / "summary.json").write_text(json.dumps({"objective": "ggpo", "recipe": "sync8", "accuracy_after": 0.5}))
    runs, errors = collect_runs([tmp_path])
    assert not errors and [r.drift for r in runs][0] == [(0, 0.1), (1, pytest.approx(0.3))]
    # per-run means of the KL 0.2, 0.4, 0.6 -> 0.4 ± 0.2; of the length 45, 65, 85 -> 65 ± 20; p95 0.5 (inf skipped)
    assert "| ggpo | 0.400 ± 0.200 |" in step_mean_table(runs, "kl_behavior_k1")
    assert "| ggpo | 65.0 ± 20.0 |" in step_mean_table(runs, "response_length")
    assert "| ggpo | 0.50 ± 0.00 |" in step_mean_table(runs, "coverage_log_ratio_p95")
    assert "| ggpo | – |" in step_mean_table(runs, "coverage_ess_share")
    assert Run(tmp_path, "grpo", "sync8", 0, 0.5).step_means == {}
    xs, mean, std = _mean_curve([[(0, 1.0), (1, 2.0)], [(0, 3.0), (1, 2.0)], [(1, 5.0)]])
    assert xs == [1] and mean == [3.0] and std == [pytest.approx(3 ** 0.5)]  # x = 0 is not shared by all


def test_hand_made_runs_of_the_paper_preset_are_reported_beside_the_shipped_ggpo(tmp_path):
    """Both presets have the objective name ``ggpo`` (GRPO and its corrections ``grpo``); a run without grid labels is
    told apart by its recipe."""
    for recipe, accuracy in (("quickstart+ggpo-paper", 0.4), ("quickstart", 0.8), ("quickstart+grpo", 0.7),
                             ("quickstart+grpo-icepop", 0.6)):
        run = tmp_path / recipe
        run.mkdir()
        (run / "metrics.csv").write_text("step,train/reward\n0,0.5\n")
        (run / "summary.json").write_text(json.dumps({"recipe": recipe, "objective": recipe.partition("+")[2][:4]
                                                      or "ggpo", "accuracy_after": accuracy}))
    runs, errors = collect_runs([tmp_path])
    assert not errors and {r.objective: r.final_accuracy for r in runs} == {"ggpo": 0.8, "ggpo-paper": 0.4,
                                                                            "grpo": 0.7, "grpo-icepop": 0.6}
    table = markdown_table(runs, None)
    assert table.index("| ggpo |") < table.index("| ggpo-paper |") < table.index("| grpo |") \
        < table.index("| grpo-icepop |")
    assert table.index("| ggpo |") < table.index("| ggpo-paper |") < table.index("| grpo |")


def test_report_without_matplotlib_writes_the_tables_and_says_the_plots_were_skipped(tmp_path, monkeypatch):
    """Issue 40: ``ggpo report --out`` wrote nothing when plots could not be made."""
    import sys

    for seed in (0, 1):
        run = tmp_path / "runs" / f"ggpo-sync1-seed{seed}"
        run.mkdir(parents=True)
        (run / "grid_run.json").write_text(json.dumps({"objective": "ggpo", "setting": "sync1", "seed": seed}))
        (run / "metrics.csv").write_text("step,train/reward,val/accuracy\n0,0.5,\n1,0.75,0.5\n")
        (run / "summary.json").write_text(json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.5 + seed / 4,
                                                      "optimizer_steps": 2, "generated_samples": 32}))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / "report").iterdir()] == ["report.md"]
    written = (tmp_path / "report" / "report.md").read_text()
    assert "| ggpo | 62.5 ± 17.7 (n=2) |" in written and "![" not in written
    assert "plots skipped: matplotlib is not installed (pip install 'ggpo-lightning[plot]')" in result.stderr


def test_a_dry_run_prints_commands_a_shell_runs_as_the_sweep_would(tmp_path, tiny_model_dir):
    """Issue 40: the dry run printed the empty ``version`` argument as nothing, which a shell cannot take back."""
    import shlex

    from ggpo_lightning.lab.sweep import _argv

    axes = {"objective": {"ggpo": {"model.objective.name": "ggpo", "data.prompt_template": "Q: {prompt}"},
                          "grpo": {"model.objective.name": "grpo"}},
            "setting": {"sync2": {"model.rollout.sync_every": 2}}}
    grid_file = write_grid(tmp_path, tiny_model_dir, axes=axes)
    grid = load_grid(grid_file)
    planned = CliRunner().invoke(main, ["sweep", str(grid_file), "--dry-run"])
    commands = [line.split(": ", 1)[1] for line in planned.output.splitlines() if line.startswith("[")]
    assert len(commands) == len(grid.runs) == 2
    for command, run in zip(commands, grid.runs):
        assert shlex.split(command) == ["ggpo-train", *_argv(grid, run)[3:]]  # "" and spaces survive the shell
    assert "--trainer.logger.init_args.version ''" in commands[0] and "'Q: {prompt}'" in commands[0]


def test_ggpos_lead_is_paired_by_seed_against_the_best_rival_of_each_setting(tmp_path):
    """The rival is the one of GRPO and its corrections with the best mean accuracy in the setting over the seeds all
    ran; the lead is the per-seed difference (seeds share a starting model), over the seeds both ran; the staleness
    is the setting's runs' mean of train/staleness; the CLI writes the table and, for --lead-plot settings, the
    plot."""
    from ggpo_lightning.lab.report import leads

    accuracies = {("sync1", "ggpo"): [0.80, 0.90], ("sync1", "grpo"): [0.70, 0.70], ("sync1", "grpo-tis"): [0.75, 0.85],
                  ("sync16", "ggpo"): [0.60, 0.70, 0.95], ("sync16", "grpo-icepop"): [0.70, 0.50],
                  ("sync16", "ggpo-paper"): [0.5, 0.5], ("offline", "ggpo"): [0.4],
                  ("sync4", "ggpo"): [0.8, 0.8, 0.8], ("sync4", "grpo"): [0.9, 0.6, 0.6],
                  ("sync4", "grpo-opsm"): [0.85],
                  ("sync64", "ggpo"): [0.8, 0.8, 0.8], ("sync64", "grpo"): [0.9, 0.6, 0.6],
                  ("sync64", "grpo-tis"): [0.85, 0.85, 0.85], ("sync64", "grpo-opsm"): [0.9]}
    staleness = {"sync1": "0.0", "sync16": "7.0", "offline": "", "sync4": "1.5", "sync64": "30.0"}
    for (setting, objective), values in accuracies.items():
        for seed, accuracy in enumerate(values):
            run = tmp_path / f"{setting}-{objective}-seed{seed}"
            run.mkdir()
            extra = 1.0 if objective == "ggpo" and setting == "sync16" else 0.0
            (run / "metrics.csv").write_text(f"step,train/staleness\n0,{staleness[setting]}\n1,"
                                             f"{float(staleness[setting] or 0) + extra if staleness[setting] else ''}\n")
            (run / "grid_run.json").write_text(json.dumps({"objective": objective, "setting": setting, "seed": seed}))
            (run / "summary.json").write_text(json.dumps({"objective": objective[:4], "accuracy_after": accuracy}))
    runs, errors = collect_runs([tmp_path])
    assert not errors
    sync1, sync4, sync16, sync64 = leads(runs, "ggpo", ["sync1", "sync4", "sync16", "sync64", "offline"])
    # offline: no rival ran
    assert (sync1.setting, sync1.rival, sync1.staleness) == ("sync1", "grpo-tis", 0.0)
    assert sync1.differences == pytest.approx([0.05, 0.05])
    # opsm ran seed 0 only, where grpo beat it: grpo is the best rival, though opsm's one seed has the higher mean,
    # and the lead is paired over all of grpo's seeds
    assert sync4.rival == "grpo" and sync4.differences == pytest.approx([-0.1, 0.2, 0.2])
    # opsm trimmed to seed 0 does not narrow the ranking to seed 0 (where grpo's 0.9 would beat tis's 0.85):
    # grpo and tis, both on 3 seeds, are ranked over those
    assert sync64.rival == "grpo-tis" and sync64.differences == pytest.approx([-0.05, -0.05, -0.05])
    # icepop the only rival; ggpo's seed 2 has no icepop pair (left out of the lead and of the accuracies shown);
    # ggpo's runs have a mean staleness of 7.5, the others 7
    assert sync16.rival == "grpo-icepop" and sync16.differences == pytest.approx([-0.1, 0.2])
    assert (sync16.leader_accuracy, sync16.rival_accuracy) == (pytest.approx(0.65), pytest.approx(0.6))
    assert sync16.staleness == pytest.approx((7.5 * 3 + 7.0 * 4) / 7)
    assert [lead.differences for lead in leads(runs, "ggpo-paper")] == [pytest.approx([-0.2, 0.0])]
    out = tmp_path / "report"
    report = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(out), "--settings", "sync1,sync16",
                                       "--lead-plot", "sync1,sync16"])
    assert report.exit_code == 0, report.output
    assert "| ggpo | sync1 | 0.00 | grpo-tis | 80.0 | 85.0 | 5.0 ± 0.0 (n=2) |" in report.output
    assert "| ggpo | sync16 | 7.21 | grpo-icepop | 60.0 | 65.0 | 5.0 ± 21.2 (n=2) |" in report.output
    assert "| ggpo-paper | sync16 |" in report.output
    assert (out / "lead_vs_staleness.png").stat().st_size > 0 and "lead_vs_staleness" in (out / "report.md").read_text()


def test_ggpos_lead_over_each_lagged_data_objective_is_its_own_row_and_line(tmp_path):
    """OAPL, M2PO, prime-rl's loss and VESPO are not folded into the best of GRPO and its corrections: GGPO's lead
    over each is paired by seed in a table of its own and drawn as a line of its own; a run made by hand with a
    family overlay is reported under the overlay's name; a variant of a family objective (a grid label
    ``oapl-beta0.04``) gets a row of its own after it."""
    from ggpo_lightning.lab.report import family_lead_table, leads

    accuracies = {("sync1", "ggpo"): [0.90, 0.94], ("sync1", "oapl"): [0.80, 0.90], ("sync1", "grpo-tis"): [0.9, 0.9],
                  ("sync64", "ggpo"): [0.60, 0.62], ("sync64", "oapl"): [0.70, 0.74], ("sync64", "m2po"): [0.50],
                  ("sync64", "grpo-tis"): [0.61, 0.61], ("sync64", "oapl-beta0.04"): [0.65, 0.70]}
    for (setting, objective), values in accuracies.items():
        for seed, accuracy in enumerate(values):
            run = tmp_path / f"{setting}-{objective}-seed{seed}"
            run.mkdir()
            (run / "metrics.csv").write_text(f"step,train/staleness\n0,{30.0 if setting == 'sync64' else 0.0}\n")
            (run / "grid_run.json").write_text(json.dumps({"objective": objective, "setting": setting, "seed": seed}))
            (run / "summary.json").write_text(json.dumps({"objective": objective, "accuracy_after": accuracy}))
    by_hand = tmp_path / "by-hand"
    by_hand.mkdir()
    (by_hand / "metrics.csv").write_text("step\n0\n")
    (by_hand / "summary.json").write_text(json.dumps({"objective": "oapl", "recipe": "reasoning-cpu+oapl",
                                                      "accuracy_after": 0.5}))
    runs, errors = collect_runs([tmp_path])
    assert not errors and {r.objective for r in runs if r.path == by_hand} == {"oapl"}
    runs = [r for r in runs if r.path != by_hand]
    assert [lead.rival for lead in leads(runs, "ggpo", ["sync1", "sync64"])] == ["grpo-tis", "grpo-tis"]
    sync1, sync64 = leads(runs, "ggpo", ["sync1", "sync64"], ("oapl",))
    assert sync1.differences == pytest.approx([0.10, 0.04]) and sync64.differences == pytest.approx([-0.10, -0.12])
    table = family_lead_table(runs, settings_order=["sync1", "sync64"])
    assert "| ggpo | sync64 | 30.00 | oapl | 72.0 | 61.0 | -11.0 ± 1.4 (n=2) |" in table
    assert "| ggpo | sync64 | 30.00 | m2po | 50.0 | 60.0 | 10.0 ± 0.0 (n=1) |" in table
    assert "vespo" not in table
    variant = "| ggpo | sync64 | 30.00 | oapl-beta0.04 | 67.5 | 61.0 | -6.5 ± 2.1 (n=2) |"
    assert variant in table and table.index("| oapl |") < table.index(variant) < table.index("| m2po |")
    out = tmp_path / "report"
    report = CliRunner().invoke(main, ["report", *(str(r.path) for r in runs), "--out", str(out),
                                       "--settings", "sync1,sync64", "--lead-plot", "sync1,sync64"])
    assert report.exit_code == 0, report.output
    assert "## GGPO's lead over each objective that also embraces lagged data" in report.output
    assert "| ggpo | sync1 | 0.00 | oapl | 85.0 | 92.0 | 7.0 ± 4.2 (n=2) |" in report.output
    assert (out / "lead_vs_staleness.png").stat().st_size > 0


def test_a_run_that_completes_as_the_signal_arrives_is_reported_completed_not_interrupted(tmp_path, tiny_model_dir):
    """The signal can land while a finished run is exiting: its summary says completed and a later sweep skips it,
    so the sweep says so (and counts it ran) instead of calling it stopped; the next run is still not started."""
    from ggpo_lightning.lab import sweep

    grid = load_grid(write_grid(tmp_path, tiny_model_dir))

    class FinishesAsSignalled:
        received = None

        def run(self, argv, log):
            (grid.out / grid.runs[0].name / "summary.json").write_text(json.dumps({"status": "completed"}))
            self.received = signal.SIGTERM
            return 0

    lines = []
    with pytest.raises(sweep.SweepStopped) as stopped:
        sweep._run_grid(grid, False, lines.append, (0, 1), FinishesAsSignalled())
    assert [status for _, status in stopped.value.results] == ["ran"]
    assert lines[-1] == f"[1/2] {grid.runs[0].name}: completed as SIGTERM arrived; a later sweep skips it"
    assert not (grid.out / grid.runs[1].name).exists()


def test_a_signal_to_the_sweep_ends_the_run_in_progress_and_starts_no_other(tmp_path, tiny_model_dir):
    """SIGTERM to ``ggpo sweep`` reaches the run in progress, which ends its step and says ``interrupted``; the sweep
    waits for it, starts no further run and exits 128 + 15, so no run outlives it to race a restarted sweep."""
    grid_file = write_grid(tmp_path, tiny_model_dir)
    spec = yaml.safe_load(grid_file.read_text())
    # a run that goes on until signalled: the tiny model never scores, and the zero-reward check would end it
    # (`aborted`) 20 steps in, about a second, which a loaded machine lets pass before the signal
    spec["overrides"].update({"trainer.max_steps": 100_000, "trainer.val_check_interval": 100_000,
                              "trainer.logger.init_args.flush_logs_every_n_steps": 1,
                              "model.verifier_health.max_zero_reward_steps": None})
    grid_file.write_text(yaml.safe_dump(spec))
    first = tmp_path / "grid" / "ggpo-sync2-seed0"
    ggpo = [sys.executable, "-c", "from ggpo_lightning.cli.main import main; main()"]
    sweep = subprocess.Popen([*ggpo, "sweep", str(grid_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.monotonic() + 180
        # three logged steps: the signal reaches a run in training, past its start-up
        while not ((first / "metrics.csv").is_file() and (first / "metrics.csv").read_text().count("\n") > 3):
            assert sweep.poll() is None and time.monotonic() < deadline, "the first run never logged a step"
            time.sleep(0.5)
        sweep.send_signal(signal.SIGTERM)
        output, _ = sweep.communicate(timeout=120)
    finally:
        sweep.kill()
    assert sweep.returncode == 128 + signal.SIGTERM, output
    summary = json.loads((first / "summary.json").read_text())  # written by the run itself, before the sweep exited
    assert summary["status"] == "interrupted" and summary["reason"] == "stopped by SIGTERM", summary
    assert Path(summary["checkpoint"]).is_file()
    assert "ggpo-sync2-seed0: stopped by SIGTERM" in output and "1 runs: 1 interrupted" in output
    assert not (tmp_path / "grid" / "grpo-sync2-seed0").exists()  # the next run was never started
