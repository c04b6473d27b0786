"""Benchmarks by name (issue 25): MATH-500, AIME 2024, AMC 2023, Minerva Math and OlympiadBench read from local
files in their usual layouts, scored with the paper's template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ggpo_lightning.cli.eval import eval_command
from ggpo_lightning.evaluation.benchmarks import BENCHMARKS, PAPER_TEMPLATE, load_named_benchmark
from ggpo_lightning.records.errors import SettingsError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "qwen3-1.7b-math.yaml"
LAYOUTS = {  # one row each, as the hub copies have them
    "math500": {"problem": "What is $1+1$?", "solution": "So $\\boxed{2}$.", "answer": "2", "subject": "Algebra"},
    "aime2024": {"id": 60, "problem": "Find 3*7.", "solution": "\\boxed{21}", "answer": "21", "year": 2024},
    "amc2023": {"question": "What is 5-2?", "answer": 3.0},
    "minerva_math": {"question": "Half of 1?", "answer": "\\frac{1}{2}"},
    "olympiadbench": {"question": "Both roots of x^2=4?", "final_answer": ["$2$", "$-2$"]},
}
GOLDS = {"math500": "2", "aime2024": "21", "amc2023": "3.0", "minerva_math": "\\frac{1}{2}",
         "olympiadbench": "$2$, $-2$"}


def write(path: Path, record: dict) -> Path:
    path.write_text(json.dumps(record) + "\n")
    return path


def test_the_paper_template_is_the_math_recipes():
    assert PAPER_TEMPLATE == yaml.safe_load(RECIPE.read_text())["data"]["prompt_template"]
    assert set(BENCHMARKS) == set(LAYOUTS)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_benchmark_reads_its_usual_layout(name, tmp_path):
    benchmark, rows = load_named_benchmark(name, write(tmp_path / f"{name}.jsonl", LAYOUTS[name]))
    assert [r.gold for r in rows] == [GOLDS[name]]
    assert rows[0].prompt == (LAYOUTS[name].get("problem") or LAYOUTS[name]["question"])
    assert benchmark.template == PAPER_TEMPLATE


def test_an_unknown_benchmark_names_the_known_ones(tmp_path):
    with pytest.raises(SettingsError, match="--benchmark 'gsm9k' is not a known benchmark; known: math500, aime2024"):
        load_named_benchmark("gsm9k", write(tmp_path / "x.jsonl", LAYOUTS["math500"]))


def test_ggpo_eval_scores_named_benchmarks_with_the_paper_template(tiny_model_dir, tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(eval_command, [
        str(tiny_model_dir), "--benchmark", "math500", "--path", str(write(tmp_path / "m.jsonl", LAYOUTS["math500"])),
        "--benchmark", "amc2023", "--path", str(write(tmp_path / "a.jsonl", LAYOUTS["amc2023"])),
        "--verifier", "math", "--max-new-tokens", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    entries = json.loads(out.read_text())["benchmarks"]
    assert [e["name"] for e in entries] == ["math500", "amc2023"]
    assert all(e["template"] == PAPER_TEMPLATE and e["problems"] == 1 for e in entries)
    assert {"accuracy", "avg@k", "pass@k"} <= set(entries[0])
    mismatched = CliRunner().invoke(eval_command, [str(tiny_model_dir), "--benchmark", "math500"])
    assert mismatched.exit_code == 2 and "give one --path per --benchmark" in mismatched.output
