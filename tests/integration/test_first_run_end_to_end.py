"""A new user's first run end to end (issue 25): standard math files converted, the 1.7B recipe's data and template
settings trained for 2 steps on a tiny Qwen3-shaped model on CPU, the run evaluated with its own settings; and the
README's GPU command as written (plus a local model and the CPU), through the preflight and one step."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from first_run_data import gsm8k_records, math_records
from ggpo_lightning.cli.main import main
from ggpo_lightning.cli.train import run_training

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "qwen3-1.7b-math.yaml"


SMALL_RUN = ("--trainer.max_steps", "2", "--data.prompts_per_step", "4", "--model.rollout.k", "2",
             "--model.rollout.sampling.max_new_tokens", "6", "--model.eval.max_new_tokens", "5")
"""Small enough for CPU; the recipe's data, prompt template, verifier and objective stay as they are."""


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def ggpo(*args: str):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def test_convert_train_and_evaluate_with_the_runs_settings(tmp_path, qwen3_model_dir):
    math_raw = write_jsonl(tmp_path / "MATH-train.jsonl", math_records(20))
    gsm_raw = write_jsonl(tmp_path / "gsm8k-test.jsonl", gsm8k_records(20))
    ggpo("data", "convert", "--format", "math", math_raw, tmp_path / "data" / "math.jsonl")
    ggpo("data", "convert", "--format", "gsm8k", gsm_raw, tmp_path / "data" / "gsm8k.jsonl")
    cli = run_training([
        "--config", str(RECIPE),
        "--data.train_path", str(tmp_path / "data" / "math.jsonl"),
        "--data.val_path", str(tmp_path / "data" / "gsm8k.jsonl"), "--data.val_size", "4",
        "--model.model_name_or_path", str(qwen3_model_dir), "--trainer.accelerator", "cpu",
        "--model.rollout.engine", "hf",  # the recipe's fallback: vLLM is not in this venv
        *SMALL_RUN, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
    ])
    run_dir = Path(cli.trainer.log_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == 2 and summary["recipe"] == "qwen3-1.7b-math"
    assert (run_dir / "final_model" / "config.json").is_file()
    recipe = yaml.safe_load(RECIPE.read_text())
    report_path = tmp_path / "eval.json"
    result = ggpo("eval", run_dir, tmp_path / "data" / "math.jsonl", "--limit", "3", "--json", report_path)
    settings = json.loads(report_path.read_text())["settings"]
    assert settings["template"] == recipe["data"]["prompt_template"]  # the run's, not {prompt}
    assert settings["max_new_tokens"] == 5 and settings["verifier"] == recipe["model"]["verifier"] == "math"
    assert "math  " in result.output and json.loads(report_path.read_text())["benchmarks"][0]["problems"] == 3


def readme_command(program: str, marker: str) -> list[str]:
    """The README's one command line that starts with ``program`` and carries the comment ``marker``, as argv
    (comment dropped): the test runs what the README says, and follows it when it changes."""
    readme = (ROOT / "README.md").read_text()
    lines = [line for line in readme.splitlines() if line.startswith(program + " ") and line.endswith(marker)]
    assert len(lines) == 1, f"README.md: expected one '{program} ... {marker}' line, found {lines}"
    return shlex.split(lines[0], comments=True)


@pytest.mark.slow
def test_the_readme_gpu_command_as_written_runs_one_step_on_cpu(tmp_path, qwen3_model_dir, monkeypatch):
    """The README's ``ggpo data convert ...`` and ``ggpo-train --config recipes/qwen3-1.7b-math.yaml ... # no vLLM``
    lines as written (the GPU line with the HF engine: vLLM is not in this venv), in a folder holding ``recipes/``, plus only a local model, the CPU and one step: the recipe's
    own batch (32 prompts x K=8) and lengths (1024 new tokens) through the preflight and one update."""
    convert = readme_command("ggpo data convert", "# the schema (docs/data.md)")
    train = readme_command("ggpo-train --config recipes/qwen3-1.7b-math.yaml", "# no vLLM")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    write_jsonl(tmp_path / convert[-2], math_records(40))  # the input file the README names
    ggpo(*convert[1:])
    cli = run_training([*train[1:], "--model.model_name_or_path", str(qwen3_model_dir),
                        "--trainer.accelerator", "cpu", "--trainer.max_steps", "1"])
    run_dir = Path(cli.trainer.log_dir)
    assert run_dir.resolve().parent == (tmp_path / "runs" / "qwen3-1.7b-math").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == 1 and summary["recipe"] == "qwen3-1.7b-math"


@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_finds_its_recipes_and_runs_convert_train_eval(tmp_path, qwen3_model_dir):
    """The wheel installed alone in a new venv, used from a folder outside the repository: ``ggpo recipes list`` and
    ``copy``, ``ggpo-train --print_config`` on the copied recipe, then convert, 2 steps and ``ggpo eval``.

    What it proves: the wheel's own contents (both packages, the recipes as package data, the console scripts and
    the verifier entry points) work with no source tree in reach. What it does not: that pip resolves the declared
    dependencies. They are this interpreter's (a ``.pth`` line naming its site-packages folders; nothing is
    downloaded), not a fresh resolution of pyproject.toml's ranges.
    """
    wheels = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps", "-q",
                    next(wheels.glob("ggpo_lightning-*.whl"))], check=True, capture_output=True, timeout=300)
    # the dependencies: this interpreter's site-packages folders as plain path lines (their own .pth files, such
    # as an editable install's finder pointing at the source tree, are not run)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # (the project's own .venv lies inside the checkout: a site-packages folder is a dependency folder wherever it is)
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("".join(p + "\n" for p in deps))
    work = tmp_path / "user"
    work.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def run(program: str, *args: str) -> str:
        result = subprocess.run([venv / "bin" / program, *map(str, args)], cwd=work, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, f"{program} {' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    where = run("python", "-c", "import ggpo_lightning, ggpo_verifiers; print(ggpo_lightning.__file__); "
                                "print(ggpo_verifiers.__file__)").split()
    assert all(Path(f).is_relative_to(site) for f in where), where  # the wheel's copy, not the source tree
    assert "qwen3-1.7b-math" in run("ggpo", "recipes", "list")
    run("ggpo", "recipes", "copy", "qwen3-1.7b-math")
    assert (work / "qwen3-1.7b-math.yaml").read_text() == RECIPE.read_text()
    assert "prompt_template" in run("ggpo-train", "--config", "qwen3-1.7b-math.yaml", "--print_config")
    write_jsonl(work / "MATH-train.jsonl", math_records(20))
    run("ggpo", "data", "convert", "--format", "math", "MATH-train.jsonl", "math.jsonl")
    run("ggpo-train", "--config", "qwen3-1.7b-math.yaml", "--data.train_path", "math.jsonl",
        "--model.model_name_or_path", qwen3_model_dir, "--trainer.accelerator", "cpu",
        "--model.rollout.engine", "hf", *SMALL_RUN)  # the recipe's fallback: vLLM is not in this venv
    run_dir = next((work / "runs" / "qwen3-1.7b-math").glob("version_*"))
    assert json.loads((run_dir / "summary.json").read_text())["optimizer_steps"] == 2
    run("ggpo", "eval", run_dir, "math.jsonl", "--limit", "3", "--json", "eval.json")
    report = json.loads((work / "eval.json").read_text())
    assert report["settings"]["verifier"] == "math" and report["benchmarks"][0]["problems"] == 3
